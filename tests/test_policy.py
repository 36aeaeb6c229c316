"""The verification policy: its models and decisions, and that no decision changes the output."""

import itertools
import random
import time

import mlx.core as mx
import pytest
from code_prompts import PROMPTS
from test_engine import MORE_ARCHITECTURES, _corrupting_draft, architecture_dirs, run  # noqa: F401 (a fixture)
from test_pipeline import PLAIN_KV
from test_sampling import CHI2_999, chi_square, sharp_pair, target_two_tokens  # noqa: F401 (a fixture)

from dflash_core.engine import cycle as engine
from dflash_core.engine import policy as policy_module
from dflash_core.engine.cycle import OracleDraft
from dflash_core.engine.events import CONFIDENCE_EDGES, CycleEvent, Decision
from dflash_core.engine.policy import (
    CALIBRATION_STEPS,
    HALF_LIFE,
    MAX_PROBE_WAIT,
    OUTLIER,
    PRIOR_TRIALS,
    RECALIBRATE,
    TARGET_WINDOW,
    AcceptancePredictor,
    CostModel,
    CostProfile,
    Policy,
    default_policy,
    expected_tokens,
)
from dflash_core.engine.sampling import Sampling
from dflash_core.training.random_models import FAMILIES

# --- the models ------------------------------------------------------------------------------------


def test_expected_tokens_counts_the_staged_token_and_each_surviving_prefix():
    assert expected_tokens([0.5, 0.5, 0.5], 0) == 1.0
    assert expected_tokens([0.5, 0.5, 0.5], 2) == pytest.approx(1 + 0.5 + 0.25)
    assert expected_tokens([1.0, 0.0, 1.0], 3) == pytest.approx(2.0)  # nothing survives a sure miss


def _cycle(confidence, verified, accepted_len) -> CycleEvent:
    return CycleEvent(
        cycle=0,
        block_size=len(confidence) + 1,
        staged_token=0,
        drafted=[1] * len(confidence),
        confidence=confidence,
        verified=verified,
        posterior=[1] * (verified + 1),
        accepted_len=accepted_len,
        committed=[0] + [1] * accepted_len,
        next_staged=1,
        kv_trimmed=verified - accepted_len,
        gdn_replayed=0,
        draft_ms=1.0,
        verify_ms=1.0,
        rollback_ms=0.0,
        t=0.0,
        decision=Decision(verified, False, 1.0, 1.0, 1.0, ""),
    )


def test_the_predictor_starts_from_its_prior_and_learns_the_runs_own_rate():
    prior = [[0, 0]] * len(CONFIDENCE_EDGES) + [[90, 100]]  # the top bin: 90 % accepted
    acc = AcceptancePredictor(3, {"acceptance_by_confidence": prior, "acceptance_by_position": [0.8, 0.4]})
    assert acc.p(None) == pytest.approx([0.8, 0.5])  # by position: P(a >= 2 | a >= 1) = 0.4 / 0.8
    assert acc.p([0.999])[0] == pytest.approx(0.9)
    assert acc.p([0.25])[0] == pytest.approx(0.25)  # no prior figure: the bin's own confidence
    for _ in range(200):  # this run: the top bin's first proposal is always rejected
        acc.observe(_cycle([0.999, 0.999], 2, 0))
    assert acc.p([0.999])[0] < 0.1
    # only what the cycle tells counts: the proposal after the first rejection was not judged
    before = [row[:] for row in acc.by_confidence]
    acc.observe(_cycle([0.999, 0.15], 2, 0))
    assert acc.by_confidence[-1][1] == before[-1][1] + 1 and acc.by_confidence[2] == before[2]
    assert acc.by_confidence[-1][1] - 200 - 1 == pytest.approx(PRIOR_TRIALS)
    assert acc.p(None)[0] < 0.1 and acc.by_position[1][1] == PRIOR_TRIALS  # position 2 never judged


