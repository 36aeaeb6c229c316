"""generate: DFlash on one prompt, optionally side by side with plain decoding (greedy, or sampling
with the same seed)."""

import json
import sys

from ..argtypes import whole_number
from ..engine.events import CycleEvent, RunSummary, lossless_verdict
from ..errors import DFlashError
from ..models import distributed
from ..models.tokenizer import TextStream
from .common import (
    add_block_size_args,
    add_chat_template_args,
    add_copy_args,
    add_pair_args,
    add_policy_args,
    add_sampling_args,
    block_size,
    chat_template_of,
    load,
    log,
    policy_of,
    sampling_of,
)


def add_parser(sub):
    p = sub.add_parser("generate", help="generate text with DFlash speculative decoding")
    add_pair_args(p)
    p.add_argument("--prompt", "-p", required=True, help="the prompt; '-' reads it from stdin")
    p.add_argument("--system-prompt", help="a system message before the prompt (chat template)")
    add_chat_template_args(p)
    p.add_argument("--max-tokens", "-m", type=whole_number, default=256, help="most tokens to generate (default 256)")
    add_block_size_args(p)
    add_policy_args(p)
    add_copy_args(p)
    add_sampling_args(p)
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.add_argument(
        "--compare-baseline",
        action="store_true",
        help="also run plain decoding and compare (greedy: token for token; sampling: the same seed)",
    )
    p.set_defaults(func=run)


TEMPLATE_ONLY = "--system-prompt and --chat-template-args go through the chat template"


def run(args) -> int:
    wants_template = args.system_prompt is not None or args.chat_template_args is not None
    if wants_template and args.chat_template is False:
        raise DFlashError(f"{TEMPLATE_ONLY}: drop --no-chat-template")  # said before a long load
    sampling = sampling_of(args)
    if args.prompt == "-" and distributed.size() > 1:
        raise DFlashError(
            "--prompt - reads stdin, which mlx.launch never closes: give the prompt itself (--prompt TEXT)"
        )
    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt  # as mlx-lm reads it
    pair = load(args)
    if wants_template and not getattr(pair.tokenizer, "has_chat_template", False):
        raise DFlashError(f"{TEMPLATE_ONLY}, and this model has none")
    chat = chat_template_of(args, pair) or wants_template  # so does a system prompt
    ids = pair.encode(
        prompt, chat_template=chat, system_prompt=args.system_prompt, template_args=args.chat_template_args
    )
    stream = TextStream(pair.tokenizer, pair.eos_ids)  # the text view's output
    summary = None
    for ev in pair.dflash(
        ids,
        args.max_tokens,
        block_size(args, pair),
        min_confidence=args.min_confidence,
        sampling=sampling,
        policy=policy_of(args),
        copy=args.copy,
    ):
        if isinstance(ev, CycleEvent) and not args.json:
            print(stream.add(ev.committed), end="", flush=True)
        elif isinstance(ev, RunSummary):
            summary = ev
    if not args.json:
        print(stream.finish(), end="", flush=True)
    out = {
        "tokens": summary.tokens,
        "text": pair.text(summary.tokens),
        "stats": summary.stats(),
        "draft_quant": pair.draft_quant,
        "memory_mb": {k: round(v / 2**20, 1) for k, v in pair.memory().items()},
    }
    if args.compare_baseline:
        base = list(pair.baseline(ids, args.max_tokens, sampling=sampling))[-1]
        out["baseline"] = {"tokens": base.tokens, "decode_tps": round(base.decode_tps, 2)}
        verdict = lossless_verdict(summary, base)
        if verdict != "sampled":
            div = pair.divergence(ids, summary.tokens, base.tokens) if verdict == "diverged" else None
            out["identical"] = verdict == "identical"
            out["first_divergence"] = None if div is None else vars(div)
        out["speedup"] = round(summary.decode_tps / base.decode_tps, 3) if base.decode_tps else None
    if args.json:
        print(json.dumps(out))
        return 0
    s = summary
    knob = f"--min-confidence {s.min_confidence:g}" if s.policy == "fixed" else f"{s.plain_steps} plain steps"
    checked = (
        f" ({s.policy} policy: the target checked {s.drafted_tokens / s.cycles:.1f} of {s.block_size - 1} "
        f"proposals per cycle, {knob})"
        if s.cycles
        else ""
    )
    # how the cycles ran (dflash_core.engine.pipeline): on CUDA pipelined and compiled by default
    cycles = ", cycles pipelined and compiled" if s.compiled else ", cycles pipelined" if s.pipelined else ""
    log(
        f"\n[{s.generated} tokens, {s.decode_tps:.1f} tok/s, {s.tokens_per_cycle:.2f} tokens/cycle, "
        f"acceptance rate {s.acceptance_rate:.1%}{checked}{cycles}, prefill {s.prefill_s:.2f}s]"
    )
    if args.compare_baseline:
        verdict = (
            "sampled: the same distribution as plain sampling, not the same tokens"
            if sampling
            else "identical"
            if out["identical"]
            else f"DIVERGED at {out['first_divergence']}"
        )
        log(f"[baseline {out['baseline']['decode_tps']} tok/s, speedup {out['speedup']}x, output {verdict}]")
    return 0
