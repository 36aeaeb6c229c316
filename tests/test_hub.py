"""Hub pairs through the real huggingface-hub, offline (HF_HUB_OFFLINE=1), from a Hugging Face cache
laid out as the hub writes it (tests/hub_cache.py) and filled with random models under the
registry's names: resolution order (the draft's files before the target's weights), an unmatched
draft refused before any weights are needed, the sizes `dflash models` lists, the one error line
when a file is missing."""

import json
import shutil

import mlx.core as mx
import pytest
from hub_cache import put_repo
from huggingface_hub import constants

from dflash_core.cli import main
from dflash_core.errors import DFlashError
from dflash_core.models import hub
from dflash_core.models.loading import load_pair
from dflash_core.models.registry import DRAFTS
from dflash_core.training.random_models import write_draft, write_target

TARGET, DRAFT = "mlx-community/Qwen3-4B-4bit", DRAFTS["Qwen3-4B"]
OTHER_DRAFT = DRAFTS["Qwen3-8B"]
WEIGHTS = "model.safetensors"


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Local random models: a target, its draft, and a draft made for a wider target."""
    root = tmp_path_factory.mktemp("hub-models")
    target = write_target(root / "target", "qwen3", seed=5)
    wide = write_target(root / "wide", "qwen3", seed=6, hidden=96, head_dim=24)
    return {
        "target": target,
        "draft": write_draft(root / "draft", target, layers=1, seed=7),
        "other_draft": write_draft(root / "other-draft", wide, layers=1, seed=8),
    }


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    """An empty Hugging Face cache, offline."""
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return tmp_path / "hub"


@pytest.fixture()
def hub_calls(monkeypatch):
    """The loader's hub requests in order: ("config" | "snapshot", repo)."""
    calls = []
    for name in ("config", "snapshot"):
        real = getattr(hub, name)

        def spy(repo, *args, _real=real, _name=name, **kwargs):
            calls.append((_name, repo))
            return _real(repo, *args, **kwargs)

        monkeypatch.setattr(hub, name, spy)
    return calls


def cli_error(capsys, *argv) -> str:
    code = main(list(argv))
    err = [line for line in capsys.readouterr().err.strip().splitlines() if not line.startswith("loading ")]
    assert code == 2 and len(err) == 1 and err[0].startswith("error: "), err  # one line, no traceback
    return err[0]


def test_a_registry_pair_loads_from_the_cache_and_stays_lossless(models, cache, hub_calls):
    put_repo(cache, TARGET, models["target"])
    put_repo(cache, DRAFT, models["draft"])
    said = []
    pair = load_pair(TARGET, log=said.append)  # the draft comes from the registry
    assert pair.name == f"{TARGET} + {DRAFT}" and said == [] and hub_calls == []  # all cached: nothing fetched
    ids = pair.encode("def parse(line):", chat_template=False)
    *_, base = pair.baseline(ids, 24)
    *_, ours = pair.dflash(ids, 24, 8)
    assert ours.tokens == base.tokens and ours.cycles > 0


def test_the_draft_resolves_before_the_target(models, cache, hub_calls):
    """Only configs are cached: the draft's config is read first, then the target's, and the first
    download the loader would need is the draft's, not the target's weights."""
    put_repo(cache, TARGET, models["target"], leave_out={WEIGHTS})
    put_repo(cache, DRAFT, models["draft"], leave_out={WEIGHTS})
    with pytest.raises(DFlashError) as e:
        load_pair(TARGET)
    assert hub_calls == [("config", DRAFT), ("config", TARGET), ("snapshot", DRAFT)]
    assert str(e.value).startswith(f"draft '{DRAFT}' is only partly in the Hugging Face cache")


def test_a_draft_that_does_not_load_stops_before_the_targets_weights(models, cache, hub_calls, tmp_path):
    """The draft's weights are loaded before the target's are fetched: a broken draft is reported
    while the target's weights are still missing."""
    broken = shutil.copytree(models["draft"], tmp_path / "broken")
    weights = dict(mx.load(str(broken / WEIGHTS)))
    weights.pop("norm.weight")
    mx.save_safetensors(str(broken / WEIGHTS), weights)
    put_repo(cache, TARGET, models["target"], leave_out={WEIGHTS})
    put_repo(cache, DRAFT, broken)
    with pytest.raises(DFlashError, match="draft weights in .* do not match its config.json"):
        load_pair(TARGET)
    assert ("snapshot", TARGET) not in hub_calls