def test_the_cost_model_follows_measured_time_per_kind():
    costs = CostModel(CostProfile(draft_s=0.01, verify_s=[0.1, 0.11, 0.12, 0.15]))
    assert costs.cycle_s(3) == pytest.approx(0.16)
    for _ in range(30):  # the drafted cycles run twice as slow as probed (a longer context, say)
        costs.observe(False, 3, 0.32)
    assert costs.cycle_s(1) == pytest.approx(2 * 0.12, rel=1e-3)
    assert costs.plain_s() == pytest.approx(2 * 0.1, rel=1e-3)  # not seen yet: follows the other kind
    costs.observe(True, 0, 0.1)
    assert costs.plain_s() == pytest.approx(0.1)
    for _ in range(30):  # a shape the probe got wrong: v = 1 measures cheaper than probed
        costs.observe(False, 1, 0.06)
    assert costs.cycle_s(1) == pytest.approx(0.06, rel=0.01)
    assert costs.cycle_s(1) < costs.cycle_s(2)  # v = 2 is not seen: the level of the kind stands in
    # a hiccup (a cycle 50 times its prediction) counts as OUTLIER times the prediction
    predicted = costs.cycle_s(1)
    assert costs.observe(False, 1, 50 * predicted) == pytest.approx(OUTLIER * predicted)
    assert costs.cycle_s(1) < OUTLIER * predicted / 2


def test_a_run_starts_from_the_level_the_last_run_of_its_way_measured():
    profile = CostProfile(draft_s=0.01, verify_s=[0.1, 0.11, 0.12, 0.15])
    first = CostModel(profile, way="pipelined")
    for _ in range(30):  # the drafted cycles run twice as slow as probed, the plain steps as probed
        first.observe(False, 3, 0.32)
        first.observe(True, 0, 0.1)
    first.carry()
    again = CostModel(profile, way="pipelined")
    assert again.cycle_s(3) == pytest.approx(0.32, rel=1e-3) and again.timed_plain()
    assert Policy(8, again, AcceptancePredictor(8)).since_plain == 0  # a plain step's cost is known
    other = CostModel(profile, way="synchronous")  # cycles run another way: the probe's level
    assert other.cycle_s(3) == pytest.approx(0.16) and not other.timed_plain()
    for _ in range(30):  # the run's own cycles take over
        again.observe(False, 3, 0.16)
    assert again.cycle_s(3) == pytest.approx(0.16, rel=0.01)
    assert CostModel(profile, way="pipelined").cycle_s(3) == pytest.approx(0.32, rel=1e-3)  # until carried


def test_the_next_run_does_not_time_plain_steps_again(random_pairs, monkeypatch):
    """The first pipelined run of a pair times CALIBRATION_STEPS plain steps before it judges that
    drafting pays; the next starts from what the first measured (CostModel.carry) and drafts
    throughout. Synchronous runs start from the probe each time."""
    pair = random_pairs["qwen3"]
    monkeypatch.setattr(pair, "cost_profiles", {})
    ids = pair.encode(PROMPTS[0], chat_template=False)
    _, base = run(pair.baseline(ids, 40))
    oracle = OracleDraft(len(ids), base.tokens)
    for pipelined in (True, False):
        runs = [run(pair.dflash(ids, 40, 6, draft_fn=oracle, pipelined=pipelined))[1] for _ in range(2)]
        assert [r.tokens for r in runs] == [base.tokens] * 2 and runs[0].pipelined == pipelined
        assert [r.plain_steps for r in runs] == [CALIBRATION_STEPS, 0 if pipelined else CALIBRATION_STEPS]


def _policy(verify_s, draft_s=0.01, prior=None, B=8):
    return Policy(B, CostModel(CostProfile(draft_s, verify_s)), AcceptancePredictor(B, prior))


def test_cheap_rows_verify_the_whole_block_and_dear_rows_only_the_likely_proposals():
    cheap = _policy([0.1] * 8)
    assert cheap.after_draft([0.9] * 7).verified == 7
    dear = _policy([0.1 + 0.05 * r for r in range(8)])  # each row costs half a plain step
    d = dear.after_draft([0.99, 0.97, 0.3, 0.06, 0.06, 0.06, 0.06])  # worth it while survival > 1/2
    assert d.verified == 2 and not d.plain_step
    assert d.expected_tokens == pytest.approx(expected_tokens(dear.acceptance.p([0.99, 0.97]), 2))
    assert "verify 2 of 7" in d.reason and "proposal 3" in d.reason


