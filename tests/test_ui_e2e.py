"""The launched playground through gradio_client: a real run, bad input, Stop."""

import json
import re
import threading
import time
from html import unescape

import pytest
from gradio_client import Client
from gradio_client.exceptions import AppError
from ui_pair import MAX_TOKENS, PROMPT

from dflash_core.engine.events import CycleEvent, Divergence, RunSummary, TokenEvent
from dflash_core.serving.worker import default_worker
from ui.runner import Comparison, compare

pytestmark = pytest.mark.slow

OUTPUTS = [
    "status",
    "b_stats",
    "b_out",
    "d_stats",
    "d_out",
    "speedup",
    "lossless",
    "race",
    "plot0",
    "plot1",
    "plot2",
    "plot3",
    "plot4",
    "plot5",
    "slider",
    "inspector",
    "export",
    "state",
]


def run(
    client,
    key,
    prompt=PROMPT,
    max_tokens=MAX_TOKENS,
    block_size=8,  # within every served draft's block (the shipped draft's is 8)
    chat=False,
    min_confidence=0.0,
    temperature=0.0,
    top_p=1.0,
    seed=0,
    policy="adaptive",
    copy=False,
):
    """Press Run (thinking off, the draft as stored): the outputs by name."""
    settings = (prompt, key, max_tokens, block_size, chat, min_confidence, temperature, top_p, seed)
    return dict(zip(OUTPUTS, client.predict(*settings, False, "as stored", policy, copy, api_name="/run")))


def exported(out) -> dict:
    with open(out["export"]["value"] if isinstance(out["export"], dict) else out["export"]) as f:
        return json.load(f)


def visible_text(markup):
    return unescape(re.sub(r"<[^>]+>", "", markup)).replace("↵", "").replace("∅", "")  # marks, not text


@pytest.fixture(scope="module")
def client(served):
    return Client(served[0], verbose=False)


def test_run_shows_both_engines_and_identical_output(served, client):
    out = run(client, served[1], policy="fixed")  # at threshold 0: every proposal verified
    assert "identical" in out["lossless"] and "lossless identical" in out["lossless"]
    assert "tok-accepted" in out["d_out"] and "tok-rejected" in out["d_out"] and "tok-target" in out["d_out"]
    with open(out["export"]["value"] if isinstance(out["export"], dict) else out["export"]) as f:
        exported = json.load(f)
    base, dflash = exported["baseline"], exported["dflash"]
    assert base["summary"]["tokens"] == dflash["summary"]["tokens"]  # lossless, from the events
    assert len(base["summary"]["tokens"]) == MAX_TOKENS and exported["lossless"]["verdict"] == "identical"
    assert [e["token"] for e in base["events"]] == base["summary"]["tokens"]
    assert [t for e in dflash["events"] for t in e["committed"]] == dflash["summary"]["tokens"]
    assert sum(e["accepted_len"] for e in dflash["events"]) == dflash["summary"]["accepted_tokens"] > 0
    # the baseline pane and the DFlash pane's committed tokens show the same text
    committed = re.findall(
        r'<span class="tok tok-(?:target|accepted)[^"]*" title="[^"]*">(.*?)</span>(?=<span class="(?:tok|cycle)|</span>)',
        out["d_out"],
        flags=re.DOTALL,
    )
    assert visible_text("".join(committed)) == visible_text(out["b_out"])
    assert "decode speedup" in out["speedup"] and "Cycle" in out["inspector"]
    assert out["slider"]["maximum"] == len(dflash["events"]) - 1
    # every proposal verified (min confidence 0), near the end as many as the budget leaves room for
    done = 0
    for e in dflash["events"]:
        assert e["verified"] == min(len(e["drafted"]), MAX_TOKENS - done - 1)
        done += len(e["committed"])
    assert exported["settings"]["min_confidence"] == 0.0
    assert exported["settings"]["policy"] == "fixed" and "plain-step" not in out["d_out"]


