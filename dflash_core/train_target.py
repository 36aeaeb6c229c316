"""Train the shipped target from scratch: a byte-level BPE tokenizer and a small mlx-lm model
(`qwen3`, or the hybrid `qwen3_5`) on the Python standard library's own source files.

Samples are either raw windows of a file, or chat turns: the user message is a few top-level
lines of a file and the assistant's reply is the code that follows them, so the model answers
`Pair.encode(prompt)` (chat template on) with a plausible continuation of the prompt's code.
"""
import argparse
import builtins
import json
import keyword
import math
import random
import re
import sysconfig
import time
import zlib
from pathlib import Path

import numpy as np

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
from mlx.utils import tree_flatten, tree_map, tree_unflatten

from .argtypes import count, positive_int, probability
from .backend import DTYPES
from .errors import DFlashError
from .tokenizer import EOS, IM_END, IM_START, save_tokenizer, train_bpe

SKIP_DIRS = {"test", "tests", "idle_test", "site-packages", "__pycache__"}
HELDOUT_EVERY = 20  # one file in 20 (by a hash of its path) is never trained on


# ---------------------------------------------------------------------------- corpus


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def source_files(root: Path) -> list:
    """The *.py files under root, without test suites and installed packages."""
    files = []
    for f in sorted(Path(root).rglob("*.py")):
        rel = f.relative_to(root)
        if SKIP_DIRS & set(rel.parts[:-1]) or rel.name.startswith("test_"):
            continue
        files.append(f)
    return files


def is_heldout(rel: str) -> bool:
    return zlib.crc32(rel.encode()) % HELDOUT_EVERY == 0


def read_corpus(root: Path) -> tuple:
    """(train, heldout): lists of (relative path, text), split by a stable hash of the path."""
    train, heldout = [], []
    for f in source_files(root):
        try:
            text = f.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if len(text) < 200:
            continue
        rel = str(f.relative_to(root))
        (heldout if is_heldout(rel) else train).append((rel, text))
    return train, heldout


def top_level_prompts(text: str, rng: random.Random, n: int, max_lines: int = 8) -> list:
    """Prompts a user might type: 1..max_lines lines starting at a top-level def/class/statement."""
    lines = text.splitlines()
    starts = [i for i, l in enumerate(lines) if l[:1].isalpha() or l[:1] == "@"]
    out = []
    for s in rng.sample(starts, min(n, len(starts))):
        k = rng.randint(1, max_lines)
        prompt = "\n".join(lines[s : s + k]).rstrip()
        if len(prompt) >= 8 and s + k < len(lines):
            out.append(prompt)
    return out


_NAME = r"[A-Za-z_]\w*"
_NAMES = rf"{_NAME}(?:\s*,\s*{_NAME})*"
_BINDINGS = [  # where Python code names things: def/class, parameters, assignments, for, as
    re.compile(rf"\b(?:def|class)\s+({_NAME})"),
    re.compile(rf"^\s*({_NAMES})\s*=[^=]", re.M),
    re.compile(rf"\bfor\s+({_NAMES})\s+in\b"),
    re.compile(rf"\bas\s+({_NAME})"),
]
_PARAMS = re.compile(r"\bdef\s+\w+\s*\(([^)]*)\)")
_KEEP = set(keyword.kwlist) | set(keyword.softkwlist) | set(dir(builtins)) | {"self", "cls"}


def bound_names(text: str) -> set:
    """The names a piece of code chooses itself (not keywords, builtins, dunders, attributes, or
    one-letter names, which double as words and string prefixes)."""
    found = {n for pat in _BINDINGS for m in pat.finditer(text) for n in re.findall(_NAME, m[1])}
    found |= {p.strip(" *").split(":")[0].split("=")[0].strip() for m in _PARAMS.finditer(text)
              for p in m[1].split(",")}
    return {n for n in found if len(n) > 1 and re.fullmatch(_NAME, n) and n not in _KEEP and not n.startswith("__")}


