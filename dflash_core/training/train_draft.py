"""Train a DFlash draft for any mlx-lm target (the published recipe: the DFlash paper, Chen, Liang, Liu 2026).

- The target is frozen. Its own greedy continuations of the prompts are the training text, so the
  draft learns the target's distribution, not the corpus's.
- Per sequence, anchors are sampled among response positions (resampled every epoch). Block k
  (one per anchor a) is `[token[a], MASK x (B-1)]` at positions a..a+B-1; its queries see the
  context features of positions < a and their own block (bidirectionally), nothing else;
  position j of the block predicts token[a + j], weighted exp(-(j-1)/gamma).
- The forward below uses the inference model's own modules (`DraftModel`: fc, hidden_norm,
  q/k norms, rope, `keys_values`), and the target's taps come from the engine's `Target`, so
  training sees exactly what the engine computes at inference.
- Evaluation runs the real engine loop (`engine.dflash_generate`) and reports tokens per cycle;
  with --val-sequences also the loss on sequences held out of training.
"""

import json
import math
import random
import time
from dataclasses import replace
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten
from mlx_lm.sample_utils import make_sampler

from ..argtypes import count, positive_int, probability
from ..backend import DTYPES
from ..engine.cycle import baseline_generate, dflash_generate
from ..engine.draft import DRAFT_VOCAB_FILE, DraftConfig, DraftModel
from ..engine.target import Target
from ..errors import DFlashError
from ..models.tokenizer import encode_prompt
from .common import Run, add_compute_arguments, count_params, make_step, write_weights
from .corpus import read_corpus, stdlib_dir, top_level_prompts, with_renamed_names

GAMMA = {16: 7.0, 10: 5.0, 8: 4.0}


def loss_gamma(block_size: int) -> float:
    return GAMMA.get(block_size, max(2.0, 7.0 * block_size / 16))


# ---------------------------------------------------------------------------- data