def _plain_streak(pol, decision, target_sure: float) -> int:
    """Plain steps as the engine takes them: keep_plain is asked before each launch, with the
    step before still in flight (not yet observed)."""
    n = 0
    while True:
        more = pol.keep_plain()
        n += 1
        pol.observe(_plain(decision, target_sure), 0.1)
        if not more:
            return n


HOPELESS = {"acceptance_by_position": [0.1, 0.01, 0.001, 0, 0, 0, 0]}  # the draft's own figures: ~1.1 tokens a cycle
PAYING = {"acceptance_by_position": [0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3]}  # 5.2 tokens a cycle


def test_plain_steps_where_drafting_does_not_pay_with_a_probe_now_and_then():
    pol = _policy([0.1] * 8, draft_s=0.1, prior=HOPELESS)  # a drafted cycle costs two plain steps
    assert pol.before_draft() is None  # the first cycle drafts: nothing is known of this run yet
    pol.observe(_cycle([0.5] * 7, 7, 0), 0.2)  # one token for two steps' time
    for _ in range(3):
        plain = pol.before_draft()
        assert plain.plain_step and plain.verified == 0 and "drafted cycles lately commit 1.1 tokens" in plain.reason
        # hard text (the target unsure of its tokens), a draft that never pays, even at its prior:
        # the streak lasts its longest, then one drafted cycle looks again
        assert _plain_streak(pol, plain, target_sure=0.3) == MAX_PROBE_WAIT
        assert pol.before_draft() is None
        assert f"probe after {MAX_PROBE_WAIT} plain steps" in pol.after_draft([0.5] * 7).reason
        pol.observe(_cycle([0.5] * 7, 7, 0), 0.2)
    pol.observe(_cycle([0.99] * 7, 7, 7), 0.2)  # the text turned predictable: a probe accepted whole
    assert pol.before_draft() is None  # and the policy drafts again


def _bad_patch(cycles: int) -> tuple:
    """A run where drafting pays (4 tokens for two steps), then `cycles` drafted cycles that
    commit one token each: (the plain streak that follows, the policy)."""
    pol = _policy([0.1] * 8, draft_s=0.1, prior=PAYING)
    pol.observe(_cycle([0.5] * 7, 7, 3), 0.2)
    timing = pol.before_draft()  # no plain step timed yet: two are, before drafting is judged
    assert "timing" in timing.reason and _plain_streak(pol, timing, 0.3) == CALIBRATION_STEPS
    for _ in range(cycles):
        pol.observe(_cycle([0.5] * 7, 7, 0), 0.2)
    plain = pol.before_draft()
    if plain is None:
        return 0, pol
    assert not pol._pays()
    return _plain_streak(pol, plain, target_sure=0.3), pol


def test_a_bad_patch_turns_to_plain_steps_until_it_has_faded():
    """Recent drafted cycles weigh most (their weight halves every HALF_LIFE tokens, plain ones
    included): a few bad cycles where drafting pays do not stop it; a longer bad patch does, and
    the plain streak lasts until the patch has faded enough that drafting is expected to pay again
    (the run's own acceptance, which the patch lowered too, is the level it fades to)."""
    assert _bad_patch(4)[0] == 0
    streaks = []
    for cycles in (8, 12, 16):
        streak, pol = _bad_patch(cycles)
        assert 0 < streak < MAX_PROBE_WAIT and pol._pays()  # the streak ended on the faded estimate
        assert pol.before_draft() is None and "probe after" in pol.after_draft(None).reason
        streaks.append(streak)
    assert streaks == sorted(streaks) and streaks[0] <= HALF_LIFE  # a longer patch, a longer streak


