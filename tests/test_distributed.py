"""DFlash across processes: `mlx.launch -n 2 --backend ring` on this machine's loopback, two CPU
processes, the target split by mlx-lm's own shard(), the draft whole on each, the same cycle on
both. Every group runs under a time limit and is killed whole (its process group) past it.

This file is also what the groups of the engine tests run on each rank: `python
tests/test_distributed.py OUT_DIR FAMILY TARGET DRAFT [FAMILY TARGET DRAFT ...]` writes
OUT_DIR/rank<r>.json."""

import contextlib
import io
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LAUNCH = shutil.which("mlx.launch", path=str(Path(sys.executable).parent)) or shutil.which("mlx.launch")
pytestmark = [
    pytest.mark.skipif(LAUNCH is None, reason="mlx.launch (part of the mlx package) is not installed"),
    pytest.mark.slow,
]

# tokens: at block size 16 the partly-right draft needs 136 to make every accepted length occur,
# at 5 it needs 15; the draft model's own proposals (almost all rejected by a random target) run DRAFTED
LONG, SHORT, DRAFTED = 150, 40, 12
PROMPT = "class Stack:\n    def push(self, item):"  # no family's random target ends it before LONG tokens


# --- what each rank runs -------------------------------------------------------------------------


def _exercise(pair) -> dict:
    """On every rank: the sharded target's plain greedy tokens, DFlash's with the draft model,
    oracle and partly-right proposals at block sizes 16 and 5, what the caches hold, and rollback
    against feeding only the kept tokens."""
    import mlx.core as mx
    import numpy as np
    from test_engine import _corrupting_draft

    from dflash_core.engine import OracleDraft
    from dflash_core.engine.events import CycleEvent
    from dflash_core.engine.target import Target

    ids = pair.encode(PROMPT, chat_template=False)
    base = list(pair.baseline(ids, LONG))[-1].tokens
    runs = []
    for block_size, n in ((16, LONG), (5, SHORT)):
        rng = random.Random(block_size)
        drafts = {
            "oracle": OracleDraft(len(ids), base),
            "partly": _corrupting_draft(base, len(ids), pair.draft.config.vocab_size, rng, "partly"),
        }
        if block_size == 16:
            drafts["draft model"] = None  # its own proposals, through the taps of the split target
        for name, draft_fn in drafts.items():
            max_tokens = DRAFTED if draft_fn is None else n
            events = list(pair.dflash(ids, max_tokens, block_size, draft_fn=draft_fn, min_confidence=0.0))
            runs.append(
                {
                    "draft": name,
                    "block_size": block_size,
                    "max_tokens": max_tokens,
                    "tokens": events[-1].tokens,
                    "accepted": [ev.accepted_len for ev in events if isinstance(ev, CycleEvent)],
                }
            )

    def held(c) -> list:  # what a cache holds: GatedDeltaNet's conv and recurrent state, or the KV entries
        if hasattr(c, "cache"):
            return list(c.cache)
        return [c.keys[..., : c.offset, :], c.values[..., : c.offset, :]]

    cache = {type(c).__name__: [list(x.shape) for x in held(c)] for c in pair.target.cache}

    rollback = {}
    if pair.target.hybrid:
        block = [int(t) for t in np.random.default_rng(0).integers(0, 400, size=8)]
        for kept in (1, 3, 8):
            rolled, fresh = (Target(pair.model, pair.draft.config.target_layer_ids) for _ in range(2))
            for t, fed in ((rolled, block), (fresh, block[:kept])):
                t.prefill(ids)
                t.verify(fed)
            rolled.rollback(kept=kept, fed=len(block))
            rollback[kept] = max(
                mx.abs(a - b).max().item() if a.shape == b.shape else float("inf")
                for ca, cb in zip(rolled.cache, fresh.cache)
                for a, b in zip(held(ca), held(cb))
            )
    return {
        "baseline": base,
        "runs": runs,
        "cache": cache,
        "rollback": rollback,
        "q_proj": list(pair.target.layers[-1].self_attn.q_proj.weight.shape),
        "draft_fc": list(pair.draft.fc.weight.shape),
    }


