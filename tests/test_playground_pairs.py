"""The Mac user's path on the page and the command line: one chat-template default everywhere, a
thinking switch where the chat template has one, the draft's precision, and a hub pair that shows
its size and asks before it downloads (through the real huggingface-hub, offline, from a cache
laid out as the hub writes it)."""

import json
import shutil

import pytest
from hub_cache import put_repo
from huggingface_hub import constants

from dflash_core.cli import main
from dflash_core.errors import DFlashError
from dflash_core.models.loading import load_pair
from dflash_core.models.registry import DRAFTS
from dflash_core.models.tokenizer import CHAT_TEMPLATE
from dflash_core.serving.worker import default_worker

PROMPT = "def f(x):"
NO_PROGRESS = {"progress": lambda *a, **k: None}


@pytest.fixture(scope="module")
def thinking_dirs(random_dirs, tmp_path_factory):
    """The random qwen3 pair, its target's chat template given a thinking switch as Qwen3's has."""
    t, d = random_dirs["qwen3"]
    t = shutil.copytree(t, tmp_path_factory.mktemp("thinking") / "target")
    cfg = json.loads((t / "tokenizer_config.json").read_text())
    cfg["chat_template"] = CHAT_TEMPLATE.replace(
        "assistant\n{% endif %}", "assistant\n{% if enable_thinking %}<think>{% endif %}{% endif %}"
    )
    (t / "tokenizer_config.json").write_text(json.dumps(cfg))
    return str(t), str(d)


def cli_json(capsys, *argv) -> dict:
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("pair_of", [pytest.param("stdlib-hybrid", marks=pytest.mark.slow), "random-qwen3"])
def test_generate_benchmark_and_the_page_share_one_chat_template_default(pair_of, random_dirs, capsys):
    """The stdlib pair completes code (template off by default), a chat model gets its template:
    the same in generate, benchmark and the page's checkbox."""
    from ui.handlers import Playground
    from ui.models import Catalogue

    model, draft = ("stdlib-hybrid", None) if pair_of == "stdlib-hybrid" else map(str, random_dirs["qwen3"])
    pair = load_pair(model, draft)
    assert pair.chat_default is (pair_of != "stdlib-hybrid") and pair.tokenizer.has_chat_template
    expected = len(pair.encode(PROMPT, chat_template=pair.chat_default))
    assert expected != len(pair.encode(PROMPT, chat_template=not pair.chat_default))
    given = ["--model", model] + (["--draft", draft] if draft else [])
    generated = cli_json(capsys, "generate", *given, "--prompt", PROMPT, "--max-tokens", "2")
    benched = cli_json(capsys, "benchmark", *given, "--prompt", PROMPT, "--max-tokens", "2", "--repeat", "1")
    assert generated["stats"]["prompt_tokens"] == expected
    assert {r["prompt_tokens"] for r in benched["runs"]} == {expected}
    assert benched["config"]["chat_template"] is pair.chat_default
    catalogue = Catalogue(default_worker(), [(model, draft)])
    key = catalogue.default_key()
    assert (
        Playground(catalogue, default_worker(), 64).select_model(key, 16, 32, **NO_PROGRESS)[3].value
        is pair.chat_default
    )


def test_thinking_where_the_template_has_it(thinking_dirs, random_pairs, capsys):
    t, d = thinking_dirs
    pair = load_pair(t, d)
    assert pair.thinking_switch and not random_pairs["qwen3"].thinking_switch
    off = len(pair.encode(PROMPT))
    args = ["benchmark", "--model", t, "--draft", d, "--prompt", PROMPT, "--max-tokens", "2", "--repeat", "1"]
    assert {r["prompt_tokens"] for r in cli_json(capsys, *args)["runs"]} == {off}  # off unless asked for
    thinking = cli_json(capsys, *args, "--chat-template-args", '{"enable_thinking": true}')
    assert {r["prompt_tokens"] for r in thinking["runs"]} == {
        len(pair.encode(PROMPT, template_args={"enable_thinking": True}))
    }
    assert thinking["config"]["template_args"] == {"enable_thinking": True}