def test_the_adaptive_policy_shows_its_decisions_and_stays_lossless(served, client):
    """The page's default policy: where it stepped plainly, the pane and the stats say so; the
    inspector, the policy chart and the export carry its decisions; the output is plain greedy's."""
    out = run(client, served[1], min_confidence=1.0)  # the threshold is the fixed policy's: ignored
    run_json = exported(out)
    assert run_json["lossless"]["verdict"] == "identical" and "lossless identical" in out["lossless"]
    summary, events = run_json["dflash"]["summary"], run_json["dflash"]["events"]
    assert run_json["settings"]["policy"] == summary["policy"] == "adaptive"
    assert run_json["settings"]["min_confidence"] is None
    plain = [e for e in events if not e["drafted"]]
    assert summary["plain_steps"] == len(plain) and sum(summary["verified_rows"]) == len(events)
    assert all(e["decision"]["plain_step"] == (not e["drafted"]) for e in events)
    assert all(e["decision"]["reason"] for e in events)
    assert out["d_out"].count("cycle plain-step") == len(plain)
    assert f"{len(plain)} of {len(events)}" in out["d_stats"] and "plain steps" in out["d_stats"]
    assert f"adaptive policy: {len(plain)} plain step" in out["status"]
    assert "policy's decision" in out["inspector"]
    chart = json.loads(out["plot5"]["plot"])  # the policy chart: one bar per cycle, its v
    assert "verified rows and cost per cycle" in chart["layout"]["title"]["text"]
    bars = next(t for t in chart["data"] if t["name"] == "verified")
    assert bars["y"] == [e["verified"] for e in events]


def test_copied_proposals_show_apart_and_the_output_stays_lossless(served, client):
    """The copy switch: a prompt that repeats itself, so that the reply's last tokens occur in the
    context; the pane marks copied proposals, the inspector of a copied cycle says where from, and
    the export records the setting and each cycle's source."""
    line = "The quick brown fox jumps over the lazy dog. "
    out = run(client, served[1], prompt=line * 3 + "The quick brown", copy=True)
    run_json = exported(out)
    assert run_json["lossless"]["verdict"] == "identical" and run_json["settings"]["copy"] is True
    events = run_json["dflash"]["events"]
    copied = [i for i, e in enumerate(events) if e["copied_from"] is not None]
    assert copied and run_json["dflash"]["summary"]["copied_cycles"] == len(copied)
    assert "tok-copied" in out["d_out"] and "copied from context position" in out["d_out"]
    assert out["d_out"].count("tok-copied") >= sum(events[i]["accepted_len"] for i in copied)
    without = exported(run(client, served[1], prompt=line * 3 + "The quick brown"))
    assert without["settings"]["copy"] is False
    assert all(e["copied_from"] is None for e in without["dflash"]["events"])
    assert without["dflash"]["summary"]["tokens"] == run_json["dflash"]["summary"]["tokens"]


def test_sampling_run_says_same_distribution_and_shows_the_draws(served, client):
    """Temperature > 0: plain sampling against speculative sampling, seeded alike; the verdict
    says what is true, the inspector and tooltips show p, q and the draws, the seed repeats."""
    # the fixed policy: the adaptive one's choices follow measured time, so a seed need not repeat
    out = run(client, served[1], temperature=0.9, top_p=0.95, seed=5, policy="fixed")
    assert "lossless sampled" in out["lossless"] and "same distribution" in out["lossless"]
    run_json = exported(out)
    assert run_json["settings"]["temperature"] == 0.9 and run_json["settings"]["seed"] == 5
    assert run_json["lossless"]["verdict"] == "sampled"
    cycles = run_json["dflash"]["events"]
    assert all(len(c["draws"]["u"]) == min(c["accepted_len"] + 1, c["verified"]) for c in cycles)
    assert run_json["baseline"]["summary"]["engine"] == "sampling"
    assert "draw u" in out["inspector"] and "p/q" in out["d_out"]
    again = exported(run(client, served[1], temperature=0.9, top_p=0.95, seed=5, policy="fixed"))
    assert again["dflash"]["summary"]["tokens"] == run_json["dflash"]["summary"]["tokens"]
    assert again["baseline"]["summary"]["tokens"] == run_json["baseline"]["summary"]["tokens"]


