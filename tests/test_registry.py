"""The draft registry: base-name resolution offline, refusals that list the supported bases, and
the `models` command."""

import json

import pytest

import dflash_core  # noqa: F401  (system BLAS before MLX)
from dflash_core.cli import main
from dflash_core.errors import DFlashError
from dflash_core.models.loading import load_pair
from dflash_core.models.registry import DRAFTS, SHIPPED, draft_for, known_pairs


@pytest.mark.parametrize(
    "model, draft",
    [
        ("Qwen/Qwen3-4B", "z-lab/Qwen3-4B-DFlash-b16"),
        ("Qwen/Qwen3-8B", "z-lab/Qwen3-8B-DFlash-b16"),
        ("mlx-community/Qwen3-4B-4bit", "z-lab/Qwen3-4B-DFlash-b16"),
        ("mlx-community/Qwen3-8B-MLX-8bit", "z-lab/Qwen3-8B-DFlash-b16"),
        ("Qwen/Qwen3.5-9B", "z-lab/Qwen3.5-9B-DFlash"),
        ("mlx-community/Qwen3.5-35B-A3B-4bit", "z-lab/Qwen3.5-35B-A3B-DFlash"),
        ("mlx-community/Qwen3.6-27B-4bit-DWQ", "z-lab/Qwen3.6-27B-DFlash"),
        ("~/models/qwen3.5-4b-bf16/", "z-lab/Qwen3.5-4B-DFlash"),
        ("meta-llama/Llama-3.1-8B-Instruct", "z-lab/LLaMA3.1-8B-Instruct-DFlash-UltraChat"),
        ("mlx-community/Meta-Llama-3.1-8B-Instruct-4bit", "z-lab/LLaMA3.1-8B-Instruct-DFlash-UltraChat"),
        ("openai/gpt-oss-20b", "z-lab/gpt-oss-20b-DFlash"),
        ("mlx-community/gpt-oss-20b-MXFP4-Q8", "z-lab/gpt-oss-20b-DFlash"),
        ("mlx-community/gpt-oss-120b-4bit", "z-lab/gpt-oss-120b-DFlash"),
        ("Qwen/Qwen3-Coder-30B-A3B-Instruct", "z-lab/Qwen3-Coder-30B-A3B-DFlash"),
        ("Qwen/Qwen3-Coder-Next", "z-lab/Qwen3-Coder-Next-DFlash"),
        ("mlx-community/Qwen3.5-122B-A10B-4bit", "z-lab/Qwen3.5-122B-A10B-DFlash"),
        ("google/gemma-4-31B-it", "z-lab/gemma-4-31B-it-DFlash"),
        ("mlx-community/gemma-4-26b-a4b-it-8bit", "z-lab/gemma-4-26B-A4B-it-DFlash"),
    ],
)
def test_known_targets_and_their_quantized_conversions_resolve(model, draft):
    assert draft_for(model) == draft


@pytest.mark.parametrize(
    "model",
    [
        "assets/models/smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf",
        "~/Downloads/smollm2-135m-instruct-q8_0.gguf",
        "HuggingFaceTB/SmolLM2-135M-Instruct",
        "mlx-community/SmolLM2-135M-Instruct-8bit",
    ],
)
def test_copies_of_a_shipped_target_resolve_to_the_shipped_draft(model):
    assert draft_for(model) == str(SHIPPED["smollm2-135m"][1])


def test_every_public_base_resolves_to_itself():
    for base, draft in DRAFTS.items():
        assert draft_for(f"org/{base}") == draft


def test_shipped_pairs_resolve_to_their_draft_directory():
    for name, (_, draft) in SHIPPED.items():
        assert draft_for(name) == str(draft)


@pytest.mark.parametrize(
    "model",
    [
        "Qwen/Qwen3-4B-Instruct-2507",  # a fine-tune: the base's draft was not trained on it
        "Qwen/Qwen3-14B",
        "mistralai/Mistral-7B-v0.1",
        "/some/dir/my-model",
    ],
)
def test_unknown_targets_are_refused_with_the_supported_bases(model):
    with pytest.raises(DFlashError) as e:
        draft_for(model)
    msg = str(e.value)
    assert model in msg and "--draft" in msg
    for base in list(DRAFTS) + list(SHIPPED):
        assert base in msg


def test_loader_refuses_a_target_without_draft(random_dirs):
    target, _ = random_dirs["qwen3"]
    with pytest.raises(DFlashError, match="no known DFlash draft"):
        load_pair(str(target))


def test_every_base_has_a_4bit_mlx_community_target_that_resolves_to_its_draft():
    pairs = [p for p in known_pairs() if p.kind != "shipped"]
    assert (
        {p.base for p in pairs if p.kind == "mlx-4bit"}
        == set(DRAFTS)
        == {p.base for p in pairs if p.kind == "original"}
    )
    for p in pairs:
        assert p.draft == DRAFTS[p.base] and draft_for(p.target) == p.draft
        if p.kind == "mlx-4bit":
            assert p.target.startswith("mlx-community/") and not p.gated
            assert p.target.endswith("-4bit") or "-MXFP4" in p.target  # gpt-oss's experts ship in MXFP4
    assert [p.target for p in pairs if p.gated] == ["meta-llama/Llama-3.1-8B-Instruct"]


def test_models_command_lists_every_pair(capsys, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # sizes from the cache only: no network in tests
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    for p in known_pairs():
        assert p.target in out and p.draft in out
    for name in SHIPPED:
        assert name in out
    assert main(["models", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["base"], r["target"], r["draft"], r["kind"]) for r in rows] == [
        (p.base, p.target, p.draft, p.kind) for p in known_pairs()
    ]


def test_every_pair_names_a_family_dflash_serves_and_unconfirmed_names_are_marked(capsys, monkeypatch):
    from huggingface_hub import constants

    from dflash_core.engine.target import SUPPORTED_ARCHITECTURES
    from dflash_core.models.registry import UNCONFIRMED

    pairs = known_pairs()
    assert all(p.family in SUPPORTED_ARCHITECTURES for p in pairs)
    assert {"gpt_oss", "qwen3_moe", "qwen3_next", "gemma4"} <= {p.family for p in pairs}
    hub_ids = {x for p in pairs if p.kind != "shipped" for x in (p.target, p.draft)}
    assert UNCONFIRMED <= hub_ids  # no stale entry
    for p in pairs:
        assert p.unconfirmed == (p.target in UNCONFIRMED or p.draft in UNCONFIRMED)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    assert main(["models"]) == 0
    lines = capsys.readouterr().out.splitlines()
    for p in pairs:
        (line,) = [row for row in lines if f" {p.target} " in row]
        assert p.family in line and ("name unconfirmed" in line) == p.unconfirmed
        assert "not supported" not in line
    assert main(["models", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert all(r["supported"] for r in rows)
    assert [r["unconfirmed"] for r in rows] == [p.unconfirmed for p in pairs]
