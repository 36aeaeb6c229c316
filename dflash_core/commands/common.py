"""Arguments and helpers shared by the commands that load a model pair. Where mlx-lm's own
commands name an option differently (--draft-model, --num-draft-tokens, -p), its name works too."""

import argparse
import json
import sys

from ..argtypes import positive_int, probability, temperature, top_p
from ..engine.policy import POLICIES
from ..errors import DFlashError
from ..models import distributed
from ..models.loading import DRAFT_QUANT_BITS, load_pair


def add_pair_args(p):
    p.add_argument(
        "--model", help="target: local mlx-lm dir, hub id, or a shipped pair's name (default: the shipped pair)"
    )
    p.add_argument(
        "--draft",
        "--draft-model",
        dest="draft",
        help="DFlash draft: local dir or hub id (default: the registry's draft for --model)",
    )
    p.add_argument(
        "--draft-quant",
        type=int,
        choices=DRAFT_QUANT_BITS,
        metavar="{4,8}",
        help="quantize the draft's linear layers to 4 or 8 bits at load, for memory; the output "
        "stays the same, acceptance may change (default: as stored)",
    )


def add_chat_template_args(p):
    """One default everywhere: prompts go through the chat template when the model has one (not
    for the stdlib pair, which completes code); thinking stays off unless turned on."""
    p.add_argument(
        "--chat-template",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="wrap prompts in the chat template (default: on for chat models, off for the stdlib pair)",
    )
    p.add_argument(
        "--ignore-chat-template",
        dest="chat_template",
        action="store_false",
        default=None,
        help="mlx-lm's name for --no-chat-template",
    )
    p.add_argument(
        "--chat-template-args",
        "--chat-template-config",
        type=json_object,
        metavar="JSON",
        help="extra arguments for the chat template, e.g. '{\"enable_thinking\": true}' to let a "
        "Qwen3 / Qwen3.5 model think first (thinking is off unless turned on here)",
    )


def chat_template_of(args, pair) -> bool:
    """Whether prompts go through the chat template: --chat-template / --no-chat-template, else the
    pair's default (Pair.chat_default); --chat-template-args asks for it too."""
    if args.chat_template is not None:
        return args.chat_template
    return pair.chat_default or args.chat_template_args is not None


def add_block_size_args(p):
    g = p.add_mutually_exclusive_group()
    g.add_argument("--block-size", type=positive_int, help="2 .. the draft's block size (default: the draft's)")
    g.add_argument(
        "--num-draft-tokens",
        type=positive_int,
        metavar="N",
        help="mlx-lm's name for the same setting: N draft tokens per cycle = --block-size N+1",
    )


def block_size(args, pair):
    """The block size asked for with --block-size or --num-draft-tokens (None: the draft's own)."""
    n = args.num_draft_tokens
    if n is None:
        return args.block_size
    if n >= pair.block_size:
        raise DFlashError(
            f"--num-draft-tokens {n} is out of range: use 1..{pair.block_size - 1} "
            f"(the draft's block size {pair.block_size} minus 1)"
        )
    return n + 1


def json_object(text: str) -> dict:
    """--chat-template-args: a JSON object, e.g. '{"enable_thinking": true}'."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"'{text}' is not valid JSON ({e})") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(
            f"'{text}' is not a JSON object: give one such as '{{\"enable_thinking\": true}}'"
        )
    return value


def log(*args):
    print(*args, file=sys.stderr, flush=True)


def load(args):
    """The pair the arguments name: a hub pair's sizes are said before it downloads (the hub's
    progress bars follow on stderr), and a pair near the device's memory is warned about."""
    log(f"loading {args.model or 'the shipped default pair'} ...")
    pair = distributed.loaded_everywhere(
        lambda: load_pair(args.model, args.draft, draft_quant=args.draft_quant, log=log)
    )
    if args.draft_quant:
        log(f"draft: {pair.draft_precision()}")
    warning = pair.fit_warning()
    if warning:
        log(f"warning: {warning}")
    return pair


def add_policy_args(p):
    """--policy and the fixed policy's --min-confidence (which implies it)."""
    p.add_argument(
        "--policy",
        choices=POLICIES,
        help="adaptive (default): a cost model of this device decides each cycle between a plain "
        "target step and drafting, and how many proposals to verify; fixed: verify the block's "
        "leading proposals down to --min-confidence (the default when --min-confidence or a "
        "sampling --seed is given: a seeded run repeats exactly only under it)",
    )
    p.add_argument(
        "--min-confidence",
        type=probability,
        help="the fixed policy: verify only the leading draft tokens the draft gives at least this "
        "probability (the first always); 0 verifies all B-1 (default: 0.2 on a CPU, 0 on a GPU)",
    )


def add_copy_args(p):
    p.add_argument(
        "--copy",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="also copy proposals from the context (prompt lookup): where the last 2-6 tokens occurred "
        "before in prompt + output, the tokens that followed go to the target instead of the draft's "
        "block when they are expected to be accepted further (default: off)",
    )


def policy_of(args) -> str | None:
    """The policy the flags ask for; None: the engine's default (policy.default_policy)."""
    if args.policy == "adaptive" and args.min_confidence is not None:
        raise DFlashError("--min-confidence sets the fixed policy: drop it, or give --policy fixed")
    return args.policy


def add_sampling_args(p):
    p.add_argument(
        "--temperature",
        "--temp",
        type=temperature,
        default=0.0,
        help="0: greedy decoding (default); above 0: speculative sampling, which draws from the "
        "target's own distribution (the same as plain sampling), still accepting draft blocks",
    )
    p.add_argument("--top-p", type=top_p, default=1.0, help="nucleus sampling with temperature > 0 (default 1: off)")
    p.add_argument("--seed", type=int, help="random seed for sampling: the same seed, the same output on one machine")


def sampling_of(args):
    """The Sampling the flags ask for, or None for greedy decoding."""
    from ..engine.sampling import Sampling

    if args.temperature == 0:
        if args.top_p < 1 or args.seed is not None:
            raise DFlashError("--top-p and --seed apply to sampling: give --temperature above 0 too")
        return None
    return Sampling(args.temperature, args.top_p, args.seed)  # no seed: MLX's random state, as mlx-lm


def _device_name() -> str:
    """Where a training ran, for its record and model card."""
    import os

    from .. import backend

    if backend.on_cpu():
        return f"a {os.cpu_count()}-core CPU (MLX)"
    return "a GPU (MLX Metal)" if backend.mx.metal.is_available() else "a GPU (MLX CUDA)"


def save_training_record(out, command: str, summary: dict, card) -> None:
    """training.json + the model card README.md, with the exact command that made them."""
    import json
    from pathlib import Path

    argv = sys.argv[1:]  # this command's own arguments, through the CLI or run as a module
    argv = argv[argv.index(command) + 1 :] if command in argv else argv
    summary["command"] = f"python -m dflash_core {command} " + " ".join(argv)
    summary["device"] = _device_name()
    out = Path(out)
    (out / "training.json").write_text(json.dumps(summary, indent=1))
    (out / "README.md").write_text(card(summary))


def run_standalone(module: str, add_arguments, run) -> None:
    """`python -m dflash_core.commands.X`: one command without the CLI's others (e.g. on a bare
    GPU machine that lacks the server's packages)."""
    from ..cli import Parser, main

    parser = Parser(prog=f"python -m {module}")
    add_arguments(parser)
    parser.set_defaults(func=run)
    sys.exit(main(parser=parser))