def prompt_texts(data: str, seed: int, n: int) -> tuple:
    """(train prompts, eval prompts) as user texts. data: 'stdlib' (this interpreter's standard
    library, minus the target trainer's held-out files), a directory or file of source text
    (prompts are top-level lines of it), or a .jsonl file with a "prompt" field per line."""
    rng = random.Random(seed)
    path = Path(data)
    if data == "stdlib":
        docs, heldout = read_corpus(stdlib_dir())
        prompts = [p for _, text in docs for p in top_level_prompts(text, rng, math.ceil(n * 1.3 / len(docs)))]
        rng.shuffle(prompts)
        eval_prompts = [p for _, text in heldout for p in top_level_prompts(text, rng, 1)]
        rng.shuffle(eval_prompts)
        return prompts[:n], eval_prompts
    elif path.suffix == ".jsonl" and path.is_file():
        prompts = []
        for line in path.read_text().splitlines():
            if line.strip():
                try:
                    prompts.append(json.loads(line)["prompt"])
                except (json.JSONDecodeError, KeyError, TypeError):
                    raise DFlashError(f'{path}: every line must be a JSON object with a "prompt" field') from None
        rng.shuffle(prompts)
        n_eval = max(1, min(8, len(prompts) // 10))
        return prompts[n_eval:], prompts[:n_eval]
    elif path.is_dir():
        docs = [
            (str(f), f.read_text(errors="replace"))
            for f in sorted(path.rglob("*"))
            if f.is_file() and f.suffix in (".py", ".txt", ".md")
        ]
    elif path.is_file():
        docs = [(str(path), path.read_text(errors="replace"))]
    else:
        raise DFlashError(f"--data '{data}' is neither 'stdlib', a directory, nor a file")
    if not docs:
        raise DFlashError(f"--data '{data}' holds no .py/.txt/.md text")
    per_doc = max(1, math.ceil(n * 1.3 / len(docs)))
    prompts = [p for _, text in docs for p in top_level_prompts(text, rng, per_doc)]
    rng.shuffle(prompts)
    if len(prompts) < 2:
        raise DFlashError(f"--data '{data}' gave too few prompts ({len(prompts)})")
    n_eval = max(1, min(8, len(prompts) // 10))
    return prompts[n_eval : n_eval + n], prompts[:n_eval]


def regenerate(model, tokenizer, prompts: list, max_new: int, batch: int, log=print, temperature: float = 0.0) -> list:
    """The target's own continuations (token ids; greedy, or sampled at `temperature` > 0), in the
    prompts' order: a row that stopped ends with one EOS (the tokenizer's first), any other has
    max_new tokens."""
    eos = list(tokenizer.eos_token_ids)
    sampler = make_sampler(temperature) if temperature > 0 else None
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))  # similar lengths batch together: less padding
    out = [None] * len(prompts)
    t0, s = time.time(), 0
    while s < len(order):
        idx = order[s : s + batch]
        try:
            rows = decode_batch(model, [prompts[i] for i in idx], max_new, eos, sampler)
        except RuntimeError as e:
            # MLX CUDA 0.32 refused 1,200 qwen3_5 rows at once (a CUDA-graph error) and ran 8: halve and go on
            if batch == 1:
                raise
            batch //= 2
            log(f"batched generation failed ({str(e).splitlines()[0][:80]}); batches of {batch} from here")
            continue
        for i, row in zip(idx, rows):
            stop = next((j for j, t in enumerate(row) if t in eos), None)
            out[i] = row if stop is None else row[:stop] + eos[:1]  # what follows an EOS is junk
        s += len(idx)
        log(f"regenerated {s}/{len(prompts)} continuations, {time.time() - t0:.0f}s")
    return out


def decode_batch(model, prompts: list, max_new: int, eos: list, sampler=None) -> list:
    """Continuations of the prompts at once, greedy (or drawn by an mlx-lm `sampler` from each
    row's log-probabilities), max_new tokens a row, fewer once every row has produced an EOS; a
    row goes on after its EOS. A bare loop: mlx-lm's batch_generate spends most of its time in
    per-token bookkeeping (10x slower on an H200)."""
    from mlx_lm.models.cache import make_prompt_cache

    # The caches as mlx-lm's BatchGenerator makes them, so every layer kind it batches works (attention,
    # GatedDeltaNet): each layer's cache merged across the rows, the prompts prefilled right-padded (the
    # GatedDeltaNet state stops at each row's length), then finalize moves the padding to the left, so
    # every row's next token goes in one column.
    cache = [layer[0].merge(list(layer)) for layer in zip(*(make_prompt_cache(model) for _ in prompts))]
    heads = [p[:-1] for p in prompts]  # the last prompt token is the first decode input
    lengths = [len(h) for h in heads]
    width = max(lengths)
    if width:
        pad = [width - n for n in lengths]
        for c in cache:
            c.prepare(lengths=lengths, right_padding=pad)
        model(mx.array([h + [0] * k for h, k in zip(heads, pad)]), cache=cache)
        for c in cache:
            c.finalize()
    tok = mx.array([p[-1] for p in prompts])
    eos_ids = mx.array(eos)
    done = mx.zeros(len(prompts), dtype=mx.bool_)
    outs = []
    for step in range(max_new):
        logits = model(tok[:, None], cache=cache)[:, -1]
        if sampler is None:
            tok = mx.argmax(logits, axis=-1)
        else:
            tok = sampler(logits - mx.logsumexp(logits, axis=-1, keepdims=True))
        done = done | (tok[:, None] == eos_ids).any(axis=1)
        mx.async_eval(tok, done)  # queue this step while the next one is built
        outs.append(tok)
        if step % 32 == 31 and done.all().item():  # a sync every 32 steps costs little
            break
    return mx.stack(outs, axis=1).tolist()


def greedy(model, prompt: list, max_new: int, eos: set) -> list:
    """Plain greedy continuation (the engine's baseline), with the EOS it stopped at."""
    *_, run = baseline_generate(model, prompt, max_tokens=max_new, eos_ids=eos)
    return run.tokens


class Sequences:
    """Prompt + response token ids padded to one length, with where each response starts/ends."""

    def __init__(self, prompts: list, responses: list, pad_id: int):
        lens = [len(p) + len(r) for p, r in zip(prompts, responses)]
        self.length = max(lens)
        self.ids = np.full((len(prompts), self.length), pad_id, dtype=np.int32)
        for i, (p, r) in enumerate(zip(prompts, responses)):
            self.ids[i, : lens[i]] = p + r
        self.start = np.array([len(p) for p in prompts])
        self.end = np.array(lens)  # exclusive

    def __len__(self):
        return len(self.ids)

    def anchors(self, rows, n: int, block: int, rng) -> tuple:
        """(anchors, valid) each (len(rows), n): up to n distinct anchors a per row with
        start <= a <= end - block (a full block of labels); unused slots are invalid."""
        anchors = np.zeros((len(rows), n), dtype=np.int32)
        valid = np.zeros((len(rows), n), dtype=bool)
        for j, r in enumerate(rows):
            cand = np.arange(self.start[r], self.end[r] - block + 1)
            if len(cand) == 0:
                continue
            pick = rng.choice(cand, size=min(n, len(cand)), replace=False)
            anchors[j, : len(pick)] = pick
            valid[j, : len(pick)] = True
        return anchors, valid


# ---------------------------------------------------------------------------- model


def tapped_hidden(target: Target, ids: mx.array) -> list:
    """The target's hidden states at the draft's tap layers for a batch (B, L), no cache: the
    same recording the engine's Target does during prefill and verify."""
    return [mx.stop_gradient(h) for h in target.sequence_taps(ids)]


def block_logits(draft: DraftModel, head, taps: list, block_embeds, anchors, seq_of_block):
    """Draft logits for blocks at positions 1..B-1. taps: per tap (S, L, h) target hidden states;
    block_embeds (N, B, h); anchors (N,) absolute positions; seq_of_block (N,) sequence index."""
    feats = draft.context_features(taps)  # (S, L, h)
    L = feats.shape[1]
    N, B, _ = block_embeds.shape
    ctx_pos = mx.arange(L)
    sees_ctx = ctx_pos[None, :] < anchors[:, None]  # (N, L): strictly before the anchor
    h = block_embeds
    for layer in draft.layers:
        attn = layer.self_attn
        k, v = attn.keys_values(feats, 0)  # (S, kv, L, d), positions 0..L-1
        ctx_mask = sees_ctx[:, None, :]
        if attn.sliding_window is not None:
            q_pos = anchors[:, None] + mx.arange(B)[None]
            ctx_mask = ctx_mask & ((q_pos[:, :, None] - ctx_pos[None, None]) < attn.sliding_window)
        ctx_mask = mx.broadcast_to(ctx_mask, (N, B, L))
        mask = mx.concatenate([ctx_mask, mx.ones((N, B, B), dtype=mx.bool_)], axis=-1)[:, None]
        # the inference layer itself, with a per-block offset (RoPE takes an array) and the mask
        h = layer(h, k[seq_of_block], v[seq_of_block], anchors, mask)
    return head(draft.norm(h)[:, 1:])


def make_batch(data: "Sequences", rows, n_anchors: int, cfg: DraftConfig, weights_k, rng) -> tuple:
    """The blocks of one step for these sequences: block token ids `[token@anchor, MASK...]`,
    anchors, each block's sequence, labels at block positions 1..B-1 and their loss weights
    (zero for unused anchor slots), and how many blocks are real."""
    B = cfg.block_size
    anchors, valid = data.anchors(rows, n_anchors, B, rng)
    ids = data.ids[rows]
    flat = anchors.reshape(-1)
    seq_of_block = np.repeat(np.arange(len(rows)), n_anchors)
    block_ids = np.full((len(flat), B), cfg.mask_token_id, dtype=np.int32)
    block_ids[:, 0] = ids[seq_of_block, flat]
    label_pos = flat[:, None] + np.arange(1, B)[None]
    labels = ids[seq_of_block[:, None], np.minimum(label_pos, data.length - 1)]
    weights = weights_k[None] * mx.array(valid.reshape(-1, 1).astype(np.float32))
    return block_ids, flat, seq_of_block, labels, weights, int(valid.sum())


def draft_loss(draft, head, taps, block_embeds, anchors, seq_of_block, labels, weights, teacher=None, distill=0.0):
    """Cross-entropy on the target's greedy tokens, weighted by block position; with distill > 0,
    mixed with the cross-entropy on the target's whole distribution there (`teacher` logits)."""
    logits = block_logits(draft, head, taps, block_embeds, anchors, seq_of_block).astype(mx.float32)
    ce = nn.losses.cross_entropy(logits, labels, reduction="none")
    if distill:
        soft = -(mx.softmax(teacher, axis=-1) * nn.log_softmax(logits, axis=-1)).sum(axis=-1)
        ce = (1 - distill) * ce + distill * soft
    return (ce * weights).sum() / mx.maximum(weights.sum(), 1e-6)


def teacher_logits(head, final_hidden, anchors, seq_of_block, block_size: int):
    """The target's own logits for each block's labels, from its normed final hidden states
    (S, L, h): position i predicts token i + 1, so the labels at anchor + 1 .. anchor + B - 1 come
    from anchor .. anchor + B - 2."""
    pos = anchors[:, None] + mx.arange(block_size - 1)[None]
    h = final_hidden[seq_of_block[:, None], pos]  # (blocks, B - 1, hidden)
    return mx.stop_gradient(head(h).astype(mx.float32))


def new_draft(model, tokenizer, args) -> DraftModel:
    """A draft shaped like the target's layers (DraftConfig.for_target), its output norm starting
    from the target's final norm: the draft's hidden state goes through the target's LM head,
    which was trained on that norm's scale."""
    mask_id = tokenizer.convert_tokens_to_ids(args.mask_token) if hasattr(tokenizer, "convert_tokens_to_ids") else None
    if mask_id is None or mask_id == getattr(tokenizer, "unk_token_id", -1):
        raise DFlashError(
            f"the target's tokenizer has no '{args.mask_token}' token; give --mask-token (a reserved special token)"
        )
    n_target = len(model.layers)
    bad = [i for i in args.target_layers or [] if not 0 <= i < n_target]
    if bad:
        raise DFlashError(f"--target-layers {bad} are outside the target's {n_target} layers (0..{n_target - 1})")
    target_args = vars(Target._text_owner(model).args)  # qwen3_5 nests the text model's args
    cfg = DraftConfig.for_target(
        target_args,
        args.layers,
        mask_id,
        args.block_size or DraftConfig.block_size,
        args.intermediate,
        args.target_layers,
    )
    mx.random.seed(args.seed)
    draft = DraftModel(cfg)
    draft.norm.weight = Target.text_model(model).norm.weight.astype(mx.float32)
    return draft


def resumed_draft(model, args) -> DraftModel:
    """--resume: the draft to continue from (its shape, taps and mask id win), in float32, grown
    by --add-layers. A --block-size retrains it for another block length: the weights do not
    depend on it, only the positions the loss covers and their weights."""
    from ..models.loading import check_fit, load_draft

    draft = load_draft(Path(args.resume))
    draft.set_dtype(mx.float32)
    check_fit(model, draft, len(model.layers))
    if args.block_size:
        draft.config = replace(draft.config, block_size=args.block_size)
    return add_layers(draft, args.add_layers) if args.add_layers else draft


def add_layers(draft: DraftModel, n: int) -> DraftModel:
    """The draft with n more layers on top, each starting as the identity (its attention and MLP
    output projections zero: the residual stream passes unchanged), so the grown draft proposes
    exactly what the smaller one did and training starts from there rather than from scratch."""
    cfg = draft.config
    types = cfg.layer_types + cfg.layer_types[-1:] * n if cfg.layer_types else []
    grown = DraftModel(replace(cfg, num_hidden_layers=cfg.num_hidden_layers + n, layer_types=types))
    grown.load_weights(tree_flatten(draft.parameters()), strict=False)
    for layer in grown.layers[cfg.num_hidden_layers :]:
        layer.self_attn.o_proj.weight = mx.zeros_like(layer.self_attn.o_proj.weight)
        layer.mlp.down_proj.weight = mx.zeros_like(layer.mlp.down_proj.weight)
    return grown


SHARD_BYTES = 12 << 20  # weight files stay small enough to travel back from a GPU machine one by one


def save_draft(draft: DraftModel, out: Path, dtype=mx.float16):
    """Public DFlash format: config.json + model.safetensors (fc, hidden_norm, layers.N.*, norm);
    a draft over SHARD_BYTES is split into model-0000k-of-0000n.safetensors shards with an index."""
    out.mkdir(parents=True, exist_ok=True)
    write_weights(out, {k: v.astype(dtype) for k, v in tree_flatten(draft.parameters())}, SHARD_BYTES)
    (out / "config.json").write_text(json.dumps(draft.config.to_dict(), indent=2))
    write_draft_vocab(out, draft.config.draft_vocab)


def write_draft_vocab(out: Path, vocab: tuple | None):
    """draft_vocab.json beside config.json; none for a draft without a vocabulary (a file left by
    an earlier draft in `out` is not this one's)."""
    if vocab:
        (out / DRAFT_VOCAB_FILE).write_text(json.dumps({"tokens": list(vocab)}))
    else:
        (out / DRAFT_VOCAB_FILE).unlink(missing_ok=True)


def draft_vocab(responses: list, size: int, keep: set) -> tuple:
    """The `size` tokens the target writes most often in these responses, most frequent first,
    plus `keep` (its EOS tokens): the draft's vocabulary (Target.draft_head). Frequency-ranked
    vocabularies are FR-Spec's idea (Zhao et al. 2025): a few thousand tokens cover nearly all
    that a chat model writes."""
    counts = np.bincount(np.concatenate([np.asarray(r, dtype=np.int64) for r in responses]))
    ranked = [int(t) for t in np.argsort(-counts, kind="stable")[:size] if counts[t]]
    return tuple(ranked + sorted(set(keep) - set(ranked)))


def tokens_per_cycle(target: Target, draft: DraftModel, prompts: list, max_new: int, eos: set) -> float:
    """Mean tokens per cycle of the real engine loop over the prompts (committed / cycles), every
    proposal verified (the fixed policy): the draft's own figure, whatever a device's costs."""
    tokens = cycles = 0
    for ids in prompts:
        *_, summary = dflash_generate(
            target, draft, ids, max_tokens=max_new, block_size=draft.config.block_size, eos_ids=eos, policy="fixed"
        )
        tokens += len(summary.tokens)
        cycles += summary.cycles
    return tokens / max(cycles, 1)


# ---------------------------------------------------------------------------- training


def load_frozen_target(path: str, dtype=mx.float32):
    """(model, tokenizer), frozen, in `dtype`: a local directory, hub id or GGUF file."""
    from mlx_lm.utils import dequantize_model, load

    from ..models.loading import resolve

    model, tokenizer = load(str(resolve(str(path), "target")))
    dequantize_model(model)  # a quantized target (e.g. from a GGUF) trains as the CPU engine runs it
    model.set_dtype(dtype)  # stored in 16 bits; the engine runs float32 on CPU
    model.eval()
    model.freeze()
    return model, tokenizer


def training_data(args, model, tokenizer, log=print) -> tuple:
    """(prompts, responses, eval prompts) as token ids: the target's own greedy continuations,
    read from --data-cache if it holds them (several files: merged), else regenerated (and
    written there)."""
    caches = [Path(c) for c in args.data_cache or []]
    reuse = reuses_data(caches)
    if args.data == "chat":  # a chat target's requests: every one in its chat template
        from .chat_prompts import chat_prompts, heldout_requests

        texts, eval_texts = (
            ([], heldout_requests())
            if reuse
            else chat_prompts(model, tokenizer, args.num_prompts, args.seed, args.own_prompts, log)
        )
        chat_fraction = 1.0
    else:
        texts, eval_texts = prompt_texts(args.data, args.seed, args.num_prompts)
        chat_fraction = args.chat_fraction
    eval_prompts = [encode_prompt(tokenizer, t, True)[-args.max_prompt_tokens :] for t in eval_texts]
    if reuse:
        return (*read_data(caches, log), eval_prompts)
    cache = caches[0] if caches else None
    texts = with_renamed_names(texts, args.rename_fraction, random.Random(args.seed + 1))
    rng = random.Random(args.seed)
    chat = [rng.random() < chat_fraction for _ in texts]
    prompts = [encode_prompt(tokenizer, t, c)[-args.max_prompt_tokens :] for t, c in zip(texts, chat)]
    prompts = [list(p) for p in dict.fromkeys(map(tuple, prompts))]  # drawn twice: generated and trained once
    responses = regenerate(model, tokenizer, prompts, args.response_tokens, args.gen_batch, log, args.reply_temperature)
    if cache:  # written whole, then renamed: a concurrent run may be waiting for it
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_suffix(".partial")
        tmp.write_text(json.dumps({"target": str(args.target), "prompts": prompts, "responses": responses}))
        tmp.replace(cache)
    return prompts, responses, eval_prompts


def reuses_data(caches: list) -> bool:
    """Whether --data-cache names data regenerated earlier (several files, or one that exists),
    to be read rather than written."""
    return len(caches) > 1 or bool(caches) and Path(caches[0]).is_file()


def read_data(paths: list, log=print) -> tuple:
    """(prompts, responses) from regenerated-data files, in order. A prompt drawn again (by
    another seed, or twice by one) keeps its first response only: repeats would weigh double."""
    prompts, responses, seen = [], [], set()
    for path in paths:
        if not path.is_file():
            raise DFlashError(
                f"--data-cache {path} does not exist; regenerate it first (train-draft --data-only "
                f"--data-cache {path}): several files are only read"
            )
        saved = json.loads(path.read_text())
        for p, r in zip(saved["prompts"], saved["responses"]):
            if tuple(p) not in seen:
                seen.add(tuple(p))
                prompts.append(p)
                responses.append(r)
    where = paths[0] if len(paths) == 1 else f"{len(paths)} files"
    log(f"data: {len(prompts)} regenerated sequences from {where}")
    return prompts, responses


def write_data(args, log=print):
    """--data-only: regenerate the data into --data-cache (or read it), train nothing."""
    model, tokenizer = load_frozen_target(str(args.target))
    regenerates = not reuses_data(args.data_cache)
    prompts, responses, _ = training_data(args, model, tokenizer, log)
    log(f"data: {len(prompts)} sequences, {sum(map(len, responses)):,} response tokens")
    if regenerates:
        log(f"wrote {args.data_cache[0]}")
    if args.draft_vocab:  # for a draft already trained on this data (--out; checked by the command)
        vocab = draft_vocab(responses, args.draft_vocab, set(tokenizer.eos_token_ids))
        write_draft_vocab(Path(args.out), vocab)
        log(f"draft vocabulary: {len(vocab)} tokens written to {Path(args.out) / DRAFT_VOCAB_FILE}")


def train(args, log=print) -> dict:
    """Train a draft for --target and write it to --out (again at every evaluation); returns the
    summary that goes to training.json."""
    t_start = time.time()
    model, tokenizer = load_frozen_target(args.target)
    draft = resumed_draft(model, args) if args.resume else new_draft(model, tokenizer, args)
    cfg, B = draft.config, draft.config.block_size
    target = Target(model, cfg.target_layer_ids)
    log(
        f"target {args.target}: {target.num_layers} layers; draft taps {cfg.target_layer_ids}, "
        f"{cfg.num_hidden_layers} layer(s), block {B}, mask id {cfg.mask_token_id}"
    )

    # data: the target's own continuations; --val-sequences of them are never trained on: their
    # loss tells overfitting (train loss falls, this one does not) from a draft too small to learn more
    prompts, responses, eval_prompts = training_data(args, model, tokenizer, log)
    eos = set(tokenizer.eos_token_ids)
    data = Sequences(prompts, responses, pad_id=min(eos))
    if args.draft_vocab:
        draft.config = replace(cfg, draft_vocab=draft_vocab(responses, args.draft_vocab, eos))
        cfg = draft.config
    t_data = time.time() - t_start
    n_resp = int((data.end - data.start).sum())
    log(f"data: {len(data)} sequences, {n_resp:,} response tokens, length {data.length}, {t_data:.0f}s")
    n_val = min(args.val_sequences, len(data) // 2)
    split = np.random.default_rng(args.seed + 1).permutation(len(data))
    val_rows, train_rows = np.sort(split[:n_val]), np.sort(split[n_val:])

    # the training forward: --compute-dtype bfloat16 runs it in 16 bits (a 16-bit copy of the frozen
    # target gives taps, embeddings and head; a 16-bit working copy of the draft is refreshed from
    # the float32 master weights every step); the engine's evaluation and the saved draft use the masters
    low = DTYPES[args.compute_dtype]
    work_target = training_target(args, model, target, low)
    work = draft if low == mx.float32 else DraftModel(cfg)
    blocks = Blocks(data, work_target, cfg, args.anchors, args.distill > 0, args.cache_taps, log)
    opt = optim.AdamW(learning_rate=0.0, weight_decay=args.weight_decay)
    state = [draft.state, opt.state]
    step = make_step(draft, work, low, opt, block_loss(work_target.head, cfg, args.distill), state, args.compile)

    steps_per_epoch = math.ceil(len(train_rows) / args.batch_size)
    total = args.epochs * steps_per_epoch
    run = Run(total, args.minutes, args.lr, args.log_every, log, unit="block tok", steps_per_epoch=steps_per_epoch)
    rng = np.random.default_rng(args.seed)
    batches = shuffled_batches(train_rows, args.batch_size, rng)
    history, out = [], Path(args.out)  # the evaluations; where the draft is written

    def evaluate(tag: str) -> float:
        """The engine's tokens per cycle on the held-out prompts (and the held-out sequences' loss)."""
        tau = tokens_per_cycle(target, draft, eval_prompts[: args.eval_prompts], args.eval_tokens, eos)
        history.append(
            {
                "step": run.step,
                "tau": round(tau, 3),
                "loss": round(float(np.mean(run.losses[-50:])), 4) if run.losses else None,
            }
        )
        val = ""
        if n_val:
            history[-1]["val_loss"] = round(validation_loss(draft, blocks, val_rows, args.batch_size), 4)
            val = f"; loss on {n_val} held-out sequences {history[-1]['val_loss']:.3f}"
        run.log(
            f"{tag}: step {run.step}/{total}, engine tokens per cycle {tau:.2f} on "
            f"{min(len(eval_prompts), args.eval_prompts)} held-out prompts{val}"
        )
        return tau

    for lr in run:
        opt.learning_rate = lr
        inputs, n_blocks = blocks(next(batches), rng)
        loss = step(*inputs)
        mx.eval(loss, state)
        run.record(loss.item(), n_blocks * B)
        if run.due(args.eval_every):
            evaluate("eval")
            save_draft(draft, out)
    train_seconds = run.seconds
    tau = evaluate("final")
    save_draft(draft, out)

    window = max(1, min(50, len(run.losses) // 4))  # loss at the start and at the end, smoothed
    summary = {
        "target": str(args.target),
        "layers": cfg.num_hidden_layers,
        "params": count_params(draft),
        "block_size": B,
        "target_layer_ids": cfg.target_layer_ids,
        "sequences": len(train_rows),
        "val_sequences": n_val,
        "response_tokens": n_resp,
        "batch_size": args.batch_size,
        "anchors": args.anchors,
        "loss_gamma": loss_gamma(B),
        "compute_dtype": args.compute_dtype,
        "distill": args.distill,
        "draft_vocab": len(cfg.draft_vocab) if cfg.draft_vocab else None,
        "steps": run.step,
        "epochs_run": round(run.step / steps_per_epoch, 2),
        "data_seconds": round(t_data),
        "train_seconds": round(train_seconds),
        "final_loss": round(float(np.mean(run.losses[-window:])), 4),
        "first_loss": round(float(np.mean(run.losses[:window])), 4),
        "eval_tau": round(tau, 3),
        "history": history,
    }
    if n_val:
        summary["val_loss"] = history[-1]["val_loss"]
    return summary


def training_target(args, model, target: Target, low) -> Target:
    """The target the training forward reads: the engine's, or with --compute-dtype bfloat16 a
    16-bit copy; with --distill it records its last layer too (after the taps: the teacher's
    logits come from there)."""
    last = target.num_layers - 1
    recorded = target.tap_ids + ([last] if args.distill and last not in target.tap_ids else [])
    if low == mx.float32 and recorded == target.tap_ids:
        return target
    return Target(model if low == mx.float32 else load_frozen_target(args.target, low)[0], recorded)


def shuffled_batches(rows: np.ndarray, size: int, rng):
    """Batches of `size` rows for ever: each epoch every row once, in a new order."""
    while True:
        order = rng.permutation(rows)
        for s in range(0, len(order), size):
            yield order[s : s + size]


class Blocks:
    """The inputs of a training step for some of the data's sequences: the target's taps (with
    distill, then its normed final hidden state: the teacher), the anchors' blocks embedded by
    the target, their labels and loss weights (see make_batch). The target is frozen: with
    cache_taps its taps are computed once for all steps."""

    def __init__(
        self,
        data: Sequences,
        target: Target,
        cfg: DraftConfig,
        n_anchors: int,
        distill: bool,
        cache_taps: bool,
        log=print,
    ):
        self.data, self.target, self.cfg, self.n_anchors, self.distill = data, target, cfg, n_anchors, distill
        self.n_taps = len(cfg.target_layer_ids)
        B = cfg.block_size
        self.weights_k = mx.array([math.exp(-(k - 1) / loss_gamma(B)) for k in range(1, B)])
        self.cached = cached_taps(target, data.ids, log) if cache_taps else None

    def taps(self, rows) -> list:
        if self.cached is None:
            taps = tapped_hidden(self.target, mx.array(self.data.ids[rows]))
        else:
            taps = [t[mx.array(rows)] for t in self.cached]
        if self.distill:  # normed out here: MLX's compiled step refused the target's norm inside it
            last = self.target.tap_ids.index(self.target.num_layers - 1)
            return taps[: self.n_taps] + [self.target.inner.norm(taps[last])]
        return taps

    def __call__(self, rows, rng) -> tuple:
        """(inputs of the step, how many of its blocks are real)."""
        block_ids, anchors, seq_of_block, labels, weights, n_blocks = make_batch(
            self.data, rows, self.n_anchors, self.cfg, self.weights_k, rng
        )
        inputs = (
            self.taps(rows),
            self.target.embed(mx.array(block_ids)),
            mx.array(anchors),
            mx.array(seq_of_block),
            mx.array(labels),
            weights,
        )
        return inputs, n_blocks


def cached_taps(target: Target, ids: np.ndarray, log=print) -> list:
    """The target's taps for all the sequences (memory: sequences x length x hidden x taps)."""
    per_tap = [[] for _ in target.tap_ids]
    for r in range(0, len(ids), 64):
        taps = tapped_hidden(target, mx.array(ids[r : r + 64]))
        mx.eval(taps)
        for chunks, t in zip(per_tap, taps):
            chunks.append(t)
    cached = []
    for k in range(len(per_tap)):  # one tap at a time, freeing its chunks: peak ~(1 + 1/taps) x the cache
        cached.append(mx.concatenate(per_tap[k]))
        mx.eval(cached[-1])
        per_tap[k] = None
    log(f"cached the target's taps for {len(ids)} sequences")
    return cached


def block_loss(head, cfg: DraftConfig, distill: float):
    """loss(draft, *inputs of Blocks) for make_step: draft_loss, with distill > 0 against the
    teacher that ends the taps too."""
    n_taps = len(cfg.target_layer_ids)

    def loss(draft, taps, block_embeds, anchors, seq_of_block, labels, weights):
        teacher = teacher_logits(head, taps[n_taps], anchors, seq_of_block, cfg.block_size) if distill else None
        return draft_loss(
            draft, head, taps[:n_taps], block_embeds, anchors, seq_of_block, labels, weights, teacher, distill
        )

    return loss


def validation_loss(draft, blocks: Blocks, rows, batch_size: int) -> float:
    """The loss on these sequences, on the greedy tokens alone (whatever --distill is, so runs
    compare), with the same anchors every time."""
    loss = block_loss(blocks.target.head, blocks.cfg, 0.0)
    rng, total, weight = np.random.default_rng(0), 0.0, 0.0
    for r in range(0, len(rows), batch_size):
        inputs, _ = blocks(rows[r : r + batch_size], rng)
        w = inputs[-1].sum().item()
        total, weight = total + loss(draft, *inputs).item() * w, weight + w
    return total / max(weight, 1e-6)


def add_arguments(p):
    p.add_argument("--target", required=True, help="mlx-lm target: local directory or Hugging Face hub id")
    p.add_argument(
        "--data",
        default="stdlib",
        help="'chat' (a chat target: requests from templates and ones it writes itself; evaluated on "
        "assets/prompts/chat_heldout.json), 'stdlib', a directory/file of source text, "
        'or a .jsonl of {"prompt": ...}',
    )
    p.add_argument(
        "--own-prompts",
        type=probability,
        default=0.5,
        help="with --data chat: share of the prompts the target writes itself",
    )
    p.add_argument("--out", required=True, help="draft directory to write")
    p.add_argument("--layers", type=positive_int, default=1, help="draft layers")
    p.add_argument("--intermediate", type=positive_int, help="draft MLP size (default: the target's)")
    p.add_argument(
        "--target-layers",
        type=int,
        nargs="+",
        help="target layers whose hidden states the draft reads (default: the published spacing rule)",
    )
    p.add_argument(
        "--block-size", type=int, help="draft block size (default 16; with --resume: the draft's, unless given)"
    )
    p.add_argument(
        "--cache-taps",
        action="store_true",
        help="compute the target's hidden states once and keep them (memory: sequences x length x hidden x taps)",
    )
    p.add_argument("--resume", help="draft directory to continue training from (its config wins)")
    p.add_argument(
        "--add-layers",
        type=count,
        default=0,
        help="with --resume: put this many new layers on top, each starting as the identity",
    )
    p.add_argument("--mask-token", default="<|mask|>")
    p.add_argument("--num-prompts", type=positive_int, default=2000)
    p.add_argument(
        "--data-cache",
        nargs="+",
        help="JSON file: reuse the regenerated data if it exists, else write it; several files "
        "(from --data-only runs, e.g. one per --seed) are read and merged",
    )
    p.add_argument(
        "--data-only",
        action="store_true",
        help="only regenerate the data into --data-cache (then train several drafts on it)",
    )
    p.add_argument("--chat-fraction", type=probability, default=0.7, help="share of prompts in the chat template")
    p.add_argument(
        "--rename-fraction",
        type=probability,
        default=0.0,
        help="share of prompts whose own names are swapped for others (code the target never saw)",
    )
    p.add_argument(
        "--reply-temperature",
        type=float,
        default=0.0,
        help="regenerate the target's replies by sampling at this temperature (0: greedy); "
        "sampled replies teach the draft the target's spread, for speculative sampling",
    )
    p.add_argument(
        "--draft-vocab",
        type=positive_int,
        help="let the draft propose only the N tokens the target writes most often in the data "
        "(draft_vocab.json): a smaller LM head for the draft, faster on a CPU; with --data-only, "
        "write it into the draft at --out",
    )
    p.add_argument("--max-prompt-tokens", type=positive_int, default=256)
    p.add_argument("--response-tokens", type=positive_int, default=256)
    p.add_argument("--gen-batch", type=positive_int, default=256)
    p.add_argument("--batch-size", type=positive_int, default=16, help="sequences per step")
    p.add_argument("--anchors", type=positive_int, default=64, help="anchors (blocks) per sequence per step")
    p.add_argument("--epochs", type=positive_int, default=6)
    p.add_argument("--minutes", type=float, help="train for this long at most (schedule by time)")
    p.add_argument("--lr", type=float, default=6e-4)
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument(
        "--distill",
        type=probability,
        default=0.0,
        help="0..1: share of the loss taken against the target's whole next-token distribution "
        "instead of its greedy token (0: greedy tokens only, the published recipe)",
    )
    p.add_argument(
        "--val-sequences",
        type=count,
        default=0,
        help="hold out this many sequences of the data and report the draft's loss on them at each evaluation",
    )
    p.add_argument("--eval-every", type=count, default=200)
    p.add_argument("--eval-prompts", type=count, default=4)
    p.add_argument("--eval-tokens", type=positive_int, default=128)
    p.add_argument("--log-every", type=positive_int, default=20)
    add_compute_arguments(p)
    p.add_argument("--seed", type=int, default=0)
