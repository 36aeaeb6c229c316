"""generate: DFlash on one prompt, optionally side by side with plain greedy decoding."""
import json

from ..argtypes import positive_int, whole_number
from ..events import CycleEvent, RunSummary
from .common import add_min_confidence_arg, add_pair_args, load, log


def add_parser(sub):
    p = sub.add_parser("generate", help="generate text with DFlash speculative decoding")
    add_pair_args(p)
    p.add_argument("--prompt", required=True)
    p.add_argument("--max-tokens", type=whole_number, default=256)
    p.add_argument("--block-size", type=positive_int, help="2 .. the draft's block size (default: the draft's)")
    add_min_confidence_arg(p)
    p.add_argument("--no-chat-template", action="store_true", help="feed the prompt as raw text")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.add_argument("--compare-baseline", action="store_true", help="also run plain greedy decoding and compare")
    p.set_defaults(func=run)


def run(args) -> int:
    pair = load(args)
    ids = pair.encode(args.prompt, chat_template=not args.no_chat_template)
    summary = None
    for ev in pair.dflash(ids, args.max_tokens, args.block_size, min_confidence=args.min_confidence):
        if isinstance(ev, CycleEvent) and not args.json:
            print(pair.text(ev.committed), end="", flush=True)
        elif isinstance(ev, RunSummary):
            summary = ev
    out = {"tokens": summary.tokens, "text": pair.text(summary.tokens), "stats": summary.stats()}
    if args.compare_baseline:
        base = list(pair.baseline(ids, args.max_tokens))[-1]
        div = pair.divergence(ids, summary.tokens, base.tokens)
        out["baseline"] = {"tokens": base.tokens, "decode_tps": round(base.decode_tps, 2)}
        out["identical"] = div is None
        out["first_divergence"] = None if div is None else vars(div)
        out["speedup"] = round(summary.decode_tps / base.decode_tps, 3) if base.decode_tps else None
    if args.json:
        print(json.dumps(out))
        return 0
    s = summary
    checked = (f" (the target checked {s.drafted_tokens / s.cycles:.1f} of {s.block_size - 1} proposals per cycle, "
               f"--min-confidence {s.min_confidence:g})") if s.min_confidence > 0 and s.cycles else ""
    log(f"\n[{s.generated} tokens, {s.decode_tps:.1f} tok/s, {s.tokens_per_cycle:.2f} tokens/cycle, "
        f"acceptance rate {s.acceptance_rate:.1%}{checked}, prefill {s.prefill_s:.2f}s]")
    if args.compare_baseline:
        verdict = "identical" if out["identical"] else f"DIVERGED at {out['first_divergence']}"
        log(f"[baseline {out['baseline']['decode_tps']} tok/s, speedup {out['speedup']}x, output {verdict}]")
    return 0
