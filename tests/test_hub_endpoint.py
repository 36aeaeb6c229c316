"""The hub path end to end: the real huggingface-hub client, through the command line, the server
and the playground, against a hub on a loopback port (tests/local_hub.py, chosen with HF_ENDPOINT)
that serves random pairs of two families under the registry's own names. Configs before weights,
sizes before the download, progress while it runs, a download cut half way and resumed, the gated
/ not-found / 5xx / no-answer lines, offline with a partial cache, and the pair lossless once
downloaded. No internet: every request goes to 127.0.0.1."""

import json
import os
import shlex
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from cli_run import REPO, dflash_cli
from huggingface_hub import constants
from local_hub import LocalHub
from ui_pair import free_port

from dflash_core.models.hub import HUB_FILES
from dflash_core.models.memory import gb
from dflash_core.models.registry import DRAFTS, GATED, TARGETS
from dflash_core.training.random_models import write_draft, write_target

QWEN_TARGET, QWEN_DRAFT = TARGETS["Qwen3-4B"][0], DRAFTS["Qwen3-4B"]
LLAMA_TARGET, LLAMA_GATED = TARGETS["Llama-3.1-8B-Instruct"]
LLAMA_DRAFT = DRAFTS["Llama-3.1-8B-Instruct"]
WIDE_DRAFT = DRAFTS["Qwen3-8B"]  # served made for a wider target than QWEN_TARGET's
WEIGHTS = "model.safetensors"
PROMPT = "def parse(line):"

