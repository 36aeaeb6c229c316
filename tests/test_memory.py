"""The device's memory: `doctor` shows it and the working set a pair should stay under; a pair above
90 % of that working set is warned about, with the numbers, on the command line and on the page."""

import json
import os

import pytest

from dflash_core.cli import main
from dflash_core.models import memory
from dflash_core.serving.worker import default_worker


def test_doctor_shows_the_devices_memory(capsys):
    m = memory.device_memory()
    if memory.backend.on_cpu():  # the CPU backend reports none: the machine's RAM stands for it
        assert m["memory"] == m["working_set"] == os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert 0 < m["working_set"] <= m["memory"]
    assert main(["doctor", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert (info["memory_bytes"], info["working_set_bytes"], info["working_set_source"]) == (
        m["memory"],
        m["working_set"],
        m["source"],
    )
    assert main(["doctor"]) == 0
    lines = {
        line.split(":", 1)[0].strip(): line.split(":", 1)[1].strip() for line in capsys.readouterr().out.splitlines()
    }
    assert lines["memory"] == memory.gb(m["memory"])
    assert lines["working_set"] == f"{memory.gb(m['working_set'])} ({m['source']})"


@pytest.fixture()
def small_device(monkeypatch):
    """A device whose working set is 1 MB (a random pair takes a few MB in float32)."""
    monkeypatch.setattr(
        memory, "device_memory", lambda: {"memory": 2 << 20, "working_set": 1 << 20, "source": "a test's small device"}
    )


def test_a_pair_near_the_working_set_is_warned_about(random_dirs, random_pairs, small_device, capsys):
    t, d = map(str, random_dirs["qwen3"])
    total = sum(random_pairs["qwen3"].memory().values())
    assert main(["generate", "--model", t, "--draft", d, "--prompt", "x", "--max-tokens", "2", "--json"]) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert warnings == [
        f"warning: the pair {t} + {d} takes {memory.gb(total)}, more than 90% of this device's "
        "working set (1 MB, a test's small device; 2 MB memory in all): it may page out and decode "
        "slowly; a 4-bit target (mlx-community) or --draft-quant 4 needs less"
    ]


def test_a_pair_that_fits_is_not_warned_about(random_dirs, capsys):
    t, d = map(str, random_dirs["qwen3"])
    assert main(["generate", "--model", t, "--draft", d, "--prompt", "x", "--max-tokens", "2", "--json"]) == 0
    assert "warning:" not in capsys.readouterr().err


def test_the_page_shows_the_warning(random_dirs, small_device):
    from ui.handlers import Playground
    from ui.models import Catalogue

    t, d = map(str, random_dirs["qwen3"])
    catalogue = Catalogue(default_worker(), [(t, d)])
    html = Playground(catalogue, default_worker(), 64).select_model(
        catalogue.default_key(), 16, 32, progress=lambda *a, **k: None
    )[0]
    assert "warning-panel" in html and "more than 90% of this device&#x27;s working set (1 MB" in html