def _worker(out_dir: str, *triples: str):
    from dflash_core.cli import main
    from dflash_core.errors import DFlashError
    from dflash_core.models import distributed
    from dflash_core.models.loading import load_pair

    report = {"size": distributed.size(), "rank": distributed.rank(), "families": {}}
    for i in range(0, len(triples), 3):
        family, target, draft = triples[i : i + 3]
        pair = distributed.loaded_everywhere(lambda: load_pair(target, draft))  # noqa: B023 (called here)
        report["families"][family] = _exercise(pair)

    def only_rank_1_fails():
        if distributed.rank() == 1:
            raise DFlashError("the model is missing on this machine")
        return "loaded"

    try:
        report["one_rank_failed"] = distributed.loaded_everywhere(only_rank_1_fails)
    except DFlashError as e:
        report["one_rank_failed"] = f"error: {e}"

    printed = io.StringIO()  # `doctor --json` as the CLI runs it (it silences the ranks other than 0)
    with contextlib.redirect_stdout(printed):
        main(["doctor", "--json"])
    report["doctor"] = printed.getvalue()
    Path(out_dir, f"rank{distributed.rank()}.json").write_text(json.dumps(report))


# --- launching a group, bounded ------------------------------------------------------------------


def _free_port_pair() -> int:
    """A port p with p + 1 free too: the ring's rank r listens on p + r."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        try:
            with socket.create_server(("127.0.0.1", port + 1)):
                return port
        except OSError:
            continue


def _alive(pgid: int) -> list:
    """The processes of a process group that still run (zombies waiting for their reaper are done)."""
    if not Path("/proc").is_dir():
        try:
            os.killpg(pgid, 0)
            return [pgid]
        except ProcessLookupError:
            return []
    alive = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            alive.append(int(stat.parent.name))
    return alive


def _assert_gone(pgid: int):
    deadline = time.monotonic() + 10
    while _alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(pgid), f"processes of the group still run: {_alive(pgid)}"


def start_group(*args: str, probe_threads: bool = False) -> subprocess.Popen:
    """`mlx.launch -n 2 --backend ring -- python ARGS`, in a session of its own so that the whole
    group can be killed. Unless probe_threads, OPENBLAS_NUM_THREADS=1 skips the engines'
    BLAS-thread measurement (seconds per engine on this machine)."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": path}
    if not probe_threads:
        env["OPENBLAS_NUM_THREADS"] = "1"
    cmd = [
        LAUNCH,
        "-n",
        "2",
        "--backend",
        "ring",
        "--starting-port",
        str(_free_port_pair()),
        "--",
        sys.executable,
        *args,
    ]
    return subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )


