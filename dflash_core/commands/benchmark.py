"""benchmark: baseline vs DFlash on the same token ids, warm-up first, medians of repeats."""

import argparse
import json
from pathlib import Path

from ..argtypes import positive_int, probability, whole_number
from ..benchmark import divergence_line, load_prompts, run_benchmark
from ..engine.policy import POLICIES
from ..errors import DFlashError
from ..models import distributed
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
    p = sub.add_parser("benchmark", help="measure DFlash against plain greedy decoding")
    add_pair_args(p)
    g = p.add_mutually_exclusive_group()
    g.add_argument("--prompt", "-p")
    g.add_argument("--prompts", help="JSON list of prompts, or text with prompts separated by blank lines")
    p.add_argument("--max-tokens", "-m", type=whole_number, default=256)
    p.add_argument("--repeat", type=positive_int, default=3)
    add_block_size_args(p)
    add_chat_template_args(p)
    add_policy_args(p)
    add_copy_args(p)
    p.add_argument(
        "--copy-sweep",
        action="store_true",
        help="also run DFlash with the copy source the other way (--copy or not) side by side",
    )
    p.add_argument(
        "--pipeline-sweep",
        action="store_true",
        help="also run DFlash with pipelined cycles (each launched before the last is read back) the "
        "other way than the default (on for CUDA GPUs, else off; DFLASH_PIPELINE=0|1 sets it) side by side",
    )
    p.add_argument(
        "--compile-sweep",
        action="store_true",
        help="also run DFlash with pipelined cycles as compiled graphs the other way than the default "
        "(on for CUDA GPUs, else off; DFLASH_COMPILE_CYCLE=0|1 sets it) side by side",
    )
    p.add_argument(
        "--shared-prefill",
        action="store_true",
        help="prefill each prompt once and run every engine from there, so that their decodes follow each "
        "other closely: for long prompts, whose prefill on a CPU takes minutes through which the machine's "
        "speed drifts (prefill_s then times the last token alone)",
    )
    add_sampling_args(p)
    p.add_argument(
        "--oracle",
        action="store_true",
        help="also run an oracle draft (the target's own continuation): the ceiling at full acceptance",
    )
    p.add_argument("--sweep", help="comma-separated block sizes to sweep, e.g. 4,8,12,16")
    p.add_argument(
        "--policy-sweep",
        help="comma-separated policies to run side by side with --policy, e.g. fixed (the fixed one "
        "at --min-confidence or the device's default)",
    )
    p.add_argument(
        "--confidence-sweep", help="comma-separated --min-confidence values to run side by side, e.g. 0,0.2,0.4"
    )
    p.add_argument("--json", action="store_true", help="print the results as one JSON object on stdout")
    p.add_argument("--save", help="also write the results JSON to this file")
    p.add_argument("--plot", help="write a plotly chart of the results (.html, or .png if kaleido is installed)")
    p.set_defaults(func=run)


def _numbers(text: str, option: str, kind, what: str) -> list:
    """A comma-separated option (--sweep 4,8,16; --confidence-sweep 0,0.2), or one error line."""
    try:
        return [kind(x) for x in text.split(",") if x.strip()]
    except (ValueError, argparse.ArgumentTypeError):
        raise DFlashError(f"{option} '{text}' is not a comma-separated list of {what}") from None


def _policy(name: str) -> str:
    if name not in POLICIES:
        raise ValueError(name)
    return name


def _rounded(value):
    """Floats to 3 decimals, inside lists and dicts too (the text view; --json keeps them whole)."""
    if isinstance(value, float):
        return round(value, 3)
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    return value


def run(args) -> int:
    sweep = _numbers(args.sweep, "--sweep", int, "block sizes") if args.sweep else []
    levels = (
        _numbers(args.confidence_sweep, "--confidence-sweep", probability, "probabilities between 0 and 1")
        if args.confidence_sweep
        else []
    )
    policies = _numbers(args.policy_sweep, "--policy-sweep", _policy, "policies") if args.policy_sweep else []
    policy = policy_of(args)
    sampling = sampling_of(args)
    if sampling and args.oracle:
        raise DFlashError("--oracle replays greedy decoding: drop it, or use --temperature 0")
    if args.shared_prefill and distributed.size() > 1:
        raise DFlashError("--shared-prefill keeps prefix snapshots, which a group of processes does not: drop it")
    if args.chat_template_args is not None and args.chat_template is False:
        raise DFlashError("--chat-template-args go through the chat template: drop --no-chat-template")
    given = args.prompt is not None or args.prompts is not None
    prompts = (
        load_prompts(args.prompt, args.prompts) if given else None
    )  # a bad file is reported before the model loads
    pair = load(args)
    chat = chat_template_of(args, pair)
    prompts = prompts or load_prompts(chat=chat)  # the default prompts depend on the pair
    res = run_benchmark(
        pair,
        prompts,
        max_tokens=args.max_tokens,
        repeat=args.repeat,
        block_size=block_size(args, pair),
        chat_template=chat,
        oracle=args.oracle,
        sweep=sweep,
        log=log,
        policy=policy,
        policy_sweep=policies,
        min_confidence=args.min_confidence,
        confidence_sweep=levels,
        sampling=sampling,
        template_args=args.chat_template_args,
        copy=args.copy,
        copy_sweep=args.copy_sweep,
        pipeline_sweep=args.pipeline_sweep,
        compile_sweep=args.compile_sweep,
        shared_prefill=args.shared_prefill,
    )
    res["config"]["group"] = distributed.describe()  # the processes the target was split across
    if args.save and distributed.primary():
        Path(args.save).write_text(json.dumps(res, indent=2))
    if args.plot and distributed.primary():
        from ..plots import save_benchmark_figure

        save_benchmark_figure(res, args.plot)
    s = res["summary"]
    if args.json:
        print(json.dumps(res))
    else:
        for k, v in s.items():
            print(f"{k:>32}: {_rounded(v)}")
    if s["identical"] is False:
        log(divergence_line(s))
        return 1
    return 0