def test_a_probes_switch_from_plain_steps_is_not_charged_to_drafting():
    """A probe that pays by its outcome (4 tokens) but took 20 cycles' time (it pays for leaving
    plain steps: it runs alone, and extends the draft's context by every plain step's features):
    drafting goes on, and the cost model keeps its level."""
    streak, pol = _bad_patch(12)
    assert streak > 0 and pol.before_draft() is None  # the probe
    level = pol.costs.cycle_s(7)
    pol.observe(_cycle([0.9] * 7, 7, 3), 20 * level)
    assert pol.costs.cycle_s(7) == pytest.approx(level)
    assert pol.before_draft() is None and pol.plain_streak == 0  # drafting goes on
    pol.observe(_cycle([0.9] * 7, 7, 3), 20 * level)  # the same time in a drafting run counts
    assert pol.costs.cycle_s(7) > 1.2 * level


def test_a_plain_step_is_timed_before_drafting_is_judged_to_pay():
    """The probe's shape puts a drafted cycle at 1.1 plain steps; it measures 1.8 (0.18 s against
    0.1 s). Untimed, a plain step would be taken for 0.16 s and 1.5 tokens a cycle would seem to
    pay; timing CALIBRATION_STEPS plain steps shows they do not, and the run steps plainly."""
    pol = _policy([0.1] * 8, draft_s=0.01)
    for a in (0, 1):
        pol.observe(_cycle([0.5] * 7, 7, a), 0.18)
    assert pol.costs.plain_s() > 0.15  # not timed: the drafted cycles' scale stands in
    d = pol.before_draft()
    assert d.plain_step and "timing" in d.reason
    assert _plain_streak(pol, d, target_sure=0.3) == CALIBRATION_STEPS
    assert pol.before_draft() is None and "probe" not in pol.after_draft([0.5] * 7).reason
    pol.observe(_cycle([0.5] * 7, 7, 0), 0.18)
    d = pol.before_draft()
    assert d.plain_step and "commit 1.6 tokens each for 1.8 steps" in d.reason


def test_drafting_that_pays_times_a_plain_step_again_now_and_then():
    pol = _policy([0.1] * 8, draft_s=0.01)
    pol.observe(_cycle([0.9] * 7, 7, 7), 0.15)  # 8 tokens a cycle: drafting pays by any measure
    d = pol.before_draft()
    assert d.plain_step and _plain_streak(pol, d, 0.9) == CALIBRATION_STEPS
    drafted = 0
    while pol.before_draft() is None:
        pol.observe(_cycle([0.9] * 7, 7, 7), 0.15)
        drafted += 1
    assert drafted == RECALIBRATE  # drafted cycles between two timings


def test_a_sure_target_calls_the_probe_early():
    pol = _policy([0.1] * 8, draft_s=0.1, prior=HOPELESS)
    pol.observe(_cycle([0.5] * 7, 7, 0), 0.2)
    plain = pol.before_draft()
    # the target is sure of its tokens (0.95 each: a cycle of 7 would commit 5.3 for 2 steps'
    # cost): once TARGET_WINDOW of them are seen, the streak ends, the last step in flight
    assert _plain_streak(pol, plain, target_sure=0.95) == TARGET_WINDOW + 1
    assert pol.before_draft() is None
    # the early probe fails (a repeated phrase the target is sure of, the draft still misses):
    # the target's confidence calls no more early probes
    pol.observe(_cycle([0.5] * 7, 7, 0), 0.2)
    plain = pol.before_draft()
    assert plain.plain_step and _plain_streak(pol, plain, target_sure=0.95) == MAX_PROBE_WAIT
    pol.observe(_cycle([0.99] * 7, 7, 7), 0.1)  # this probe makes drafting pay: early probes are back
    assert pol.before_draft() is None and pol.early_probes


def _plain(decision, target_sure: float = 0.3) -> CycleEvent:
    ev = _cycle([], 0, 0)
    ev.decision, ev.confidence = decision, [target_sure]
    return ev