def test_an_unmatched_draft_is_one_line_before_any_weights(models, cache, hub_calls, capsys):
    """A draft made for a wider target: refused from the two configs alone (neither repository has
    its weights in the cache, so anything more would fail differently)."""
    put_repo(cache, TARGET, models["target"], leave_out={WEIGHTS})
    put_repo(cache, OTHER_DRAFT, models["other_draft"], leave_out={WEIGHTS})
    msg = cli_error(capsys, "generate", "--model", TARGET, "--draft", OTHER_DRAFT, "--prompt", "hi")
    assert "draft hidden_size 96 != target hidden size 64" in msg and "dflash models" in msg
    assert [call for call, _ in hub_calls] == ["config", "config"]  # no snapshot: nothing large asked for


def _shard(source, out):
    """A copy of a model directory with its weights in two shards and an index, as large models are."""
    out = shutil.copytree(source, out)
    weights = dict(mx.load(str(out / WEIGHTS)))
    (out / WEIGHTS).unlink()
    names = sorted(weights)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for file, keys in shards.items():
        mx.save_safetensors(str(out / file), {k: weights[k] for k in keys})
    index = {"metadata": {}, "weight_map": {k: file for file, keys in shards.items() for k in keys}}
    (out / "model.safetensors.index.json").write_text(json.dumps(index))
    return out


@pytest.mark.parametrize("listing", [True, False], ids=["with-file-listing", "without-file-listing"])
def test_a_missing_shard_offline_is_one_error_line(models, cache, tmp_path, capsys, listing):
    """An interrupted download: one shard of the target is missing. huggingface-hub >= 2 knows from
    its saved file listing; without one, the safetensors index tells. Either way: one line."""
    put_repo(
        cache,
        TARGET,
        _shard(models["target"], tmp_path / "sharded"),
        leave_out={"model-00002-of-00002.safetensors"},
        listing=listing,
    )
    put_repo(cache, DRAFT, models["draft"])
    msg = cli_error(capsys, "generate", "--model", TARGET, "--prompt", "hi")
    assert msg == (
        f"error: target '{TARGET}' is only partly in the Hugging Face cache and HF_HUB_OFFLINE=1 is set; "
        f"run `hf download {TARGET}` online to complete it, or unset HF_HUB_OFFLINE"
    )


def test_models_lists_the_sizes_in_the_cache_offline(models, cache, capsys):
    target_files = put_repo(cache, TARGET, models["target"])
    draft_files = put_repo(cache, DRAFT, models["draft"])
    assert main(["models", "--json"]) == 0
    rows = {r["target"]: r for r in json.loads(capsys.readouterr().out)}
    row = rows[TARGET]
    assert row["draft"] == DRAFT and row["kind"] == "mlx-4bit" and not row["gated"]
    assert row["target_size"] == {
        "repo": TARGET,
        "total": sum(target_files.values()),
        "to_download": 0,
        "source": "cache",
    }
    assert row["draft_size"]["total"] == sum(draft_files.values())
    original = rows["Qwen/Qwen3-4B"]  # not in the cache: unknown offline, never guessed
    assert original["target_size"]["total"] is None and original["draft_size"]["total"] == sum(draft_files.values())
    assert main(["models"]) == 0
    table = capsys.readouterr().out
    line = next(line for line in table.splitlines() if TARGET in line)
    assert line.count("in the cache") == 2
    assert "size unknown offline" in next(line for line in table.splitlines() if "Qwen/Qwen3-4B " in line)


def test_sizes_come_from_the_hubs_listing_minus_the_cache(models, cache, monkeypatch):
    """Online, a size is the listed files this project downloads (no README, no GGUF), and what is
    still to download leaves out what the cache holds. The hub's answer is stood in for: tests
    never use the network."""
    from huggingface_hub import HfApi
    from huggingface_hub.hf_api import ModelInfo

    files = put_repo(cache, TARGET, models["target"], leave_out={WEIGHTS})
    listing = [{"rfilename": name, "size": size} for name, size in files.items()]
    listing += [{"rfilename": "README.md", "size": 10_000}, {"rfilename": "q4.gguf", "size": 10**9}]
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(
        HfApi, "model_info", lambda self, repo, **kw: ModelInfo(id=repo, sha="0" * 40, siblings=listing)
    )
    size = hub.size(TARGET)
    assert size.source == "hub" and size.total == sum(files.values()) and size.to_download == files[WEIGHTS]