@pytest.fixture(scope="module")
def page(thinking_dirs):
    """The playground built (not launched) on the thinking pair: its Playground and components."""
    from ui import build_app

    demo, _ = build_app(*thinking_dirs)
    return demo.playground


def finished_run(play, **settings) -> dict:
    """Press Run with these settings; the run's exported JSON."""
    values = {
        "prompt": PROMPT,
        "key": play.catalogue.default_key(),
        "max_tokens": 24,
        "block_size": 4,
        "chat": True,
        "min_confidence": 0.0,
        **settings,
    }
    frames = list(play.run(**values))
    assert "error-panel" not in str(frames[-1].get(play.ui["status"], "")), frames[-1]
    return json.loads(sorted(play.export_dir.glob("dflash-run-*.json"))[-1].read_text())


@pytest.mark.slow
def test_the_pages_thinking_switch_and_draft_precision(page, thinking_dirs):
    key = page.catalogue.default_key()
    *_, thinking = page.select_model(key, 16, 32, **NO_PROGRESS)
    assert thinking.visible is True  # offered: this template has a thinking mode
    pair = page.catalogue.get(key)
    run = finished_run(page, thinking=True)
    assert run["settings"]["thinking"] is True and pair.decode(run["prompt_ids"]).endswith("<think>")
    assert finished_run(page)["settings"]["thinking"] is False
    run = finished_run(page, draft_quant="4-bit")
    assert run["settings"]["draft_quant"] == 4 and run["lossless"]["verdict"] == "identical"
    info = page.select_model(key, 16, 32, "4-bit", **NO_PROGRESS)[0]
    assert "4-bit linear layers" in info
    assert page.catalogue.get(key, 4).target is pair.target  # only the draft was reloaded


def test_a_hub_pair_shows_its_size_and_downloads_only_when_asked(random_dirs, tmp_path, monkeypatch):
    """A registry pair whose target's weights are not in the cache: picking it loads nothing and
    shows what it will download; Download fetches it (here: the files have arrived in the cache,
    as the hub would put them) and loads it. Offline, Download says what is missing instead."""
    from huggingface_hub import HfApi
    from huggingface_hub.hf_api import ModelInfo

    from ui.handlers import Playground
    from ui.models import Catalogue

    t, d = random_dirs["qwen3"]
    target, draft = "mlx-community/Qwen3-4B-4bit", DRAFTS["Qwen3-4B"]
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    files = put_repo(tmp_path / "hub", target, t, leave_out={"model.safetensors"})
    put_repo(tmp_path / "hub", draft, d)
    catalogue = Catalogue(default_worker(), allow_downloads=True)
    play = Playground(catalogue, default_worker(), 64)

    out = play.select_model(target, 16, 32, **NO_PROGRESS)  # offline: it cannot download
    assert "error-panel" in out[0] and "only partly in the Hugging Face cache" in out[0]

    # online, the hub's file listing gives the size (the hub's answer stood in for: no network in tests)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    listing = [{"rfilename": name, "size": size} for name, size in files.items()]
    monkeypatch.setattr(
        HfApi, "model_info", lambda self, repo, **kw: ModelInfo(id=repo, sha="0" * 40, siblings=listing)
    )
    info, *_, button, _ = play.select_model(target, 16, 32, **NO_PROGRESS)
    assert f"the target {target}" in info and "Press Download" in info and button.visible is True
    assert not catalogue.is_loaded(target)
    with pytest.raises(DFlashError, match="is not downloaded yet .*; press Download to fetch it first"):
        catalogue.get(target)  # what Run says before Download

    put_repo(tmp_path / "hub", target, t)  # the weights arrive in the cache
    info, *_, button, _ = play.download(target, 16, 32, **NO_PROGRESS)
    assert "info-panel" in info and "Press Download" not in info and button.visible is False
    assert catalogue.is_loaded(target)