def test_the_fixed_policy_never_steps_plainly_and_keeps_its_threshold():
    pol = Policy(8, CostModel(CostProfile(0.1, [0.1] * 8)), AcceptancePredictor(8), min_confidence=0.5)
    assert pol.reads_confidence  # its threshold needs them, on any device
    for _ in range(5):
        pol.observe(_cycle([0.5] * 7, 7, 0), 10.0)
    assert pol.before_draft() is None
    assert pol.after_draft([0.9, 0.6, 0.3, 0.9, 0.9, 0.9, 0.9]).verified == 2
    assert pol.name == "fixed"


def test_default_policy():
    assert default_policy() == "adaptive"
    assert default_policy(min_confidence=0.2) == "fixed"
    assert default_policy(sampling=Sampling(0.7, seed=3)) == "fixed"  # a seeded run repeats exactly
    assert default_policy(sampling=Sampling(0.7)) == "adaptive"


# --- lossless whatever it decides ---------------------------------------------------------------------


class ScriptedPolicy(Policy):
    """Interleaves plain-step streaks of 1-3 steps with drafted cycles verifying every v in turn;
    `blind`: without reading the draft's confidence first (a GPU's one host sync per cycle)."""

    blind = False

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.reads_confidence = not self.blind
        self.streaks = itertools.cycle([0, 1, 0, 3, 2, 0])
        self.sizes = itertools.cycle(range(self.B))

    def before_draft(self):
        self.streak = next(self.streaks)
        return Decision(0, True, 1.0, 1.0, 1.0, "scripted plain step") if self.streak else None

    def keep_plain(self):
        self.streak -= 1
        return self.streak > 0

    def after_draft(self, confidence):
        return Decision(next(self.sizes), False, 1.0, 1.0, 1.0, "scripted")


@pytest.fixture()
def scripted(monkeypatch):
    monkeypatch.setattr(engine, "Policy", ScriptedPolicy)


def _interleaved(cycles) -> set:
    """Checks the plain steps; returns the verify sizes that occurred."""
    plain = [ev for ev in cycles if ev.plain_step]
    assert plain and all(ev.verified == 0 and not ev.drafted for ev in plain)
    # one token a step; the run's last cycle also emits the staged token that ends the run
    assert all(len(ev.committed) <= 1 + (ev is cycles[-1]) for ev in plain)
    return {ev.verified for ev in cycles if not ev.plain_step}


@pytest.mark.parametrize("blind", [False, True])
@pytest.mark.parametrize(
    "family", [f if f in ("qwen3", "qwen3_5", "llama") else pytest.param(f, marks=pytest.mark.slow) for f in FAMILIES]
)
def test_interleaved_plain_steps_and_every_verify_size_are_lossless(random_pairs, family, blind, scripted, monkeypatch):
    monkeypatch.setattr(ScriptedPolicy, "blind", blind)
    pair = random_pairs[family]
    vocab, sizes = pair.draft.config.vocab_size, set()
    for prompt in PROMPTS[:2]:
        ids = pair.encode(prompt, chat_template=False)
        _, base = run(pair.baseline(ids, 48))
        oracle = OracleDraft(len(ids), base.tokens)  # proposes on the device too: pipelined cycles
        corrupting = _corrupting_draft(base.tokens, len(ids), vocab, random.Random(2), "partly")
        for draft_fn in (None, corrupting, oracle):
            cycles, ours = run(pair.dflash(ids, 48, 6, draft_fn=draft_fn, policy="adaptive", pipelined=True))
            assert ours.pipelined == (family in PLAIN_KV and draft_fn is not corrupting)
            assert ours.tokens == base.tokens, (family, prompt)
            assert [t for ev in cycles for t in ev.committed] == ours.tokens
            assert ours.plain_steps == sum(ev.plain_step for ev in cycles)
            sizes |= _interleaved(cycles)
    assert sizes == set(range(6))


