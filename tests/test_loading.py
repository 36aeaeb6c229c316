"""The loader and the CLI's answers to bad input: one `error:` line, exit 2, no traceback."""

import json
import os
import shutil

import pytest
from cli_run import dflash_cli
from code_prompts import PROMPTS
from mlx_lm import stream_generate
from mlx_lm.sample_utils import make_sampler

from dflash_core.cli import main
from dflash_core.models.loading import load_pair
from dflash_core.training.random_models import FAMILIES, write_draft, write_pair


def cli_error(capsys, *argv):
    code = main(list(argv))
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, err
    assert err[-1].startswith("error: ") and "Traceback" not in "\n".join(err)
    return err[-1]


def gen_args(target, draft, *extra):
    return [
        "generate",
        "--model",
        str(target),
        "--draft",
        str(draft),
        "--prompt",
        "def f(x):",
        "--max-tokens",
        "8",
        *extra,
    ]


@pytest.fixture()
def pair_copy(random_dirs, tmp_path):
    t, d = random_dirs["qwen3"]
    return shutil.copytree(t, tmp_path / "t"), shutil.copytree(d, tmp_path / "d")


def edit_config(path, **changes):
    cfg = json.loads((path / "config.json").read_text())
    for k, v in changes.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    (path / "config.json").write_text(json.dumps(cfg))


def test_missing_paths(capsys, random_dirs, tmp_path):
    t, d = random_dirs["qwen3"]
    assert "does not exist" in cli_error(capsys, *gen_args(tmp_path / "nope", d))
    assert "does not exist" in cli_error(capsys, *gen_args(t, "./no/such/draft"))
    (tmp_path / "file").write_text("x")
    assert "is a file" in cli_error(capsys, *gen_args(tmp_path / "file", d))


def test_missing_and_corrupt_files(capsys, pair_copy, random_dirs):
    t, d = pair_copy
    good_draft = random_dirs["qwen3"][1]
    (t / "model.safetensors").write_bytes(b"\x00garbage" * 10)
    msg = cli_error(capsys, *gen_args(t, good_draft))
    assert f"{t / 'model.safetensors'}" in msg and "corrupt" in msg
    (d / "model.safetensors").write_bytes(b"\x00garbage" * 10)
    msg = cli_error(capsys, *gen_args(t, d))
    assert f"{d / 'model.safetensors'}" in msg and "corrupt" in msg
    (d / "model.safetensors").unlink()
    assert "no .safetensors" in cli_error(capsys, *gen_args(t, d))
    d = good_draft
    (t / "config.json").write_text("{not json")
    assert "config.json is not valid JSON" in cli_error(capsys, *gen_args(t, d))
    (t / "config.json").unlink()
    assert "has no config.json" in cli_error(capsys, *gen_args(t, d))


def test_target_without_tokenizer(capsys, pair_copy):
    t, d = pair_copy
    (t / "tokenizer.json").unlink()
    assert "tokenizer.json" in cli_error(capsys, *gen_args(t, d))


@pytest.mark.parametrize(
    "change, words",
    [
        ({"hidden_size": 96, "head_dim": 24}, "hidden_size"),
        ({"vocab_size": 1000}, "vocab_size"),
        ({"dflash_config": {"target_layer_ids": [1, 7], "mask_token_id": 3}}, "target_layer_ids [7]"),
        ({"dflash_config": {"target_layer_ids": [2], "mask_token_id": 99999}}, "mask_token_id 99999"),
        ({"dflash_config": None}, "is this a DFlash draft"),
    ],
)
def test_draft_that_does_not_fit(capsys, random_dirs, tmp_path, change, words):
    t, _ = random_dirs["qwen3"]
    if change.get("dflash_config", 0) is None:  # not a DFlash config at all
        edit_config(write_draft(tmp_path / "d", t, layers=1), **change)
    else:  # a consistent draft (weights match its config) made for another target
        write_draft(tmp_path / "d", t, layers=1, config_overrides=change)
    d = tmp_path / "d"
    assert words in cli_error(capsys, *gen_args(t, d))