def with_renamed_names(texts: list, fraction: float, rng: random.Random) -> list:
    """A share of the texts with their own names swapped (consistently within a text, also in
    its docstrings) for names other texts chose. Users write new code, not the corpus: renamed
    code is code no model saw, which teaches copying names from the context over recalling them.
    Attribute names after a dot stay, so `x.append` and `os.path.join` keep meaning what they mean."""
    if fraction <= 0:
        return texts
    style = lambda n: (n.isupper(), n[:1].isupper())  # CONSTANT, ClassName or snake_case
    names_of = [bound_names(t) for t in texts]
    pools = {}
    for n in sorted(set().union(*names_of)):
        pools.setdefault(style(n), []).append(n)
    out = []
    for text, own in zip(texts, names_of):
        names = sorted(own) if rng.random() < fraction else ()
        taken, swap = set(re.findall(_NAME, text)), {}
        for n in names:  # a name the text does not use yet, in the style of the old one
            new = next((c for c in (rng.choice(pools[style(n)]) for _ in range(8)) if c not in taken), n)
            swap[n] = new
            taken.add(new)
        if swap:
            # not after a dot (attribute), a backslash (escape) or ! (f-string conversion), nor
            # before a quote (string prefix)
            text = re.sub(rf"(?<![\w.\\!]){_NAME}(?![\w'\"])", lambda m: swap.get(m[0], m[0]), text)
        out.append(text)
    return out


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


def model_config(arch: str, vocab: int, eos: list, hidden: int, layers: int, heads: int,
                 kv_heads: int, intermediate: int, max_positions: int = 4096, tie: bool = True,
                 head_dim: int = None) -> dict:
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


def count_params(model) -> int:
    return sum(v.size for _, v in tree_flatten(model.parameters()))


def lm_loss(model, inputs, targets, mask):
    logits = model(inputs).astype(mx.float32)
    ce = nn.losses.cross_entropy(logits, targets, reduction="none")
    return (ce * mask).sum() / mask.sum()


SHARD_BYTES = 16 * 2**20  # weight files stay small enough for any git host


def save_model(model, cfg: dict, out: Path, dtype=mx.float16):
    """mlx-lm layout: config.json + weights (tokenizer files are written separately)."""
    out.mkdir(parents=True, exist_ok=True)
    write_weights(out, {k: v.astype(dtype) for k, v in tree_flatten(model.parameters())})
    (out / "config.json").write_text(json.dumps(cfg, indent=2))


def write_weights(out: Path, weights: dict, max_shard_bytes: int = SHARD_BYTES):
    """model.safetensors, or model-0000k-of-0000n.safetensors shards + model.safetensors.index.json
    when larger than max_shard_bytes (the Hugging Face layout, which mlx-lm reads)."""
    shards, size = [{}], 0
    for name, w in weights.items():
        if shards[-1] and size + w.nbytes > max_shard_bytes:
            shards, size = shards + [{}], 0
        shards[-1][name] = w
        size += w.nbytes
    n = len(shards)
    files = ["model.safetensors"] if n == 1 else [f"model-{k:05d}-of-{n:05d}.safetensors" for k in range(1, n + 1)]
    for old in [*out.glob("model*.safetensors"), out / "model.safetensors.index.json"]:
        old.unlink(missing_ok=True)  # an earlier save may have had another shard count
    for file, shard in zip(files, shards):
        mx.save_safetensors(str(out / file), shard, metadata={"format": "mlx"})
    if n > 1:
        index = {"metadata": {"total_size": sum(w.nbytes for w in weights.values())},
                 "weight_map": {name: file for file, shard in zip(files, shards) for name in shard}}
        (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))


def progress_bar(progress: float, width: int = 20) -> str:
    done = int(min(max(progress, 0.0), 1.0) * width)
    return f"[{'#' * done}{'.' * (width - done)}] {100 * min(progress, 1.0):3.0f}%"


def value_and_master_grad(master, work, low, loss):
    """loss(work) and its gradient w.r.t. master's trainable weights, with `work` holding those
    weights cast to `low` (bfloat16: 16-bit forward and backward, float32 master weights for the
    optimizer). With low float32, work is master itself and this is plain value_and_grad."""
    def of(params):
        work.update(tree_map(lambda w: w.astype(low), params))
        return loss(work)

    return mx.value_and_grad(of)(master.trainable_parameters())