def test_each_plain_step_is_charged_its_own_time(random_pairs, scripted, monkeypatch):
    """A plain step is launched before the one before it is read; where launching is computing (a
    CPU evaluates inside async_eval), the next step's time must not be charged to this one, or the
    first step of a streak reads two steps and the last next to none (the inspector showed 0.2)."""
    pair = random_pairs["qwen3"]
    step = pair.target.step

    def slow_step(token):  # a step whose launch takes 40 ms, as a synchronous device's would
        time.sleep(0.04)
        return step(token)

    monkeypatch.setattr(pair.target, "step", slow_step)
    ids = pair.encode(PROMPTS[0], chat_template=False)
    cycles, _ = run(pair.dflash(ids, 40, 6, policy="adaptive", pipelined=False))
    plain = [ev.cycle_ms for ev in cycles if ev.plain_step]
    assert len(plain) >= 6 and all(35 < ms < 75 for ms in plain), plain


@pytest.mark.parametrize("compiled", [False, True])
def test_a_pipelined_run_ends_on_its_budget_or_when_cancelled(random_pairs, scripted, compiled):
    """Every budget from 1 to 30 tokens, so that plain steps and drafted cycles of every size are
    in flight when it ends: plain greedy's first tokens, exactly as many; a run cancelled once its
    consumer has seen k cycles stops with the next (asked when it is recorded), with plain
    greedy's tokens so far, and leaves mlx-lm's caches."""
    pair = random_pairs["qwen3"]
    ids = pair.encode(PROMPTS[0], chat_template=False)
    _, base = run(pair.baseline(ids, 30))
    for n in range(1, 31):
        _, ours = run(pair.dflash(ids, n, 6, policy="adaptive", pipelined=True, compiled=compiled))
        assert ours.pipelined and ours.tokens == base.tokens[:n], n
    for k in range(1, 8):
        seen = []
        gen = pair.dflash(
            ids, 30, 6, should_stop=lambda seen=seen, k=k: len(seen) >= k, policy="adaptive", pipelined=True
        )
        for ev in gen:
            if isinstance(ev, CycleEvent):
                seen.append(ev)
            else:
                summary = ev
        assert summary.stop_reason == "cancelled" and len(seen) == k + 1
        assert summary.tokens == base.tokens[: len(summary.tokens)]
        assert all(type(c).__name__ == "KVCache" for c in pair.target.cache)


def test_a_pipelined_cycle_is_charged_its_own_launch(random_pairs, scripted, monkeypatch):
    """The host launches the next cycle before it waits for this one: that launch is the next
    cycle's time. With building a drafted graph made slow (0.2 s of the draft's forward), every
    drafted cycle is timed at least that, and no plain step, though each plain step before a
    drafted cycle is read after that cycle's launch (charged to it, the cost model took plain
    steps for dear and a draft that nothing accepted went on drafting on a GPU)."""
    pair = random_pairs["qwen3"]
    ids = pair.encode(PROMPTS[0], chat_template=False)
    propose = pair.draft.propose
    monkeypatch.setattr(pair.draft, "propose", lambda *a: time.sleep(0.2) or propose(*a))
    cycles, ours = run(pair.dflash(ids, 24, 6, policy="adaptive", pipelined=True, compiled=False))
    assert ours.pipelined
    plain = [ev.cycle_ms for ev in cycles if ev.plain_step]
    drafted = [ev.cycle_ms for ev in cycles if not ev.plain_step]
    assert plain and drafted
    assert min(drafted) >= 200 and max(plain) < 100, (drafted, plain)


@pytest.mark.parametrize("compiled", [False, True])
def test_a_pipelined_plain_step_extends_the_draft_context_as_it_runs(random_pairs, scripted, monkeypatch, compiled):
    """Every cycle's launch schedules the draft context's caches with its outputs, plain steps'
    included: otherwise each plain step's extension waits for the next draft forward, which pays
    them all (on an H100, 1.5 ms a plain step, charged to the probe that ends the streak)."""
    from dflash_core.engine import pipeline

    pair = random_pairs["qwen3"]
    ids = pair.encode(PROMPTS[0], chat_template=False)
    scheduled, contexts = [], []
    async_eval = mx.async_eval
    monkeypatch.setattr(mx, "async_eval", lambda *xs: scheduled.append({id(x) for x in xs}) or async_eval(*xs))
    cycles = pipeline.pipelined_cycles

    def spied(target, draft, head, ctx, *args, **kwargs):
        contexts.append(ctx)
        gen = cycles(target, draft, head, ctx, *args, **kwargs)
        while True:
            try:
                ev = next(gen)
            except StopIteration as end:
                return end.value  # the staged token
            # the last launch (the cycle launched ahead, or this one) scheduled the caches it left
            assert {id(x) for kv in ctx.kv for x in kv} <= scheduled[-1]
            yield ev

    monkeypatch.setattr(engine, "pipelined_cycles", spied)
    cycles_seen, ours = run(pair.dflash(ids, 24, 6, policy="adaptive", pipelined=True, compiled=compiled))
    assert ours.pipelined and contexts and any(ev.plain_step for ev in cycles_seen)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["llama-sliding", "gemma3_text", "gemma4", "qwen3_5_moe"])