def test_hub_id_not_cached_offline(capsys, random_dirs, tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    t, _ = random_dirs["qwen3"]
    msg = cli_error(capsys, *gen_args(t, "z-lab/not-cached-draft"))
    assert "not in the Hugging Face cache" in msg and "HF_HUB_OFFLINE" in msg


def test_bad_requests(capsys, random_dirs, tmp_path):
    t, d = random_dirs["llama"]
    base = ["generate", "--model", str(t), "--draft", str(d)]
    assert "prompt is empty" in cli_error(capsys, *base, "--prompt", "  ")
    assert "block size 17" in cli_error(capsys, *base, "--prompt", "x", "--block-size", "17")
    assert "block size 1 " in cli_error(capsys, *base, "--prompt", "x", "--block-size", "1")
    assert "max tokens 0" in cli_error(capsys, *base, "--prompt", "x", "--max-tokens", "0")
    assert "max tokens 99999" in cli_error(capsys, *base, "--prompt", "x", "--max-tokens", "99999")
    assert "not a whole number" in cli_error(capsys, *base, "--prompt", "x", "--max-tokens", "ten")
    small = shutil.copytree(t, tmp_path / "small")
    edit_config(small, max_position_embeddings=64)
    assert "context is 64" in cli_error(
        capsys, "generate", "--model", str(small), "--draft", str(d), "--prompt", "word " * 200
    )


@pytest.mark.parametrize(
    "variant",
    [
        {"mask_token_id": "top"},  # mask id at top level instead of in dflash_config
        {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}, "rope_theta": None},
        {"layer_types": ["sliding_attention", "full_attention"], "sliding_window": 8},
    ],
)
def test_draft_config_variants_load_and_stay_lossless(random_dirs, tmp_path, variant):
    t, _ = random_dirs["qwen3"]
    d = write_draft(tmp_path / "d", t, layers=2)
    cfg = json.loads((d / "config.json").read_text())
    if variant.get("mask_token_id") == "top":
        cfg["mask_token_id"] = cfg["dflash_config"].pop("mask_token_id")
    else:
        for k, v in variant.items():
            cfg.pop(k, None) if v is None else cfg.__setitem__(k, v)
    (d / "config.json").write_text(json.dumps(cfg))
    pair = load_pair(str(t), str(d))
    ids = pair.encode(PROMPTS[0] * 4, chat_template=False)  # longer than the sliding window
    *_, base = pair.baseline(ids, 24)
    *_, ours = pair.dflash(ids, 24, 8)
    assert ours.tokens == base.tokens


def test_chat_template_is_applied(random_pairs):
    pair = random_pairs["qwen3"]
    plain = pair.encode("hello", chat_template=False)
    chat = pair.encode("hello", chat_template=True)
    assert len(chat) > len(plain)
    assert "<|im_start|>assistant" in pair.decode(chat)


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_cli_generate_matches_mlx_lm_greedy(tmp_path, family):
    """The issue's must-show, on unseen random models: the CLI's JSON tokens equal mlx-lm's own
    greedy generation, for block sizes 16 and 5."""
    t, d = write_pair(tmp_path, family, seed=1234)
    pair = load_pair(str(t), str(d))
    prompt_ids = pair.encode("def parse(line):", chat_template=True)
    reference = [
        r.token
        for r in stream_generate(pair.model, pair.tokenizer, prompt_ids, max_tokens=48, sampler=make_sampler(temp=0.0))
    ]
    for block in (16, 5):
        out = dflash_cli(
            "generate",
            *("--model", t, "--draft", d, "--prompt", "def parse(line):", "--max-tokens", 48, "--block-size", block),
            *("--json", "--compare-baseline"),
            env={**os.environ, "HF_HUB_OFFLINE": "1"},
        )
        assert out.returncode == 0, out.stderr
        res = json.loads(out.stdout)  # stdout is exactly one JSON object
        assert res["identical"] is True and res["first_divergence"] is None
        assert res["tokens"] == reference[: len(res["tokens"])] and len(res["tokens"]) == min(48, len(reference))
        assert res["baseline"]["tokens"] == res["tokens"]
        assert res["stats"]["block_size"] == block and res["stats"]["cycles"] > 0


def test_draft_vocabulary_file_loads_or_is_one_error_line(capsys, pair_copy):
    t, d = pair_copy
    vocab = json.loads((d / "config.json").read_text())["vocab_size"]
    (d / "draft_vocab.json").write_text(json.dumps({"tokens": [5, 2, 9]}))
    assert load_pair(str(t), str(d)).draft.config.draft_vocab == (5, 2, 9)
    for bad in ('{"tokens": []}', '{"tokens": [1, "a"]}', json.dumps({"tokens": [vocab]}), "[1, 2]", "{oops"):
        (d / "draft_vocab.json").write_text(bad)
        msg = cli_error(capsys, *gen_args(t, d))
        assert "draft_vocab.json must hold" in msg and "remove it" in msg, bad