pytestmark = pytest.mark.slow  # each test launches the command line, the server or a browser


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Random model directories: a qwen3 and a llama pair, and a draft for a wider qwen3."""
    root = tmp_path_factory.mktemp("endpoint-models")
    qwen = write_target(root / "qwen3", "qwen3", seed=21, model_vocab=8192)  # a few MB: sizes above 0 MB
    # weights of 25 MB: huggingface-hub writes a download in 10 MB chunks, and resumes from the last one
    llama = write_target(root / "llama", "llama", seed=22, model_vocab=49152)
    wide = write_target(root / "wide", "qwen3", seed=23, hidden=96, head_dim=24)
    return {
        QWEN_TARGET: qwen,
        QWEN_DRAFT: write_draft(root / "qwen3-draft", qwen, layers=1, seed=24),
        LLAMA_TARGET: llama,
        LLAMA_GATED: llama,
        LLAMA_DRAFT: write_draft(root / "llama-draft", llama, layers=1, seed=25),
        WIDE_DRAFT: write_draft(root / "wide-draft", wide, layers=1, seed=26),
    }


@pytest.fixture()
def hub(models):
    """The local hub serving every model above under its registry name (Meta's original gated)."""
    with LocalHub() as h:
        for repo, source in models.items():
            h.add_repo(repo, source, gated=repo in GATED)
        yield h


def client_env(endpoint: str, cache, **extra) -> dict:
    """The environment of a user's shell pointed at `endpoint`: online, no token, a cache of its own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(HF_ENDPOINT=endpoint, HF_HOME=str(cache), HF_HUB_DISABLE_TELEMETRY="1", **extra)
    return env


@pytest.fixture()
def env(hub, tmp_path):
    return client_env(hub.url, tmp_path / "hf")


def dflash(*args, env, timeout=240):
    return dflash_cli(*args, env=env, timeout=timeout)


def said(run) -> list:
    """stderr's lines, less the `loading ...` announcement and the progress bars' redraws."""
    lines = [part.strip() for line in run.stderr.splitlines() for part in line.split("\r")]
    return [line for line in lines if line and not line.startswith("loading ")]


def one_error_line(run) -> str:
    """Exit code 2 and exactly one stderr line, the error (no traceback, no retry warnings)."""
    assert run.returncode == 2 and len(said(run)) == 1 and said(run)[0].startswith("error: "), run.stderr
    return said(run)[0]


def started(cmd: list, env: dict, url: str, stderr=subprocess.PIPE, timeout: float = 180) -> subprocess.Popen:
    """The process running cmd, once url answers (it is stopped if it dies or never answers)."""
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=stderr, text=True)
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"{cmd[0]} never answered at {url}: {proc.communicate()[-1] or ''}")
        try:
            urllib.request.urlopen(url, timeout=2)
            return proc
        except OSError:
            time.sleep(0.5)


def listed_size(models, repo) -> int:
    from huggingface_hub.utils import filter_repo_objects

    files = [p.relative_to(models[repo]).as_posix() for p in models[repo].rglob("*") if p.is_file()]
    names = filter_repo_objects(files, allow_patterns=HUB_FILES)
    return sum((models[repo] / name).stat().st_size for name in names)


def resolved_files(hub, repo) -> list:
    """The files of `repo` the client asked the hub for (HEAD or GET of /resolve/)."""
    return sorted(
        {path.split("/resolve/", 1)[1].split("/", 1)[1] for _, path, _ in hub.requested(repo) if "/resolve/" in path}
    )


# --- nothing listening ---------------------------------------------------------------------
@pytest.mark.parametrize(
    "args",
    [("--model", "org/missing"), ("--model", QWEN_TARGET), ("--model", "org/missing", "--draft", "org/missing-draft")],
    ids=["unknown-model", "registry-pair", "hub-draft"],
)
def test_a_hub_where_nothing_listens_is_one_line_within_30_s(tmp_path, args):
    env = client_env(f"http://127.0.0.1:{free_port()}", tmp_path / "hf")
    start = time.monotonic()
    run = dflash("generate", *args, "--prompt", "hi", env=env, timeout=60)
    assert time.monotonic() - start < 30
    line = one_error_line(run)
    if args[1] != "org/missing" or "--draft" in args:  # these reach for the hub
        assert "no connection to the hub (http://127.0.0.1:" in line


# --- downloads -------------------------------------------------------------------------
def test_a_registry_pair_downloads_configs_first_shows_sizes_and_progress_and_runs_lossless(hub, env, models):
    run = dflash(
        "generate",
        "--model",
        QWEN_TARGET,
        "--prompt",
        PROMPT,
        "--max-tokens",
        "24",
        "--compare-baseline",
        "--json",
        env=env,
    )
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    assert out["identical"] is True and out["tokens"] == out["baseline"]["tokens"] and len(out["tokens"]) == 24
    lines = said(run)
    sizes = f"to download: the draft {QWEN_DRAFT}: {gb(listed_size(models, QWEN_DRAFT))}; the target {QWEN_TARGET}: {gb(listed_size(models, QWEN_TARGET))}"
    assert lines[0] == sizes and gb(listed_size(models, QWEN_TARGET)) != "0 MB"
    assert lines.index(f"downloading the draft {QWEN_DRAFT} ...") < lines.index(
        f"downloading the target {QWEN_TARGET} ..."
    )
    # the hub's own progress bars, per file fetched, up to all of them, each saying whose files
    for what, repo, files in (("draft", QWEN_DRAFT, 2), ("target", QWEN_TARGET, 4)):
        bar = f"downloading the {what} {repo}: Fetching {files} files:"
        assert any(line.startswith(f"{bar}   0%") for line in lines) and any(
            line.startswith(f"{bar} 100%") for line in lines
        )
    # in order: both configs (one HEAD to look, then hf_hub_download's HEAD + GET), then the draft's
    # snapshot and weights, then the target's
    order = [(m, path) for m, path, _ in hub.requests]
    config = lambda repo: ("GET", f"/{repo}/resolve/main/config.json")
    weights = lambda repo: next(
        i for i, (m, p) in enumerate(order) if m == "GET" and p == f"/repos/{hub.repos[repo].files[WEIGHTS].sha256}"
    )
    assert (
        order.index(config(QWEN_DRAFT)) < order.index(config(QWEN_TARGET)) < weights(QWEN_DRAFT) < weights(QWEN_TARGET)
    )
    # downloaded once: a second run starts from the cache and asks the hub nothing
    before = len(hub.requests)
    again = dflash("generate", "--model", QWEN_TARGET, "--prompt", PROMPT, "--max-tokens", "8", "--json", env=env)
    assert again.returncode == 0 and len(hub.requests) == before, again.stderr
    assert not any(line.startswith("to download") for line in said(again))


def test_a_download_cut_half_way_resumes_with_a_range_request(hub, env, models):
    """The llama pair; the target's weights drop after half the bytes: huggingface-hub asks the
    CDN again from the last chunk it wrote (Range), and the pair runs lossless on the joined file."""
    hub.fault(LLAMA_TARGET, "cut", file=WEIGHTS, times=1)
    run = dflash(
        "generate",
        "--model",
        LLAMA_TARGET,
        "--prompt",
        PROMPT,
        "--max-tokens",
        "24",
        "--compare-baseline",
        "--json",
        "--no-chat-template",
        env=env,
    )
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["identical"] is True
    blob = hub.repos[LLAMA_TARGET].files[WEIGHTS]
    gets = [rng for m, path, rng in hub.requested(LLAMA_TARGET, "GET") if path == f"/repos/{blob.sha256}"]
    written = len(blob.data) // 2 // constants.DOWNLOAD_CHUNK_SIZE * constants.DOWNLOAD_CHUNK_SIZE
    assert written > 0 and gets == [None, f"bytes={written}-"]  # the whole file, then from its last written chunk
    assert "Trying to resume download" in run.stderr


def test_a_partial_cache_offline_is_one_line_and_completes_online(hub, env, models):
    """The target's weights fail (500 from the CDN) after the draft is in: one line; offline the
    partial cache is one line naming `hf download`; online again it completes from where it was."""
    hub.fault(QWEN_TARGET, "500", file=WEIGHTS, times=1)
    first = dflash("generate", "--model", QWEN_TARGET, "--prompt", "hi", env=env)
    assert first.returncode == 2 and [line for line in said(first) if line.startswith("error:")] == [
        f"error: could not download target '{QWEN_TARGET}': the hub ({hub.url}) answered HTTP 500; try again later"
    ], first.stderr
    assert "Traceback" not in first.stderr
    offline = dflash("generate", "--model", QWEN_TARGET, "--prompt", "hi", env={**env, "HF_HUB_OFFLINE": "1"})
    assert one_error_line(offline) == (
        f"error: target '{QWEN_TARGET}' is only partly in the Hugging Face cache and HF_HUB_OFFLINE=1 is set; "
        f"run `hf download {QWEN_TARGET}` online to complete it, or unset HF_HUB_OFFLINE"
    )
    draft_gets = len(hub.requested(QWEN_DRAFT, "GET"))
    done = dflash(
        "generate",
        "--model",
        QWEN_TARGET,
        "--prompt",
        PROMPT,
        "--max-tokens",
        "16",
        "--compare-baseline",
        "--json",
        env=env,
    )
    assert done.returncode == 0 and json.loads(done.stdout)["identical"] is True, done.stderr
    assert len(hub.requested(QWEN_DRAFT, "GET")) == draft_gets  # the draft was not fetched again
    assert (
        said(done)[0] == f"to download: the target {QWEN_TARGET}: {gb(listed_size(models, QWEN_TARGET))}"
    )  # the draft is in


# --- one line per failure --------------------------------------------------------------
def test_an_unmatched_draft_is_refused_from_the_configs_alone(hub, env):
    run = dflash("generate", "--model", QWEN_TARGET, "--draft", WIDE_DRAFT, "--prompt", "hi", env=env)
    line = one_error_line(run)
    assert "draft hidden_size 96 != target hidden size 64" in line and "dflash models" in line
    assert resolved_files(hub, WIDE_DRAFT) == ["config.json"] and resolved_files(hub, QWEN_TARGET) == ["config.json"]
    assert not [r for r in hub.requests if "/tree/" in r[1] or r[1].startswith("/repos/")]  # no listing, no weights


@pytest.mark.parametrize(
    "args, expected",
    [
        (
            ("--model", LLAMA_GATED),
            f"error: target '{LLAMA_GATED}' is gated: accept its license on huggingface.co and log in with "
            "`hf auth login`, or use an mlx-community conversion (`dflash models` lists them)",
        ),
        (
            ("--model", QWEN_TARGET, "--draft", "z-lab/no-such-draft"),
            "error: draft 'z-lab/no-such-draft' is not on the Hugging Face hub (or is private); check the name",
        ),
        (
            ("--model", TARGETS["Qwen3-8B"][0]),  # its draft is served, the target is not
            f"error: target '{TARGETS['Qwen3-8B'][0]}' is not on the Hugging Face hub (or is private); check the name",
        ),
    ],
    ids=["gated", "missing-draft", "missing-target"],
)
def test_gated_and_missing_repositories_are_one_line(hub, env, args, expected):
    assert one_error_line(dflash("generate", *args, "--prompt", "hi", env=env)) == expected


def test_a_repository_without_a_config_is_one_line(hub, env, models, tmp_path):
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / WEIGHTS).write_bytes((models[QWEN_DRAFT] / WEIGHTS).read_bytes())
    hub.add_repo("org/bare-draft", bare)
    run = dflash("generate", "--model", QWEN_TARGET, "--draft", "org/bare-draft", "--prompt", "hi", env=env)
    assert (
        one_error_line(run) == "error: draft 'org/bare-draft' has no config.json on the hub; is it a model repository?"
    )


@pytest.mark.parametrize("kind", ["500", "hang"])
def test_a_failing_or_silent_hub_is_one_line_without_retries(hub, tmp_path, kind):
    """A 5xx or no answer for the draft's config: one line at once (huggingface-hub alone retries
    five times with backoff, ~25 s of warnings, before it gives up)."""
    hub.fault(QWEN_DRAFT, kind)
    env = client_env(hub.url, tmp_path / "hf", HF_HUB_ETAG_TIMEOUT="2")
    start = time.monotonic()
    line = one_error_line(dflash("generate", "--model", QWEN_TARGET, "--prompt", "hi", env=env))
    assert time.monotonic() - start < 15
    answer = "answered HTTP 500; try again later" if kind == "500" else "did not answer in time; try again later"
    assert line == f"error: could not download draft '{QWEN_DRAFT}': the hub ({hub.url}) {answer}"
    heads = [r for r in hub.requested(QWEN_DRAFT) if r[0] == "HEAD"]
    assert len(heads) == 1  # no retries


# --- sizes before anything is downloaded -------------------------------------------------
def test_models_lists_the_hubs_sizes_without_downloading(hub, env, models):
    run = dflash("models", "--json", env=env)
    assert run.returncode == 0, run.stderr
    rows = {r["target"]: r for r in json.loads(run.stdout)}
    qwen, llama = rows[QWEN_TARGET], rows[LLAMA_TARGET]
    assert qwen["target_size"] == {
        "repo": QWEN_TARGET,
        "total": listed_size(models, QWEN_TARGET),
        "to_download": listed_size(models, QWEN_TARGET),
        "source": "hub",
    }
    assert qwen["draft_size"]["total"] == listed_size(models, QWEN_DRAFT)
    assert llama["target_size"]["total"] == listed_size(models, LLAMA_TARGET)
    assert rows[TARGETS["Qwen3-8B"][0]]["target_size"]["total"] is None  # not served: unknown, not guessed
    assert not [r for r in hub.requests if "/resolve/" in r[1] or r[1].startswith("/repos/")]  # listings only


# --- the README's "On your Mac" commands -------------------------------------------------
def test_the_readmes_mac_commands_run_against_the_hub(hub, env):
    """doctor, models, generate --compare-baseline, generate with thinking on and a 4-bit draft
    (the README's own lines, the registry pair its names)."""
    readme = (REPO / "README.md").read_text()
    section = readme.split("## On your Mac", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    commands = [line.split("#")[0].strip() for line in section.replace("\\\n", " ").splitlines()]
    generate = [c for c in commands if c.startswith("dflash generate")]
    assert "dflash doctor" in commands and "dflash models" in commands and len(generate) == 2
    for command in ["dflash doctor", "dflash models", *generate]:
        args = shlex.split(command)[1:] + (["--max-tokens", "12"] if command.startswith("dflash generate") else [])
        run = dflash(*args, env=env)
        assert run.returncode == 0, (command, run.stderr)
        if "--compare-baseline" in args:
            assert "output identical]" in run.stderr
    assert QWEN_TARGET in section


# --- the server ------------------------------------------------------------------------
def test_serve_downloads_a_hub_pair_and_answers_as_plain_decoding(hub, env):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    serve = [
        sys.executable,
        "-m",
        "dflash_core",
        "serve",
        "--model",
        QWEN_TARGET,
        "--port",
        str(port),
        "--no-playground",
    ]
    proc = started(serve, env, f"{url}/health")
    try:

        def complete(dflash_on: bool) -> str:
            body = {"model": QWEN_TARGET, "prompt": PROMPT, "max_tokens": 16, "temperature": 0, "dflash": dflash_on}
            req = urllib.request.Request(
                f"{url}/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
            )
            return json.loads(urllib.request.urlopen(req, timeout=120).read())["choices"][0]["text"]

        assert complete(True) == complete(False)
        assert hub.requested(QWEN_TARGET, "GET") and hub.requested(QWEN_DRAFT, "GET")
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    assert f"to download: the draft {QWEN_DRAFT}" in err


# --- the playground --------------------------------------------------------------------
def test_the_playground_downloads_a_hub_pair_with_sizes_and_progress_and_shows_hub_errors(hub, env):
    """`dflash-playground --allow-downloads` in headless Chromium: a registry pair shows its sizes
    and the Download button, downloads with the hub's progress on the page, then loads; a gated
    and a missing repository are the page's error panel."""
    from playwright.sync_api import expect, sync_playwright

    from dflash_core.ui import headless

    hub.repos[LLAMA_TARGET].gated = True  # the mlx-community conversion, gated here for the test
    hub.fault(QWEN_TARGET, "slow", file=WEIGHTS, seconds=6)  # a download long enough to watch
    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    playground = [str(Path(sys.executable).parent / "dflash-playground"), "--model", "stdlib-hybrid"]
    proc = started(playground + ["--allow-downloads", "--port", str(port), "--no-browser"], env, url, subprocess.STDOUT)
    try:
        with sync_playwright() as p:
            browser = headless.launch(p)
            page = browser.new_page(viewport={"width": 1440, "height": 1000})
            page.goto(url)
            info, error = page.locator("#model-info"), page.locator("#model-info .error-panel")

            def pick(label):
                page.locator("#model input").click()
                page.get_by_role("option", name=label).click()

            pick("Qwen3-4B · 4-bit MLX (hub download)")
            expect(info).to_contain_text(f"{QWEN_TARGET} + {QWEN_DRAFT} is not downloaded yet", timeout=60_000)
            expect(info).to_contain_text(f"the target {QWEN_TARGET}: 5 MB")  # sizes before the download
            assert resolved_files(hub, QWEN_TARGET) == ["config.json"]  # its listing and config, no weights
            assert not [path for _, path, _ in hub.requested(QWEN_TARGET) if path.startswith("/repos/")]
            page.locator("#download").click()
            expect(page.get_by_text(f"downloading the target {QWEN_TARGET}")).to_be_visible(timeout=60_000)
            expect(info).to_contain_text(f"{QWEN_TARGET} + {QWEN_DRAFT}: target 4 layers", timeout=120_000)
            expect(page.locator("#download")).to_be_hidden()

            pick("Llama-3.1-8B-Instruct · 4-bit MLX (hub download)")
            expect(error).to_contain_text(f"target '{LLAMA_TARGET}' is gated", timeout=60_000)
            pick("Qwen3-8B · 4-bit MLX (hub download)")
            expect(error).to_contain_text("is not on the Hugging Face hub", timeout=60_000)
            browser.close()
    finally:
        proc.terminate()
        proc.communicate(timeout=30)
