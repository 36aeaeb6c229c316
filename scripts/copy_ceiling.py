"""How many tokens a cycle the copy source could reach at best on a prompt set: the pair's greedy
reply to each request, walked cycle by cycle with the copy source's own proposal (its longest,
latest match) verified in full at every position and accepted where it is right, as if the policy
always knew. A cycle whose copy is wrong at its first token commits what a drafted cycle commits
on average (`--drafted`, the benchmark's tokens per drafted cycle), so the figure is a ceiling for
DFlash + copy as the engine proposes: where the reply does not repeat its context, no choice of
when to copy lifts it.

    python scripts/copy_ceiling.py [--prompts assets/prompts/context_reuse.json] [--max-tokens 128]
        [--drafted 1.95] [--save FILE]
"""

import argparse
import json
import sys
from pathlib import Path
from statistics import median

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import dflash_core  # noqa: E402,F401  (system OpenBLAS before MLX)

# isort: split
from dflash_core.engine.copy_source import MAX_COPY, CopySource  # noqa: E402
from dflash_core.engine.events import RunSummary  # noqa: E402
from dflash_core.models.loading import load_pair  # noqa: E402


def walk(prompt_ids: list, reply: list) -> dict:
    """Copies verified at every position of `reply`: those right at their first token, and the
    reply's tokens they commit."""
    source, at, copies, copied = CopySource(prompt_ids), 0, 0, 0
    while at < len(reply):
        found = source.propose(reply[at], MAX_COPY)
        right = 0
        for proposed, actual in zip(found.tokens if found else [], reply[at + 1 :]):
            if proposed != actual:
                break
            right += 1
        step = 1 + right
        if right:
            copies, copied = copies + 1, copied + step
        source.extend(reply[at : at + step])
        at += step
    return {"copies": copies, "copied_tokens": copied}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", default="assets/prompts/context_reuse.json")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--drafted", type=float, default=1.95, help="tokens a drafted cycle commits")
    ap.add_argument("--save")
    args = ap.parse_args()
    pair = load_pair()
    rows = []
    for n, prompt in enumerate(json.loads(Path(args.prompts).read_text()), 1):
        ids = pair.encode(prompt, chat_template=True)
        reply = next(ev for ev in pair.baseline(ids, args.max_tokens) if isinstance(ev, RunSummary)).tokens
        row = {"request": n, "tokens": len(reply)} | walk(ids, reply)
        cycles = row["copies"] + (len(reply) - row["copied_tokens"]) / args.drafted
        row["tokens_per_cycle"] = round(len(reply) / cycles, 2)
        rows.append(row)
        print(
            f"request {n}: {len(reply)} tokens, {row['copied_tokens']} in {row['copies']} right copies, "
            f"at most {row['tokens_per_cycle']:.2f} tokens a cycle"
        )
    ceiling = median(r["tokens_per_cycle"] for r in rows)
    print(f"median ceiling: {ceiling:.2f} tokens a cycle (drafted cycles at {args.drafted})")
    if args.save:
        result = {"prompts": args.prompts, "max_tokens": args.max_tokens, "drafted": args.drafted}
        Path(args.save).write_text(json.dumps(result | {"requests": rows, "median": ceiling}, indent=1))


if __name__ == "__main__":
    main()