def finish_group(proc: subprocess.Popen, timeout: float) -> tuple:
    """(stdout, stderr, timed_out): waits up to `timeout` s, then kills the whole group; either way
    no process of it is left."""
    try:
        out, err = proc.communicate(timeout=timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        timed_out = True
    _assert_gone(proc.pid)
    return out, err, timed_out


def run_group(*args: str, timeout: float = 90, **kw) -> tuple:
    out, err, timed_out = finish_group(start_group(*args, **kw), timeout)
    assert not timed_out, f"the group overran {timeout} s and was killed; stderr: {err[-3000:]}"
    return out, err


def errors(err: str) -> list:
    return [line for line in err.splitlines() if line.startswith("error")]


def test_a_group_that_overruns_is_killed_whole():
    proc = start_group("-c", "import time; time.sleep(120)")
    out, err, timed_out = finish_group(proc, timeout=3)
    assert timed_out  # and finish_group found none of its processes left


# --- the engine on a sharded target --------------------------------------------------------------

FAMILIES = ("llama", "qwen3", "qwen3_5", "qwen3_5_moe")


@pytest.fixture(scope="module")
def family_dirs(random_dirs, tmp_path_factory):
    from test_engine import MORE_ARCHITECTURES, write_architecture

    moe = write_architecture(tmp_path_factory.mktemp("moe"), "qwen3_5_moe", MORE_ARCHITECTURES["qwen3_5_moe"])
    return {**random_dirs, "qwen3_5_moe": moe}


@pytest.fixture(scope="module")
def reports(family_dirs, tmp_path_factory):
    """Both ranks' reports of one group that runs _exercise on every family."""
    out = tmp_path_factory.mktemp("ranks")
    triples = [str(x) for f in FAMILIES for x in (f, *family_dirs[f])]
    _, err = run_group(str(Path(__file__)), str(out), *triples, timeout=480)
    assert all((out / f"rank{r}.json").is_file() for r in range(2)), err[-3000:]
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    return ranks, err


def test_both_ranks_run_the_same_cycles(reports):
    (r0, r1), _ = reports
    assert (r0["size"], r0["rank"], r1["rank"]) == (2, 0, 1)
    for family in FAMILIES:
        a, b = r0["families"][family], r1["families"][family]
        assert a["baseline"] == b["baseline"] and a["runs"] == b["runs"], family


@pytest.mark.parametrize("family", FAMILIES)
def test_dflash_equals_greedy_of_the_sharded_target(reports, family):
    """Every draft, block sizes 16 and 5; the oracle and partly-right drafts make every accepted
    length 0 .. B-1 occur."""
    (r0, _), _ = reports
    report = r0["families"][family]
    for run in report["runs"]:
        assert run["tokens"] == report["baseline"][: run["max_tokens"]], (run["draft"], run["block_size"])
        if run["draft"] == "oracle":
            assert all(a == run["block_size"] - 1 for a in run["accepted"][:-1])
    for block_size in (16, 5):
        seen = {a for run in report["runs"] if run["block_size"] == block_size for a in run["accepted"]}
        assert seen == set(range(block_size)), block_size


@pytest.mark.parametrize("family", FAMILIES)
def test_target_is_split_and_draft_is_whole(reports, family_dirs, family):
    """Each rank holds half of the attention heads (KV cache too), of GatedDeltaNet's conv and
    recurrent state; the draft is whole everywhere."""
    from mlx_lm.utils import load_model

    from dflash_core.models.loading import load_draft

    (r0, _), _ = reports
    report = r0["families"][family]
    target_dir, draft_dir = family_dirs[family]
    whole, cfg = load_model(target_dir, lazy=True)
    rows, cols = whole.layers[-1].self_attn.q_proj.weight.shape
    assert report["q_proj"] == [rows // 2, cols]
    assert report["cache"]["KVCache"][0][1] == cfg["num_key_value_heads"] // 2  # keys: (1, heads, length, dim)
    assert report["draft_fc"] == list(load_draft(draft_dir).fc.weight.shape)
    if family.startswith("qwen3_5"):
        conv, state = report["cache"]["ArraysCache"]
        k_dim = cfg["linear_num_key_heads"] * cfg["linear_key_head_dim"]
        v_dim = cfg["linear_num_value_heads"] * cfg["linear_value_head_dim"]
        assert conv[2] == (2 * k_dim + v_dim) // 2  # conv state: (1, kernel - 1, q, k and v channels)
        assert state[1] == cfg["linear_num_value_heads"] // 2


@pytest.mark.parametrize("family", ["qwen3_5", "qwen3_5_moe"])
def test_rollback_on_sharded_caches_equals_feeding_only_the_kept_tokens(reports, family):
    (r0, r1), _ = reports
    for report in (r0, r1):
        rollback = report["families"][family]["rollback"]
        assert sorted(rollback) == ["1", "3", "8"] and max(rollback.values()) < 1e-4, rollback


@pytest.mark.parametrize("family", FAMILIES)
def test_sharded_greedy_against_one_process(reports, family_dirs, family, capsys):
    """Splitting changes the order of float sums, so the sharded target's greedy tokens may part
    from the one-process target's where its top two logits nearly tie: allowed there only, and said."""
    from dflash_core.engine import first_divergence
    from dflash_core.models.loading import load_pair

    (r0, _), _ = reports
    sharded = r0["families"][family]["baseline"]
    pair = load_pair(*map(str, family_dirs[family]))
    ids = pair.encode(PROMPT, chat_template=False)
    alone = list(pair.baseline(ids, LONG))[-1].tokens
    div = first_divergence(pair.model, ids, sharded, alone)
    with capsys.disabled():
        print(
            f"\n{family}: sharded vs one-process greedy: "
            + ("identical" if div is None else f"first divergence at {div.index}, top-2 margin {div.top2_margin:.2e}")
        )
    assert div is None or div.top2_margin < 1e-3, div


def test_a_load_that_fails_on_one_rank_fails_on_every_rank(reports):
    (r0, r1), err = reports
    assert r0["one_rank_failed"].startswith("error: rank 1 of 2 could not load the pair")
    assert r1["one_rank_failed"] == "error: the model is missing on this machine"
    assert "error: rank 1: the model is missing on this machine" in errors(err)


# --- the commands under mlx.launch -------------------------------------------------------------


def test_generate_prints_once_and_is_identical(random_dirs):
    """The issue's must-show command; the BLAS-thread measurement runs too, rank 0's taken by both."""
    target, draft = map(str, random_dirs["qwen3_5"])
    out, err = run_group(
        "-m",
        "dflash_core",
        "generate",
        "--model",
        target,
        "--draft",
        draft,
        "--prompt",
        "def fib(n):",
        "--max-tokens",
        "40",
        "--json",
        "--compare-baseline",
        probe_threads=True,
    )
    lines = out.strip().splitlines()
    assert len(lines) == 1, out  # rank 0 only
    result = json.loads(lines[0])
    assert result["identical"] is True and result["tokens"] == result["baseline"]["tokens"]
    assert len(result["tokens"]) == 40 and err.count("loading ") == 1 and not errors(err)


def test_doctor_shows_the_group(reports):
    (r0, r1), _ = reports
    assert json.loads(r0["doctor"])["group"] == {"size": 2, "rank": 0, "backend": "ring"}
    assert r1["doctor"] == ""  # rank 1 printed nothing


def test_doctor_in_one_process(capsys):
    from dflash_core.cli import main

    assert main(["doctor", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["group"] == {"size": 1, "rank": 0, "backend": None}


def test_a_target_that_does_not_split_is_one_error_line_from_rank_0(tmp_path):
    """Refused before mlx-lm's shard() fails on a shape (or a forward does, later)."""
    from dflash_core.training.random_models import write_draft, write_target

    target = write_target(tmp_path / "t", "llama", heads=6, kv_heads=3, hidden=48)  # 3 KV heads over 2
    draft = write_draft(tmp_path / "d", target)
    out, err = run_group(
        "-m", "dflash_core", "generate", "--model", str(target), "--draft", str(draft), "--prompt", "hi", "--json"
    )
    assert out == "" and errors(err) == [
        "error: the target cannot be split over 2 processes: its "
        "num_key_value_heads 3 must divide by 2; launch a group whose size divides them"
    ]
    assert "Traceback" not in err and "rank 0 exited with code 2" in err


def test_prompt_from_stdin_is_refused_in_a_group(random_dirs, monkeypatch, capsys):
    """mlx.launch never closes its processes' stdin: reading it would wait forever."""
    from dflash_core.cli import main
    from dflash_core.models import distributed

    monkeypatch.setattr(distributed, "size", lambda: 2)
    target, draft = map(str, random_dirs["qwen3"])
    assert main(["generate", "--model", target, "--draft", draft, "--prompt", "-"]) == 2
    assert capsys.readouterr().err == (
        "error: --prompt - reads stdin, which mlx.launch never closes: give the prompt itself (--prompt TEXT)\n"
    )


def test_check_shardable(random_dirs, tmp_path):
    """Which sizes each architecture needs divisible, and mlx-lm's own limits, without a group."""
    from mlx_lm.utils import load_model
    from test_engine import MORE_ARCHITECTURES, write_architecture

    from dflash_core.errors import DFlashError
    from dflash_core.models.distributed import check_shardable

    llama, _ = load_model(random_dirs["llama"][0], lazy=True)  # 4 heads, 2 KV heads, MLP 128
    check_shardable(llama, 2)
    with pytest.raises(DFlashError, match="its num_key_value_heads 2 must divide by 4"):
        check_shardable(llama, 4)
    with pytest.raises(
        DFlashError, match="its num_attention_heads 4, num_key_value_heads 2, intermediate_size 128 must divide by 3"
    ):
        check_shardable(llama, 3)
    qwen3_5, _ = load_model(random_dirs["qwen3_5"][0], lazy=True)  # 2 KV heads: repeated over 4
    with pytest.raises(DFlashError, match="its linear_num_key_heads 2 must divide by 4;"):
        check_shardable(qwen3_5, 4)
    gemma_dir, _ = write_architecture(tmp_path, "gemma3_text", MORE_ARCHITECTURES["gemma3_text"])
    gemma, _ = load_model(gemma_dir, lazy=True)
    with pytest.raises(DFlashError, match="mlx-lm cannot split a 'gemma3_text' target across processes"):
        check_shardable(gemma, 2)


# --- serve under mlx.launch ----------------------------------------------------------------------


def _rank_pid(launcher: int, rank: int) -> int:
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            stat = (environ.parent / "stat").read_text().rsplit(")", 1)[1].split()
            if int(stat[1]) == launcher and f"MLX_RANK={rank}".encode() in environ.read_bytes().split(b"\0"):
                return int(environ.parent.name)
        except OSError:
            continue
    raise AssertionError(f"no rank {rank} under the launcher {launcher}")


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds rank 0's process through /proc")
def test_serve_in_a_group(random_dirs):
    """Rank 0 serves HTTP; the other rank runs every request with it: greedy through DFlash and
    plain decoding give the same text, a stop string ends a run early on both ranks, sampling
    with and without a seed, and the group stays in step throughout (a rank out of step would
    hang the next request). Stopping rank 0 stops the group."""
    import httpx

    target, draft = map(str, random_dirs["qwen3_5"])
    port = _free_port_pair()
    proc = start_group("-m", "dflash_core", "serve", "--model", target, "--draft", draft, "--port", str(port))
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                assert httpx.get(f"{url}/health").status_code == 200
                break
            except httpx.TransportError:
                assert proc.poll() is None and time.monotonic() < deadline, "the server did not come up"
                time.sleep(0.3)

        def complete(**body) -> dict:
            r = httpx.post(f"{url}/v1/completions", json={"prompt": PROMPT, "max_tokens": 20, **body}, timeout=60)
            assert r.status_code == 200, r.text
            return r.json()

        greedy = complete()
        assert greedy["dflash"]["generated_tokens"] == 20
        # the ranks would not agree on the adaptive policy's timed choices: a group runs the fixed one
        assert greedy["dflash"]["policy"] == "fixed" and httpx.get(f"{url}/health").json()["policy"] == "fixed"
        refused = httpx.post(f"{url}/v1/completions", json={"prompt": PROMPT, "dflash_policy": "adaptive"})
        assert refused.status_code == 400 and "split across processes" in refused.json()["error"]["message"]
        text = greedy["choices"][0]["text"]
        assert complete(dflash=False)["choices"][0]["text"] == text
        # a stop string of plain letters, a few characters in (the random model's text has others)
        stop = next(
            text[i : i + 2] for i in range(3, len(text)) if text[i : i + 2].isalpha() and text[i : i + 2].isascii()
        )
        cut = complete(stop=[stop])
        assert cut["choices"][0]["finish_reason"] == "stop" and cut["choices"][0]["text"] == text[: text.index(stop)]
        assert cut["dflash"]["generated_tokens"] < 20  # the engine stopped early, on both ranks
        complete(temperature=1.0, seed=3)
        complete(temperature=1.0)  # no seed: the ranks' random states agree all the same
        assert complete()["choices"][0]["text"] == text  # still in step
        assert 'dflash_requests_total{outcome="stop",path="dflash"} 1.0' in httpx.get(f"{url}/metrics").text
        os.kill(_rank_pid(proc.pid, 0), signal.SIGINT)  # as Ctrl-C: rank 0 stops serving, the other follows
    finally:
        out, err, timed_out = finish_group(proc, timeout=30)
    assert not timed_out and proc.returncode == 0, err[-3000:]
    assert "exited with code" not in err and "Finished server process" in err, err[-3000:]


if __name__ == "__main__":
    _worker(*sys.argv[1:])