def lr_at(progress: float, peak: float, warmup: float = 0.04, floor: float = 0.1) -> float:
    """Linear warm-up, then cosine decay to floor * peak; progress in [0, 1]."""
    if progress < warmup:
        return peak * progress / warmup
    t = min(1.0, (progress - warmup) / (1 - warmup))
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * t)))


def check_shape(args):
    """Build the requested shape (two layers of it) and run two tokens through it before the
    tokenizer's minutes of training: mlx-lm's own objection (head sizes, grouped-query ratios)
    becomes one error line."""
    cfg = model_config(args.arch, args.vocab_size, [0], args.hidden, min(args.layers, 2), args.heads,
                       args.kv_heads, args.intermediate, args.max_positions)
    try:
        mx.eval(build_model(cfg)(mx.array([[1, 2]])))
    except ValueError as e:
        raise DFlashError(f"--hidden {args.hidden} --heads {args.heads} --kv-heads {args.kv_heads} do not make a "
                          f"{args.arch} model ({str(e).splitlines()[0].rstrip('.')}): give an even number of heads, a "
                          f"multiple of kv-heads, whose size hidden / heads is a multiple of 4, e.g. --hidden 256 "
                          f"--heads 4 --kv-heads 2") from None


def train(args, log=print) -> dict:
    """Train tokenizer + model and write the model directory; returns a summary dict."""
    t_start = time.time()
    check_shape(args)
    out = Path(args.out)
    root = Path(args.corpus) if args.corpus else stdlib_dir()
    train_docs, heldout_docs = read_corpus(root)
    if not train_docs:
        raise DFlashError(f"no Python files to train on under '{root}'")
    log(f"corpus: {root}: {len(train_docs)} training files, {len(heldout_docs)} held out")

    tok = train_bpe((t for _, t in train_docs), args.vocab_size)
    ids = save_tokenizer(tok, out)
    vocab = tok.get_vocab_size()
    cfg = model_config(args.arch, vocab, [ids[EOS], ids[IM_END]], args.hidden, args.layers,
                       args.heads, args.kv_heads, args.intermediate, args.max_positions)
    sample_docs = train_docs  # + renamed copies; the tokenizer above saw only the real files
    if args.renamed_copies:
        texts = [t for _, t in train_docs] * args.renamed_copies
        sample_docs = train_docs + [(f"{r} (renamed)", t) for (r, _), t in
                                    zip(train_docs * args.renamed_copies, with_renamed_names(texts, 1.0, random.Random(args.seed)))]
        log(f"+ {args.renamed_copies} renamed cop{'y' if args.renamed_copies == 1 else 'ies'} of each training file")
    maker = SampleMaker(tok, sample_docs, args.seq_len, args.chat_fraction, args.seed)
    held = SampleMaker(tok, heldout_docs or train_docs[:5], args.seq_len, args.chat_fraction, args.seed + 1)
    val_batches = [held.batch(args.batch_size) for _ in range(4)]
    log(f"tokenizer: {vocab} tokens; {maker.num_tokens:,} training tokens")

    mx.random.seed(args.seed)
    model = build_model(cfg)
    n_params = count_params(model)
    log(f"model: {args.arch}, {n_params / 1e6:.2f}M parameters")
    opt = optim.AdamW(learning_rate=0.0, weight_decay=args.weight_decay, betas=[0.9, 0.95])
    state = [model.state, opt.state]

    low = DTYPES[args.compute_dtype]
    work = model if low == mx.float32 else build_model(cfg)
    for m in (model, work):  # the same model twice in float32: wrapping is idempotent
        set_residual_dropout(m, args.dropout)
    if args.dropout:
        state.append(mx.random.state)  # the compiled step draws the dropout masks

    def step(inputs, targets, mask):
        loss, grads = value_and_master_grad(model, work, low, lambda m: lm_loss(m, inputs, targets, mask))
        grads, _ = optim.clip_grad_norm(grads, 1.0)
        opt.update(model, grads)
        return loss

    if args.compile:
        step = mx.compile(step, inputs=state, outputs=state)
    def evaluate():
        model.eval()  # no dropout
        loss = sum(lm_loss(model, *b).item() for b in val_batches) / len(val_batches)
        model.train()
        return loss

    budget = args.minutes * 60 if args.minutes else None
    t0, seen, i, losses = time.time(), 0, 0, []
    best = (float("inf"), 0, None)
    while True:
        progress = (time.time() - t0) / budget if budget else i / args.steps
        if progress >= 1:
            break
        opt.learning_rate = lr_at(progress, args.lr)
        batch = maker.batch(args.batch_size)
        loss = step(*batch)
        mx.eval(loss, state)
        if i == 0:  # the schedule starts after the first step (graph compile, kernel JIT)
            t0 = time.time()
        seen += args.batch_size * args.seq_len
        losses.append(loss.item())
        i += 1
        if i % args.log_every == 0:
            el = max(time.time() - t0, 1e-3)
            log(f"{progress_bar(progress)} step {i} loss {sum(losses[-args.log_every:]) / args.log_every:.3f} "
                f"lr {opt.learning_rate.item():.2e} {seen / el:,.0f} tok/s {el:.0f}s")
        if args.eval_every and i % args.eval_every == 0:
            val = evaluate()
            log(f"step {i} held-out loss {val:.3f}")
            if val < best[0]:  # a small corpus: keep the weights that generalise best
                best = (val, i, tree_flatten(model.parameters()))
    train_s = time.time() - t0
    val = evaluate()
    if args.keep == "best" and val > best[0]:
        val, best_step, params = best
        model.update(tree_unflatten(params))
        log(f"keeping step {best_step}'s weights (held-out loss {val:.3f})")
    else:
        best_step = i
    log(f"done: {i} steps, {seen:,} tokens, {train_s:.0f}s, held-out loss {val:.3f}")
    low_loss, low_step = min(best[:2], (val, i))

    set_residual_dropout(model, 0)
    save_model(model, cfg, out)
    rng = random.Random(args.seed)
    prompts = {
        "heldout": [p for _, t in heldout_docs for p in top_level_prompts(t, rng, 3)],
        "train": [p for _, t in rng.sample(train_docs, min(40, len(train_docs))) for p in top_level_prompts(t, rng, 1)],
        "heldout_files": [r for r, _ in heldout_docs],
    }
    (out / "eval_prompts.json").write_text(json.dumps(prompts, indent=1))
    return {
        "arch": args.arch, "params": n_params, "vocab": vocab, "steps": i, "kept_step": best_step, "tokens": seen,
        "train_seconds": round(train_s), "total_seconds": round(time.time() - t_start),
        "final_train_loss": round(sum(losses[-20:]) / max(1, len(losses[-20:])), 4),
        "heldout_loss": round(val, 4), "keep": args.keep, "renamed_copies": args.renamed_copies, "dropout": args.dropout,
        "lowest_heldout_loss": {"loss": round(low_loss, 4), "step": low_step}, "corpus": str(root), "corpus_tokens": maker.num_tokens,
        "train_files": len(train_docs), "heldout_files": len(heldout_docs), "seq_len": args.seq_len,
        "compute_dtype": args.compute_dtype, "config": cfg,
    }


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
    p.add_argument("--renamed-copies", type=count, default=0,
                   help="also train on this many copies of each file with its own names swapped for "
                        "other files' names (more data from a small corpus; teaches copying names)")
    p.add_argument("--dropout", type=probability, default=0.0,
                   help="drop out each layer's update to the residual stream with this probability "
                        "while training (a small corpus read for many epochs is memorised otherwise)")
    p.add_argument("--keep", choices=("best", "last"), default="best",
                   help="best: the weights with the lowest held-out loss (they generalise best); "
                        "last: the final weights")
    p.add_argument("--compute-dtype", choices=DTYPES, default="float32",
                   help="bfloat16: forward and backward in 16 bits over float32 master weights "
                        "(several times faster on a GPU; slow on a CPU)")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True)