def test_eight_visitors_at_once_each_get_what_a_solo_run_gives(served):
    """Eight gradio clients (eight browser sessions) press Run at the same moment, on two prompts:
    the runs queue on the one MLX worker and each gets exactly its prompt's solo output."""
    from concurrent.futures import ThreadPoolExecutor

    prompts = [PROMPT, "def merge_sorted(a, b):\n"]

    def outputs(prompt):
        run_json = exported(run(Client(served[0], verbose=False), served[1], prompt=prompt))
        assert run_json["lossless"]["verdict"] == "identical"
        return run_json["baseline"]["summary"]["tokens"], run_json["dflash"]["summary"]["tokens"]

    solo = [outputs(p) for p in prompts]
    assert solo[0] != solo[1]
    with ThreadPoolExecutor(8) as pool:
        together = list(pool.map(lambda i: outputs(prompts[i % 2]), range(8)))
    assert together == [solo[i % 2] for i in range(8)]


def test_verify_threshold_leaves_unsure_guesses_unverified_and_output_identical(served, client):
    """At threshold 1 the target checks only the first guess of every cycle: the rest of each
    block shows as unverified, and the output is still plain greedy's."""
    out = run(client, served[1], min_confidence=1.0, policy="fixed")
    assert "lossless identical" in out["lossless"] and "tok-unverified" in out["d_out"]
    with open(out["export"]["value"] if isinstance(out["export"], dict) else out["export"]) as f:
        exported = json.load(f)
    events = exported["dflash"]["events"]
    assert exported["settings"]["min_confidence"] == 1.0 and all(e["verified"] == 1 for e in events)
    assert exported["settings"]["policy"] == "fixed" and exported["dflash"]["summary"]["plain_steps"] == 0
    assert exported["dflash"]["summary"]["drafted_tokens"] == len(events)


def test_bad_input_is_a_panel_and_the_app_keeps_serving(served, client):
    out = run(client, served[1], prompt="   ")
    assert "error-panel" in out["status"] and "prompt is empty" in out["status"]
    # out-of-range sliders are refused by Gradio itself with a one-line message
    with pytest.raises(AppError, match="less than minimum value 2"):
        run(client, served[1], block_size=1)
    with pytest.raises(AppError, match="greater than maximum value 256"):
        run(client, served[1], max_tokens=10_000)
    out = run(client, served[1], max_tokens=8)
    assert "identical" in out["lossless"]


def test_a_pair_that_fails_to_load_is_a_panel(tmp_path):
    from ui_pair import free_port

    from ui import build_app

    (tmp_path / "target").mkdir()
    demo, kwargs = build_app(str(tmp_path / "target"), str(tmp_path / "missing-draft"))
    port = free_port()
    demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True, **kwargs)
    try:
        out = run(
            Client(f"http://127.0.0.1:{port}/", verbose=False), f"{tmp_path / 'target'} + {tmp_path / 'missing-draft'}"
        )
        assert "error-panel" in out["status"] and "missing-draft&#x27; does not exist" in out["status"]
        assert "Traceback" not in out["status"]
    finally:
        demo.close()


class ScriptedPair:
    """Plays back fixed events like a Pair would, and logs which thread ran what, in what order."""

    def __init__(self, ours, reference):
        self.ours, self.reference, self.log = ours, reference, []

    def _note(self, what):
        self.log.append((what, threading.current_thread().name))

    def check_request(self, ids, max_tokens, block_size):
        self._note("check")

    def baseline(self, ids, max_tokens, should_stop, sampling=None):
        self._note("baseline start")
        for i, tok in enumerate(self.reference):
            yield TokenEvent(i, tok, 0.01 * (i + 1))
        self._note("baseline end")
        yield RunSummary("baseline", len(ids), self.reference, 0.01, 0.05, "max_tokens", 1.0)

    def dflash(
        self, ids, max_tokens, block_size, should_stop, min_confidence=None, sampling=None, policy=None, copy=False
    ):
        self._note("dflash start")
        o = self.ours
        yield CycleEvent(0, 3, o[0], o[1:3], [0.9, 0.8], 2, o[1:3] + [7], 2, o[:3], 7, 0, 0, 1.0, 2.0, 0.1, 0.01)
        yield CycleEvent(1, 3, o[3], [9, 2], [0.9, 0.1], 1, [o[4], 1], 0, o[3:4], o[4], 1, 0, 1.0, 2.0, 0.1, 0.02)
        self._note("dflash end")
        yield RunSummary("dflash", len(ids), self.ours[:4], 0.01, 0.02, "max_tokens", 1.0, block_size=3, cycles=2)

    def divergence(self, ids, ours, reference):
        self._note("divergence")
        return Divergence(index=2, dflash_token=ours[2], baseline_token=reference[2], top2_margin=0.25)


