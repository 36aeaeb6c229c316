"""The pairs shipped in assets/models load offline and decode exactly like plain greedy."""
import json
import re
import subprocess
import sys

import mlx.core as mx
import pytest

from dflash_core.loading import ASSETS, SHIPPED, load_pair

MAX_WEIGHTS_MB = 48


def test_shipped_weights_fit_the_budget():
    files = list(ASSETS.rglob("*.safetensors"))
    assert files
    assert sum(f.stat().st_size for f in files) <= MAX_WEIGHTS_MB * 2**20


@pytest.mark.parametrize("name", list(SHIPPED))
def test_shipped_pair_files(name):
    target_dir, draft_dir = SHIPPED[name]
    for d in (target_dir, draft_dir):
        assert (d / "README.md").is_file() and (d / "config.json").is_file()
    tok_cfg = json.loads((target_dir / "tokenizer_config.json").read_text())
    assert tok_cfg["tokenizer_class"] == "PreTrainedTokenizerFast"
    draft_cfg = json.loads((draft_dir / "config.json").read_text())
    assert draft_cfg["architectures"] == ["DFlashDraftModel"]
    names = set(mx.load(str(draft_dir / "model.safetensors")))
    assert all(n.split(".")[0] in {"fc", "hidden_norm", "norm", "layers"} for n in names)
    prompts = json.loads((target_dir / "eval_prompts.json").read_text())
    assert prompts["heldout"] and prompts["train"]


@pytest.mark.parametrize("name", list(SHIPPED))
def test_shipped_pair_is_lossless_and_accepts_drafts(name):
    """Held-out prompts (files the target never saw): DFlash output == plain greedy, and the
    trained draft gets more than one token per cycle (a broken draft or a train/inference
    mismatch gives ~1.0)."""
    pair = load_pair(name)
    prompts = json.loads((SHIPPED[name][0] / "eval_prompts.json").read_text())["heldout"][:3]
    tokens = cycles = 0
    for prompt in prompts:
        ids = pair.encode(prompt)
        *_, ours = pair.dflash(ids, 64)
        *_, ref = pair.baseline(ids, 64)
        assert ours.tokens == ref.tokens
        tokens, cycles = tokens + len(ours.tokens), cycles + ours.cycles
    assert tokens / cycles > 1.2


@pytest.mark.parametrize("name", list(SHIPPED))
def test_chat_reply_continues_the_users_function(name):
    """The chat template drops a message's trailing line break, as the targets' training turns
    did (their BPE puts a line break and the next indent in one token): the reply to a function
    header is the function's indented body. A bare trailing "\n" token asks for a new top-level
    definition instead (a new class or def, the old template's reply)."""
    pair = load_pair(name)
    prompt = 'def parse_header(line):\n    """Split an HTTP header line into a name and a value."""\n'
    ids = pair.encode(prompt)
    assert ids == pair.encode(prompt.rstrip())
    *_, run = pair.baseline(ids, 8)
    assert re.match(r"\n[ \t]+\S", pair.decode(run.tokens))


def test_min_confidence_verifies_fewer_rows_and_stays_lossless():
    """With a threshold the target checks only the draft's confident leading proposals: the
    output is still plain greedy's, and the events account for the shorter verify."""
    pair = load_pair("stdlib-coder")
    prompts = json.loads((SHIPPED["stdlib-coder"][0] / "eval_prompts.json").read_text())["heldout"][:2]
    verified = []
    for prompt in prompts:
        ids = pair.encode(prompt)
        *_, ref = pair.baseline(ids, 96)
        *cycles, ours = pair.dflash(ids, 96, min_confidence=0.4)
        assert ours.tokens == ref.tokens
        for ev in cycles:
            assert 1 <= ev.verified <= 15 and len(ev.posterior) == ev.verified + 1
            assert ev.accepted_len <= ev.verified and ev.kv_trimmed == ev.verified - ev.accepted_len
            assert ev.next_staged == ev.posterior[ev.accepted_len]
        assert ours.drafted_tokens == sum(ev.verified for ev in cycles) and ours.min_confidence == 0.4
        verified += [ev.verified for ev in cycles]
    assert min(verified) < 15 and max(verified) > 1  # truncated by confidence, not always to one


def test_shipped_pairs_load_offline(tmp_path):
    """A fresh interpreter with HF_HUB_OFFLINE=1 and an empty HF cache loads both pairs."""
    code = ("import dflash_core; from dflash_core.loading import load_pair, SHIPPED\n"
            "for n in SHIPPED: p = load_pair(n); print(n, p.target.num_layers, p.target.hybrid)")
    env = {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"), "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "stdlib-coder 16 False" in out.stdout and "stdlib-hybrid 4 True" in out.stdout


def test_a_draft_alone_pairs_with_the_shipped_target(tmp_path):
    """`--draft DIR` without `--model` (a newly trained draft for the shipped target) loads the
    default target with that draft; a draft that does not fit it is one clear error."""
    import shutil

    from dflash_core.errors import DFlashError
    from dflash_core.loading import DEFAULT_PAIR

    target_dir, draft_dir = SHIPPED[DEFAULT_PAIR]
    copy = shutil.copytree(draft_dir, tmp_path / "draft")
    pair = load_pair(None, str(copy))
    assert pair.name == f"{DEFAULT_PAIR} + {copy}"
    assert pair.target.num_layers == json.loads((target_dir / "config.json").read_text())["num_hidden_layers"]
    with pytest.raises(DFlashError):
        load_pair(None, str(SHIPPED["stdlib-hybrid"][1]))
