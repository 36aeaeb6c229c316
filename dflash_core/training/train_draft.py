"""Train a DFlash draft for any mlx-lm target (the published recipe: the DFlash paper, Chen, Liang, Liu 2026).

- The target is frozen. Its own greedy continuations of the prompts are the training text, so the
  draft learns the target's distribution, not the corpus's.
- Per sequence, anchors are sampled among response positions (resampled every epoch). Block k
  (one per anchor a) is `[token[a], MASK x (B-1)]` at positions a..a+B-1; its queries see the
  context features of positions < a and their own block (bidirectionally), nothing else;
  position j of the block predicts token[a + j], weighted exp(-(j-1)/gamma).
- The forward (draft_blocks) uses the inference model's own modules (`DraftModel`: fc, hidden_norm,
  q/k norms, rope, `keys_values`), and the target's taps come from the engine's `Target`, so
  training sees exactly what the engine computes at inference.
- Evaluation runs the real engine loop (`engine.dflash_generate`) and reports tokens per cycle;
  with --val-sequences also the loss on sequences held out of training.

Here: the run (train, the new or resumed draft, saving, the command's options); its data is in
draft_data (prompts and the target's replies, decoded by decoding), its blocks and loss in draft_blocks.
"""

import json
import math
import time
from dataclasses import replace
from pathlib import Path

import mlx.core as mx
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten

from ..argtypes import count, positive_int, probability
from ..backend import DTYPES
from ..engine.cycle import dflash_generate
from ..engine.draft import DraftConfig, DraftModel
from ..engine.target import Target
from ..errors import DFlashError
from .common import Run, add_compute_arguments, count_params, make_step, write_weights
from .decoding import load_frozen_target
from .draft_blocks import Blocks, block_loss, loss_gamma, shuffled_batches, validation_loss
from .draft_data import Sequences, draft_vocab, training_data, write_draft_vocab


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