def test_engines_run_one_after_the_other_on_the_worker_and_divergence_is_reported():
    pair = ScriptedPair([5, 6, 8, 9, 4], [5, 6, 7, 9])
    run_ = Comparison("scripted", "p", [1, 2], 4, 3, False)
    stages = [state.stage for state in compare(default_worker(), pair, run_, threading.Event())]
    steps = [what for what, _ in pair.log]
    assert steps == ["check", "baseline start", "baseline end", "dflash start", "dflash end", "divergence"]
    assert {thread for _, thread in pair.log} == {"mlx-worker"}  # all model work on the one MLX thread
    assert stages.index("dflash") > max(i for i, s in enumerate(stages) if s == "baseline")
    assert run_.verdict == "diverged" and run_.divergence.top2_margin == 0.25 and stages[-1] == "done"
    assert run_.dflash_tokens() == [5, 6, 8, 9] and [e.token for e in run_.baseline] == [5, 6, 7, 9]


def test_stop_ends_within_a_cycle_and_keeps_the_text(served):
    """Stop during DFlash: the engine ends at its next cycle, what was generated stays, and the
    verdict compares only the tokens both engines produced."""
    pair = served[2].playground.catalogue.get(served[1])
    ids = pair.encode(PROMPT, chat_template=False)
    stop = threading.Event()
    run_ = Comparison(pair.name, PROMPT, ids, 200, 4, False)
    for state in compare(default_worker(), pair, run_, stop):
        if state.stage == "dflash" and len(state.cycles) == 3:
            stop.set()
    assert run_.dflash_summary.stop_reason == "cancelled"
    assert 4 <= len(run_.cycles) < 50  # far short of the ~200 cycles a full run takes
    assert run_.dflash_summary.tokens == run_.dflash_tokens() and run_.baseline_summary.stop_reason != "cancelled"
    assert run_.verdict == "partial" and run_.divergence is None


def test_stop_button_keeps_what_was_generated(served, client):
    job = client.submit(PROMPT, served[1], 256, 2, False, 0.0, api_name="/run")
    while not any("running DFlash alone" in str(o) for o in job.outputs()):  # DFlash has started
        assert not job.done(), "the run ended before Stop could be pressed"
        time.sleep(0.02)
    time.sleep(1.0)  # a few cycles (of the 128 that 256 tokens at block 2 take at least)
    assert not job.done(), "the run ended before Stop could be pressed"
    client.predict(api_name="/stop")  # the same client: the same browser session
    out = dict(zip(OUTPUTS, job.result()))
    assert "stopped" in out["status"] and "cancelled" in out["d_stats"]
    assert "tok-target" in out["d_out"] and visible_text(out["b_out"]).strip()
    assert "stopped early" in out["lossless"] and "identical" in out["lossless"]


def test_picker_offers_hub_pairs_only_when_downloads_are_allowed(tmp_path):
    from dflash_core.models.registry import DRAFTS, known_pairs
    from ui.models import Catalogue

    local = [(str(tmp_path / "t"), str(tmp_path / "d"))]
    closed = Catalogue(default_worker(), local, allow_downloads=False)
    assert closed.choices()[0][1] == f"{tmp_path / 't'} + {tmp_path / 'd'}"  # the host's pair leads
    assert all(closed.kind(key) in ("shipped", "host") for _, key in closed.choices())
    opened = Catalogue(default_worker(), local, allow_downloads=True)
    hub = [key for _, key in opened.choices() if opened.kind(key) == "hub"]
    # every non-gated registry target, the 4-bit conversions first
    assert set(hub) == {p.target for p in known_pairs() if p.kind != "shipped" and not p.gated}
    assert all(key.startswith("mlx-community/") for key in hub[: len(DRAFTS)])
    assert (
        opened.entries["mlx-community/Qwen3-4B-4bit"].target,
        opened.entries["mlx-community/Qwen3-4B-4bit"].draft,
    ) == ("mlx-community/Qwen3-4B-4bit", DRAFTS["Qwen3-4B"])
    assert "meta-llama/Llama-3.1-8B-Instruct" not in hub  # gated: a visitor could not download it