def test_interleaving_is_lossless_on_sliding_window_and_moe_hybrid_targets(request, name, scripted):
    from dflash_core.models.loading import load_pair

    pair = load_pair(*map(str, request.getfixturevalue("architecture_dirs")(name)))
    sizes = set()
    for prompt in PROMPTS[1:3]:
        ids = pair.encode(prompt, chat_template=False)
        _, base = run(pair.baseline(ids, 48))
        cycles, ours = run(pair.dflash(ids, 48, 6, policy="adaptive"))
        assert ours.tokens == base.tokens, name
        sizes |= _interleaved(cycles)
    assert sizes == set(range(6))


assert set(MORE_ARCHITECTURES) == {"llama-sliding", "gemma3_text", "gemma4", "qwen3_5_moe"}


def test_the_adaptive_policy_is_lossless_and_reports_its_decisions(random_pairs):
    pair = random_pairs["qwen3_5"]
    ids = pair.encode(PROMPTS[0], chat_template=False)
    _, base = run(pair.baseline(ids, 40))
    cycles, ours = run(pair.dflash(ids, 40))
    assert ours.tokens == base.tokens and ours.policy == "adaptive"
    assert all(ev.decision and ev.decision.reason and ev.decision.step_ms > 0 for ev in cycles)
    assert sum(ours.verified_rows) == ours.cycles == len(cycles)
    assert ours.verified_rows[0] >= ours.plain_steps
    assert 0 < ours.stats()["engine_efficiency"] <= 1


@pytest.mark.slow
def test_sampling_keeps_the_targets_distribution_under_interleaving(request, scripted):
    pair = request.getfixturevalue("sharp_pair")
    ids = pair.encode("def fib(n):", chat_template=False)
    s = Sampling(1.0, 1.0)
    expected = target_two_tokens(pair, ids, s)
    runs, counts = 500, {}
    mx.random.seed(11)
    for _ in range(runs):
        *cycles, summary = pair.dflash(ids, 3, 4, sampling=s, policy="adaptive")
        key = tuple(summary.tokens[:2])
        counts[key] = counts.get(key, 0) + 1
    stat, dof = chi_square(counts, expected, runs)
    assert stat < CHI2_999[dof], (stat, dof)


@pytest.mark.parametrize("on_cpu", [True, False], ids=["cpu", "gpu"])
def test_the_cost_probe_times_every_verify_size_on_a_gpu(random_pairs, monkeypatch, on_cpu):
    """A GPU's forward can cost more for fewer rows (another kernel past a row count), so the
    probe times each size there; a CPU's grows smoothly and is interpolated between a few."""
    pair = random_pairs["qwen3"]
    timed = []
    verify = pair.target.verify
    monkeypatch.setattr(pair.target, "verify", lambda ids: timed.append(len(ids)) or verify(ids))
    monkeypatch.setattr(policy_module.backend, "on_cpu", lambda: on_cpu)
    head = pair.target.draft_head(None)
    profile = policy_module.probe_costs(pair.target, pair.draft, head, 8, list(range(5, 30)))
    assert len(profile.verify_s) == 8 and all(s > 0 for s in profile.verify_s)
    assert set(timed) == ({1, 2, 4, 8} if on_cpu else set(range(1, 9)))
