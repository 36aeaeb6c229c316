"""Random targets of every family DFlash serves and random drafts in the public format, written as
model directories: for the tests and for trying the engine on unseen models. Each family keeps
its real models' structure (layer pattern, experts, sinks, sliding windows) at tiny sizes."""

import inspect
import json
import random
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten

from ..engine.draft import DraftConfig, DraftModel
from ..models.tokenizer import EOS, IM_END, MASK, save_tokenizer, train_bpe
from .train_target import build_model, model_config

WINDOW = 8  # the sliding-window families' window: shorter than a test prompt, so their caches wrap
# family -> what its config adds to model_config's (sizes: hidden, layers, intermediate, heads,
# kv_heads, head_dim), after the real checkpoints' configs
FAMILY_CONFIG = {
    "qwen3": lambda size: {},
    "qwen3_5": lambda size: {},
    "llama": lambda size: {},
    # gpt-oss-20b / 120b: MoE in every layer, attention sinks (learned per head), sliding-window
    # and full attention alternating
    "gpt_oss": lambda size: {
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "sliding_window": WINDOW,
        "layer_types": ["sliding_attention", "full_attention"] * (size["layers"] // 2),
    },
    # Qwen3-Coder-30B-A3B: MoE in every layer
    "qwen3_moe": lambda size: {
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "moe_intermediate_size": size["intermediate"] // 2,
        "norm_topk_prob": True,
    },
    # Qwen3-Coder-Next: 3 GatedDeltaNet layers then 1 gated attention layer, MoE with a shared expert
    "qwen3_next": lambda size: {
        "linear_num_value_heads": size["heads"],
        "linear_num_key_heads": max(1, size["heads"] // 2),
        "linear_key_head_dim": size["head_dim"],
        "linear_value_head_dim": size["head_dim"],
        "linear_conv_kernel_dim": 4,
        "full_attention_interval": 4,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "moe_intermediate_size": size["intermediate"] // 2,
        "shared_expert_intermediate_size": size["intermediate"] // 2,
        "norm_topk_prob": True,
        "partial_rotary_factor": 0.25,
    },
    # gemma-4-31B-it: sliding-window layers, then a full one (wider heads, keys as values, partial
    # RoPE), embeddings scaled by sqrt(hidden), soft-capped logits
    "gemma4_text": lambda size: {
        "sliding_window": WINDOW,
        "layer_types": ["sliding_attention"] * (size["layers"] - 1) + ["full_attention"],
        "global_head_dim": 2 * size["head_dim"],
        "attention_k_eq_v": True,
        "num_global_key_value_heads": 1,
        "num_kv_shared_layers": 0,
        "hidden_size_per_layer_input": 0,
        "use_double_wide_mlp": False,
        "final_logit_softcapping": 30.0,
    },
}
FAMILIES = tuple(FAMILY_CONFIG)
# Real models' shapes, for measuring the machinery at scale with random weights (oracle drafts).
SHAPES = {
    "tiny": {},
    "qwen3-4b": dict(
        hidden=2560,
        layers=36,
        intermediate=9728,
        heads=32,
        kv_heads=8,
        head_dim=128,
        model_vocab=151936,
        draft_layers=5,
    ),
}


def _corpus() -> list:
    import collections
    import textwrap  # any stdlib sources do; these are always present

    return [inspect.getsource(m) for m in (collections, json, textwrap)]


def target_config(
    family: str,
    vocab: int,
    eos: list,
    hidden=64,
    layers=4,
    tie=False,
    intermediate=None,
    heads=4,
    kv_heads=2,
    head_dim=None,
) -> dict:
    """Small by default; untied heads, since a tied random model just repeats its input token."""
    intermediate = intermediate or hidden * 2
    cfg = model_config(family, vocab, eos, hidden, layers, heads, kv_heads, intermediate, tie=tie, head_dim=head_dim)
    size = dict(hidden=hidden, layers=layers, intermediate=intermediate, heads=heads, head_dim=cfg["head_dim"])
    return {**cfg, **FAMILY_CONFIG[family](size)}


def write_target(out: Path, family: str, seed: int = 0, vocab_size: int = 512, model_vocab: int = None, **kw) -> Path:
    """model_vocab > the tokenizer's vocabulary gives a real model's embedding size; ids past the
    tokenizer's only come out of the model, never from text."""
    out = Path(out)
    tok = train_bpe(_corpus(), vocab_size)
    ids = save_tokenizer(tok, out)
    vocab = model_vocab or tok.get_vocab_size()
    cfg = target_config(family, vocab, [ids[EOS], ids[IM_END]], **kw)
    mx.random.seed(seed)
    model = build_model(cfg)
    for layer in model.layers:  # attention sinks start at zero: give them weight, as trained ones have
        if "sinks" in layer.get("self_attn", {}):
            layer.self_attn.sinks = mx.random.normal(layer.self_attn.sinks.shape)
    if sum(v.size for _, v in tree_flatten(model.parameters())) > 50e6:
        model.set_dtype(mx.bfloat16)  # real-model shapes: store as real checkpoints do
    mx.save_safetensors(str(out / "model.safetensors"), dict(tree_flatten(model.parameters())))
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    return out


def write_draft(
    out: Path, target_dir: Path, layers: int = 2, block_size: int = 16, seed: int = 1, config_overrides: dict = None
) -> Path:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tcfg = json.loads((Path(target_dir) / "config.json").read_text())
    tok = json.loads((Path(target_dir) / "tokenizer.json").read_text())
    mask_id = next(t["id"] for t in tok["added_tokens"] if t["content"] == MASK)
    d = DraftConfig.for_target(tcfg, layers, mask_id, block_size).to_dict()
    d.update(config_overrides or {})
    mx.random.seed(seed)
    draft = DraftModel(DraftConfig.from_dict(d))
    if sum(v.size for _, v in tree_flatten(draft.parameters())) > 50e6:
        draft.set_dtype(mx.bfloat16)
    mx.save_safetensors(str(out / "model.safetensors"), dict(tree_flatten(draft.parameters())))
    (out / "config.json").write_text(json.dumps(d, indent=2))
    return out


def write_pair(root: Path, family: str, seed: int = 0, shape: str = "tiny"):
    """(target dir, draft dir): a random target of SHAPES[shape] and its draft, written to
    root/{family}-target and root/{family}-draft."""
    shape = dict(SHAPES[shape])
    draft_layers = shape.pop("draft_layers", 2)
    root = Path(root)
    target = write_target(root / f"{family}-target", family, seed=seed, **shape)
    draft = write_draft(root / f"{family}-draft", target, layers=draft_layers, seed=seed + 1)
    return target, draft


def main(argv=None):
    import argparse

    p = argparse.ArgumentParser(
        prog="python -m dflash_core.random_models", description="write a random target + draft pair"
    )
    p.add_argument("--family", choices=FAMILIES, default="qwen3")
    p.add_argument("--out", required=True)
    p.add_argument("--seed", type=int, default=random.randrange(1 << 30))
    p.add_argument("--shape", choices=SHAPES, default="tiny", help="tiny, or a real model's dimensions")
    a = p.parse_args(argv)
    t, d = write_pair(a.out, a.family, a.seed, a.shape)
    print(f"target: {t}\ndraft:  {d}")


if __name__ == "__main__":
    main()
