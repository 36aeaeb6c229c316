"""Train the shipped target from scratch: a byte-level BPE tokenizer and a small mlx-lm model
(`qwen3`, or the hybrid `qwen3_5`) on the Python standard library's own source files.

Samples are either raw windows of a file, or chat turns: the user message is a few top-level
lines of a file and the assistant's reply is the code that follows them, so the model answers
`Pair.encode(prompt)` (chat template on) with a plausible continuation of the prompt's code.
"""

import json
import random
import time
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten

from ..argtypes import count, positive_int, probability
from ..backend import DTYPES
from ..errors import DFlashError
from ..models.tokenizer import EOS, IM_END, IM_START, save_tokenizer, train_bpe
from .common import Run, add_compute_arguments, count_params, make_step, write_weights
from .corpus import read_corpus, renamed_copies, stdlib_dir, top_level_prompts

# ---------------------------------------------------------------------------- samples


class SampleMaker:
    """Training sequences as token ids, cut from the tokenized corpus (no re-tokenizing per step).

    A chat sample is `<|im_start|>user\\n{lines}<|im_end|>\\n<|im_start|>assistant\\n{more lines}`:
    the user part starts after a newline-only token (a top-level line) and ends before a token
    that starts with a newline, which is how the same text tokenizes on its own."""

    def __init__(self, tokenizer, docs: list, seq_len: int, chat_fraction: float, seed: int):
        self.seq_len = seq_len
        self.chat_fraction = chat_fraction
        self.rng = np.random.default_rng(seed)
        vocab = tokenizer.get_vocab_size()
        text_of = [tokenizer.decode([i], skip_special_tokens=False) for i in range(vocab)]
        starts_nl = np.array([t.startswith("\n") for t in text_of])
        only_nl = np.array([len(t) > 0 and set(t) == {"\n"} for t in text_of])
        self.eos, self.im_end = tokenizer.token_to_id(EOS), tokenizer.token_to_id(IM_END)
        enc = lambda s: tokenizer.encode(s).ids
        self.user_head = [tokenizer.token_to_id(IM_START)] + enc("user\n")
        self.assistant_head = [self.im_end] + enc("\n") + [tokenizer.token_to_id(IM_START)] + enc("assistant\n")
        self.docs, self.line_starts, self.line_ends = [], [], []
        for enc_doc in tokenizer.encode_batch([t for _, t in docs]):
            ids = np.array(enc_doc.ids, dtype=np.int32)
            if len(ids) < 16:
                continue
            self.docs.append(ids)
            prev_nl = np.concatenate([[True], only_nl[ids[:-1]]])
            self.line_starts.append(np.nonzero(prev_nl & ~starts_nl[ids])[0])
            self.line_ends.append(np.nonzero(starts_nl[ids])[0])
        sizes = np.array([len(d) for d in self.docs], dtype=np.float64)
        self.doc_p = sizes / sizes.sum()
        self.num_tokens = int(sizes.sum())

    def _raw(self, ids):
        start = int(self.rng.integers(0, max(1, len(ids) - self.seq_len // 2)))
        seq = ids[start : start + self.seq_len + 1]
        if len(seq) < self.seq_len + 1:
            seq = np.append(seq, np.int32(self.eos))
        return seq

    def _chat(self, d):
        ids, starts, ends = self.docs[d], self.line_starts[d], self.line_ends[d]
        if len(starts) == 0:
            return None
        s = int(starts[self.rng.integers(len(starts))])
        cuts = ends[(ends > s + 2) & (ends < s + 160)]
        if len(cuts) == 0:
            return None
        c = int(cuts[self.rng.integers(min(len(cuts), 12))])  # up to ~12 lines of prompt
        rest = ids[c : c + self.seq_len + 1]
        tail = [self.im_end] if c + len(rest) >= len(ids) else []
        return np.concatenate([self.user_head, ids[s:c], self.assistant_head, rest, tail]).astype(np.int32)

    def sample(self) -> np.ndarray:
        while True:
            d = int(self.rng.choice(len(self.docs), p=self.doc_p))
            seq = self._chat(d) if self.rng.random() < self.chat_fraction else self._raw(self.docs[d])
            if seq is not None and len(seq) >= 8:
                return seq[: self.seq_len + 1]

    def batch(self, size: int):
        """(inputs, targets, loss mask), each (size, seq_len); short samples are padded."""
        arr = np.full((size, self.seq_len + 1), self.eos, dtype=np.int32)
        mask = np.zeros((size, self.seq_len), dtype=np.float32)
        for i in range(size):
            seq = self.sample()
            arr[i, : len(seq)] = seq
            mask[i, : len(seq) - 1] = 1
        return mx.array(arr[:, :-1]), mx.array(arr[:, 1:]), mx.array(mask)


# ---------------------------------------------------------------------------- model


ARCHS = ("qwen3", "qwen3_5")


def model_config(
    arch: str,
    vocab: int,
    eos: list,
    hidden: int,
    layers: int,
    heads: int,
    kv_heads: int,
    intermediate: int,
    max_positions: int = 4096,
    tie: bool = True,
    head_dim: int = None,
) -> dict:
    """An mlx-lm config.json for a model built from scratch (qwen3, qwen3_5, llama)."""
    head_dim = head_dim or hidden // heads
    cfg = {
        "model_type": arch,
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "intermediate_size": intermediate,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "rms_norm_eps": 1e-6,
        "vocab_size": vocab,
        "max_position_embeddings": max_positions,
        "rope_theta": 10000.0,
        "tie_word_embeddings": tie,
        "eos_token_id": eos,
        "bos_token_id": None,
    }
    if arch == "qwen3_5":
        # GatedDeltaNet layers with full attention every 2nd layer (layers 1, 3, ...)
        cfg.update(
            linear_num_value_heads=heads,
            linear_num_key_heads=max(1, heads // 2),
            linear_key_head_dim=head_dim,
            linear_value_head_dim=head_dim,
            linear_conv_kernel_dim=4,
            full_attention_interval=2,
            rope_parameters={"type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
        )
    return cfg


def build_model(cfg: dict):
    from mlx_lm.utils import _get_classes

    model_cls, args_cls = _get_classes(cfg)
    return model_cls(args_cls.from_dict(cfg))


class ResidualDropout(nn.Module):
    """A decoder layer whose update to the residual stream is dropped out while training (GPT-2's
    resid_pdrop, over the attention and MLP updates together). Only for training: the model is
    saved with its plain layers."""

    def __init__(self, layer, p: float):
        super().__init__()
        self.layer = layer
        self.dropout = nn.Dropout(p)
        if hasattr(layer, "is_linear"):  # qwen3_5 picks each layer's mask and cache by it
            self.is_linear = layer.is_linear

    def __call__(self, x, *args, **kwargs):
        return x + self.dropout(self.layer(x, *args, **kwargs) - x)


def set_residual_dropout(model, p: float):
    """Wrap (p > 0) or unwrap (p = 0) the decoder layers of an mlx-lm model, in place."""
    layers = model.layers  # the model's own list: mlx-lm exposes it as `Model.layers`
    for i, layer in enumerate(layers):
        plain = layer.layer if isinstance(layer, ResidualDropout) else layer
        layers[i] = ResidualDropout(plain, p) if p > 0 else plain


def lm_loss(model, inputs, targets, mask):
    logits = model(inputs).astype(mx.float32)
    ce = nn.losses.cross_entropy(logits, targets, reduction="none")
    return (ce * mask).sum() / mask.sum()


def save_model(model, cfg: dict, out: Path, dtype=mx.float16):
    """mlx-lm layout: config.json + weights (tokenizer files are written separately)."""
    out.mkdir(parents=True, exist_ok=True)
    write_weights(out, {k: v.astype(dtype) for k, v in tree_flatten(model.parameters())})
    (out / "config.json").write_text(json.dumps(cfg, indent=2))


def check_shape(args):
    """Build the requested shape (two layers of it) and run two tokens through it before the
    tokenizer's minutes of training: mlx-lm's own objection (head sizes, grouped-query ratios)
    becomes one error line."""
    cfg = model_config(
        args.arch,
        args.vocab_size,
        [0],
        args.hidden,
        min(args.layers, 2),
        args.heads,
        args.kv_heads,
        args.intermediate,
        args.max_positions,
    )
    try:
        mx.eval(build_model(cfg)(mx.array([[1, 2]])))
    except ValueError as e:
        raise DFlashError(
            f"--hidden {args.hidden} --heads {args.heads} --kv-heads {args.kv_heads} do not make a "
            f"{args.arch} model ({str(e).splitlines()[0].rstrip('.')}): give an even number of heads, a "
            f"multiple of kv-heads, whose size hidden / heads is a multiple of 4, e.g. --hidden 256 "
            f"--heads 4 --kv-heads 2"
        ) from None


def train(args, log=print) -> dict:
    """Train tokenizer + model and write the model directory; returns a summary dict."""
    t_start = time.time()
    check_shape(args)
    out = Path(args.out)

    # data: the corpus, a tokenizer trained on it, samples cut from it
    root = Path(args.corpus) if args.corpus else stdlib_dir()
    train_docs, heldout_docs = read_corpus(root)
    if not train_docs:
        raise DFlashError(f"no Python files to train on under '{root}'")
    log(f"corpus: {root}: {len(train_docs)} training files, {len(heldout_docs)} held out")
    tok = train_bpe((t for _, t in train_docs), args.vocab_size)
    ids = save_tokenizer(tok, out)
    sample_docs = train_docs  # + renamed copies; the tokenizer above saw only the real files
    if args.renamed_copies:
        sample_docs = train_docs + renamed_copies(train_docs, args.renamed_copies, random.Random(args.seed))
        log(f"+ {args.renamed_copies} renamed cop{'y' if args.renamed_copies == 1 else 'ies'} of each training file")
    maker = SampleMaker(tok, sample_docs, args.seq_len, args.chat_fraction, args.seed)
    held = SampleMaker(tok, heldout_docs or train_docs[:5], args.seq_len, args.chat_fraction, args.seed + 1)
    val_batches = [held.batch(args.batch_size) for _ in range(4)]
    vocab = tok.get_vocab_size()
    log(f"tokenizer: {vocab} tokens; {maker.num_tokens:,} training tokens")

    # model: float32 master weights; with --compute-dtype bfloat16 a 16-bit working copy
    cfg = model_config(
        args.arch,
        vocab,
        [ids[EOS], ids[IM_END]],
        args.hidden,
        args.layers,
        args.heads,
        args.kv_heads,
        args.intermediate,
        args.max_positions,
    )
    mx.random.seed(args.seed)
    model = build_model(cfg)
    n_params = count_params(model)
    log(f"model: {args.arch}, {n_params / 1e6:.2f}M parameters")
    low = DTYPES[args.compute_dtype]
    work = model if low == mx.float32 else build_model(cfg)
    for m in (model, work):  # the same model twice in float32: wrapping is idempotent
        set_residual_dropout(m, args.dropout)

    opt = optim.AdamW(learning_rate=0.0, weight_decay=args.weight_decay, betas=[0.9, 0.95])
    state = [model.state, opt.state] + ([mx.random.state] if args.dropout else [])  # the step draws dropout masks
    step = make_step(model, work, low, opt, lm_loss, state, args.compile)

    run = Run(None if args.minutes else args.steps, args.minutes, args.lr, args.log_every, log)
    best = (float("inf"), 0, None)  # (held-out loss, step, weights): a small corpus is soon memorised
    for lr in run:
        opt.learning_rate = lr
        loss = step(*maker.batch(args.batch_size))
        mx.eval(loss, state)
        run.record(loss.item(), args.batch_size * args.seq_len)
        if run.due(args.eval_every):
            val = heldout_loss(model, val_batches)
            run.log(f"step {run.step} held-out loss {val:.3f}")
            if val < best[0]:
                best = (val, run.step, tree_flatten(model.parameters()))
    train_seconds = run.seconds

    val, kept_step = heldout_loss(model, val_batches), run.step
    lowest = min(best[:2], (val, run.step))
    if args.keep == "best" and val > best[0]:
        val, kept_step, params = best
        model.update(tree_unflatten(params))
        log(f"keeping step {kept_step}'s weights (held-out loss {val:.3f})")
    log(f"done: {run.step} steps, {run.tokens:,} tokens, {train_seconds:.0f}s, held-out loss {val:.3f}")
    set_residual_dropout(model, 0)
    save_model(model, cfg, out)
    write_eval_prompts(out, train_docs, heldout_docs, args.seed)
    return {
        "arch": args.arch,
        "params": n_params,
        "vocab": vocab,
        "steps": run.step,
        "kept_step": kept_step,
        "tokens": run.tokens,
        "train_seconds": round(train_seconds),
        "total_seconds": round(time.time() - t_start),
        "final_train_loss": round(float(np.mean(run.losses[-20:])), 4),
        "heldout_loss": round(val, 4),
        "keep": args.keep,
        "renamed_copies": args.renamed_copies,
        "dropout": args.dropout,
        "lowest_heldout_loss": {"loss": round(lowest[0], 4), "step": lowest[1]},
        "corpus": str(root),
        "corpus_tokens": maker.num_tokens,
        "train_files": len(train_docs),
        "heldout_files": len(heldout_docs),
        "seq_len": args.seq_len,
        "compute_dtype": args.compute_dtype,
        "config": cfg,
    }


def heldout_loss(model, batches: list) -> float:
    model.eval()  # no dropout
    loss = sum(lm_loss(model, *b).item() for b in batches) / len(batches)
    model.train()
    return loss


def write_eval_prompts(out: Path, train_docs: list, heldout_docs: list, seed: int):
    """eval_prompts.json: prompts cut from the held-out files and from a sample of the training
    files, to tell generalising from remembering."""
    rng = random.Random(seed)
    prompts = {
        "heldout": [p for _, t in heldout_docs for p in top_level_prompts(t, rng, 3)],
        "train": [p for _, t in rng.sample(train_docs, min(40, len(train_docs))) for p in top_level_prompts(t, rng, 1)],
        "heldout_files": [r for r, _ in heldout_docs],
    }
    (out / "eval_prompts.json").write_text(json.dumps(prompts, indent=1))


def add_arguments(p):
    p.add_argument("--out", required=True, help="model directory to write")
    p.add_argument("--arch", choices=ARCHS, default="qwen3")
    p.add_argument("--corpus", help="directory of .py files (default: this interpreter's stdlib)")
    p.add_argument("--vocab-size", type=positive_int, default=4096)
    p.add_argument("--hidden", type=positive_int, default=256)
    p.add_argument("--layers", type=positive_int, default=6)
    p.add_argument("--heads", type=positive_int, default=4)
    p.add_argument("--kv-heads", type=positive_int, default=2)
    p.add_argument("--intermediate", type=positive_int, default=768)
    p.add_argument("--max-positions", type=positive_int, default=4096)
    p.add_argument("--seq-len", type=positive_int, default=512)
    p.add_argument("--batch-size", type=positive_int, default=64)
    p.add_argument("--steps", type=positive_int, default=2000, help="optimizer steps (ignored with --minutes)")
    p.add_argument("--minutes", type=float, help="train for this long instead (schedule by time)")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--chat-fraction", type=probability, default=0.5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-every", type=positive_int, default=50)
    p.add_argument("--eval-every", type=count, default=500)
    p.add_argument(
        "--renamed-copies",
        type=count,
        default=0,
        help="also train on this many copies of each file with its own names swapped for "
        "other files' names (more data from a small corpus; teaches copying names)",
    )
    p.add_argument(
        "--dropout",
        type=probability,
        default=0.0,
        help="drop out each layer's update to the residual stream with this probability "
        "while training (a small corpus read for many epochs is memorised otherwise)",
    )
    p.add_argument(
        "--keep",
        choices=("best", "last"),
        default="best",
        help="best: the weights with the lowest held-out loss (they generalise best); last: the final weights",
    )
    add_compute_arguments(p)
