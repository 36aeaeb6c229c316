"""--draft-quant: the draft's linear layers quantized with MLX at load. The draft only proposes and
the target checks every token, so the output stays plain greedy decoding's, token for token; the
draft's weights take less memory; layers MLX cannot quantize keep full precision and are named."""

import json

import mlx.nn as nn
import pytest
from code_prompts import PROMPTS
from ui_pair import pin_draft

from dflash_core.cli import main
from dflash_core.models.loading import load_pair
from dflash_core.training.random_models import FAMILIES, write_draft, write_target


def lossless(pair, prompt=PROMPTS[0], max_tokens=32, block_size=8):
    ids = pair.encode(prompt, chat_template=False)
    *_, base = pair.baseline(ids, max_tokens)
    *_, ours = pair.dflash(ids, max_tokens, block_size, policy="fixed")  # every cycle drafts
    assert ours.tokens == base.tokens
    return ours


def linear_layers(draft) -> dict:
    return {name: type(m) for name, m in draft.named_modules() if isinstance(m, (nn.Linear, nn.QuantizedLinear))}


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("bits", [4, 8])
def test_a_quantized_draft_is_lossless_and_smaller(random_dirs, random_pairs, family, bits):
    t, d = random_dirs[family]
    pair = load_pair(str(t), str(d), draft_quant=bits)
    full = random_pairs[family]
    assert pair.draft_quant == bits and pair.draft_full_precision == []  # the random shapes all quantize
    assert set(linear_layers(pair.draft).values()) == {nn.QuantizedLinear}
    assert pair.memory()["draft"] < full.memory()["draft"] * (0.25 if bits == 4 else 0.4)  # float32 on a CPU
    assert pair.memory()["target"] == full.memory()["target"]
    lossless(pair)


@pytest.fixture(scope="module")
def pinned(tmp_path_factory):
    """A random qwen3 pair whose draft always proposes the token the target falls into repeating,
    so that proposals are really accepted (a random draft's almost never are)."""
    root = tmp_path_factory.mktemp("pinned")
    target = write_target(root / "target", "qwen3", seed=3)
    draft = write_draft(root / "draft", target, layers=1, seed=4)
    pin_draft(target, draft, PROMPTS[0], 48)
    return str(target), str(draft)


@pytest.mark.slow
def test_a_quantized_draft_that_is_accepted_stays_lossless(pinned):
    full = lossless(load_pair(*pinned), max_tokens=48)
    quantized = lossless(load_pair(*pinned, draft_quant=4), max_tokens=48)
    assert quantized.accepted_tokens > 0 and full.accepted_tokens > 0
    assert quantized.tokens == full.tokens


def test_layers_mlx_cannot_quantize_keep_full_precision(tmp_path):
    """Hidden size 96 is no multiple of the group size 64: only down_proj (input 192) quantizes."""
    target = write_target(tmp_path / "t", "qwen3", seed=2, hidden=96, head_dim=24)
    draft = write_draft(tmp_path / "d", target, layers=1, seed=3)
    pair = load_pair(str(target), str(draft), draft_quant=4)
    layers = linear_layers(pair.draft)
    assert [n for n, kind in layers.items() if kind is nn.QuantizedLinear] == ["layers.0.mlp.down_proj"]
    assert sorted(pair.draft_full_precision) == sorted(n for n in layers if n != "layers.0.mlp.down_proj")
    assert "stay full precision" in pair.draft_precision() and "layers.0.self_attn.q_proj" in pair.draft_precision()
    lossless(pair)


def test_cli_draft_quant_reports_memory_and_tokens_per_cycle(pinned, capsys):
    t, d = pinned
    args = [
        "generate",
        "--model",
        t,
        "--draft",
        d,
        "--prompt",
        PROMPTS[0],
        "--max-tokens",
        "32",
        "--no-chat-template",
        "--json",
        "--compare-baseline",
        "--policy",
        "fixed",  # every cycle drafts: tokens per cycle measure the draft
    ]
    assert main(args) == 0
    full = json.loads(capsys.readouterr().out)
    assert main([*args, "--draft-quant", "4"]) == 0
    captured = capsys.readouterr()
    quantized = json.loads(captured.out)
    assert "draft: 4-bit linear layers" in captured.err
    assert quantized["identical"] is True and quantized["tokens"] == full["tokens"]
    assert quantized["draft_quant"] == 4 and full["draft_quant"] is None
    assert quantized["memory_mb"]["draft"] < full["memory_mb"]["draft"] / 4
    assert quantized["stats"]["tokens_per_cycle"] > 1


def test_cli_draft_quant_takes_4_or_8(random_dirs, capsys):
    t, d = map(str, random_dirs["qwen3"])
    assert main(["generate", "--model", t, "--draft", d, "--prompt", "x", "--draft-quant", "3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "argument --draft-quant: invalid choice: 3" in err[0]
