"""Where a draft misses: how often its proposal at block position k equals the target's greedy
token, split by how sure the target itself is of that token (its top-1 probability there).
Teacher-forced over the target's own greedy continuations of some prompts, one block per position,
exactly as the trainer scores blocks. A draft that matches where the target is sure and misses
where it is not has learned the easy part; what is left is the target's own hesitation.

    python scripts/misses_by_confidence.py                        # default pair, its benchmark requests
    python scripts/misses_by_confidence.py --target T --draft D --prompts a.json --chat-template
"""

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import dflash_core  # noqa: E402,F401  (system OpenBLAS before MLX)

# isort: split
import mlx.core as mx  # noqa: E402

from dflash_core.benchmark import DEFAULT_PROMPTS  # noqa: E402
from dflash_core.engine.target import Target  # noqa: E402
from dflash_core.models.loading import load_draft  # noqa: E402
from dflash_core.models.registry import DEFAULT_PAIR, SHIPPED  # noqa: E402
from dflash_core.models.tokenizer import encode_prompt  # noqa: E402
from dflash_core.training.decoding import greedy, load_frozen_target  # noqa: E402
from dflash_core.training.draft_blocks import block_logits, tapped_hidden  # noqa: E402

BUCKETS = [(0.0, 0.5), (0.5, 0.7), (0.7, 0.9), (0.9, 0.99), (0.99, 1.01)]


def matches(target: Target, draft, tokenizer, prompt_ids: list, max_new: int) -> tuple:
    """(match (anchors, B-1) bool, target top-1 probability of each label (anchors, B-1))."""
    B, mask = draft.config.block_size, draft.config.mask_token_id
    seq = prompt_ids + greedy(target.model, prompt_ids, max_new, set(tokenizer.eos_token_ids))
    x = mx.array([seq])
    *taps, last = tapped_hidden(target, x)  # one forward: the draft's taps, then the target's last layer
    logits = target.head(target.inner.norm(last))[0]
    sure = np.array(mx.exp(mx.max(logits, axis=-1) - mx.logsumexp(logits, axis=-1)))  # of token i+1, at i
    anchors = np.arange(len(prompt_ids) - 1, len(seq) - B)  # the first block is the first cycle's
    blocks = np.full((len(anchors), B), mask)
    blocks[:, 0] = np.array(seq)[anchors]
    out = block_logits(
        draft,
        target.head,
        taps,
        target.embed(mx.array(blocks)),
        mx.array(anchors),
        mx.zeros(len(anchors), dtype=mx.int32),
    )
    proposals = np.array(mx.argmax(out, axis=-1))
    k = np.arange(1, B)
    labels = np.array(seq)[anchors[:, None] + k[None]]
    return proposals == labels, sure[anchors[:, None] + k[None] - 1]


def report(name: str, match: np.ndarray, sure: np.ndarray):
    print(
        f"{name}: {len(match)} blocks; position 1 matches {match[:, 0].mean():.3f}, target's mean "
        f"top-1 probability {sure[:, 0].mean():.3f}"
    )
    positions = [k for k in (1, 2, 4, 8) if k <= match.shape[1]]
    print(f"  target top-1 prob | share of tokens | draft matches at position {' / '.join(map(str, positions))}")
    for lo, hi in BUCKETS:
        sel = (sure >= lo) & (sure < hi)
        rates = " / ".join(
            f"{match[sel[:, k - 1], k - 1].mean():.3f}" if sel[:, k - 1].any() else "-" for k in positions
        )
        print(f"  [{lo:.2f}, {min(hi, 1):.2f}) | {sel[:, 0].mean():.3f} | {rates}")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default=str(SHIPPED[DEFAULT_PAIR][0]))
    p.add_argument("--draft", default=str(SHIPPED[DEFAULT_PAIR][1]))
    p.add_argument(
        "--prompts",
        nargs="+",
        help="JSON lists of prompt texts (default: the benchmark's chat requests, in the chat template)",
    )
    p.add_argument("--chat-template", action="store_true", help="apply the chat template to --prompts")
    p.add_argument("--max-new", type=int, default=256)
    args = p.parse_args()
    model, tokenizer = load_frozen_target(args.target)
    draft = load_draft(Path(args.draft))
    draft.set_dtype(mx.float32)
    target = Target(model, draft.config.target_layer_ids + [len(model.layers) - 1])
    if args.prompts:
        sets = [(f, json.loads(Path(f).read_text()), args.chat_template) for f in args.prompts]
    else:
        sets = [("benchmark requests (chat)", json.loads(DEFAULT_PROMPTS[True].read_text()), True)]
    for name, texts, chat in sets:
        runs = [
            matches(target, draft, tokenizer, encode_prompt(tokenizer, t, chat)[-256:], args.max_new) for t in texts
        ]
        report(name, np.concatenate([m for m, _ in runs]), np.concatenate([s for _, s in runs]))


if __name__ == "__main__":
    main()
