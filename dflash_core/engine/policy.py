"""How much of each block the target verifies, cycle by cycle.

The adaptive policy maximises expected committed tokens per expected second. It rests on
- a cost model of this device, pair and context (`CostModel`): a short probe at first use gives
  the shape (a draft forward, target forwards of 1..B rows), and the engine's own timing of every
  cycle keeps its scale current as the context grows or the machine slows (a pipelined run starts
  from where the last one of its pair left it);
- an acceptance predictor (`AcceptancePredictor`): the chance that a proposal is accepted, given
  that the ones before it were and the draft's own probability of it, starting from a prior the
  draft ships and calibrated on the run's own cycles.
Before a cycle it decides between drafting and a plain target step (v = 0: no draft forward is
paid); after drafting, how many proposals v to verify. A run in plain steps drafts again now and
then (a probe: once the evidence against drafting has faded, at most MAX_PROBE_WAIT steps on, or
sooner where the target's own probability of its recent tokens says the text has turned
predictable). The fixed policy verifies the draft's confident prefix of a whole block
(`--min-confidence`) and never steps plainly.
"""

import math
import time
from collections import deque
from dataclasses import dataclass, field

import mlx.core as mx

from .. import backend
from .events import CONFIDENCE_EDGES, CycleEvent, Decision, confidence_bin, confidence_outcomes

POLICIES = ("adaptive", "fixed")
PRIOR_TRIALS = 8  # the prior weighs as this many observed proposals per bin: the run soon outweighs it
COST_MEMORY = 0.8  # decay per cycle of the cost model's sums: about the last five cycles count
PRIOR_V_CYCLES = 2  # a v not verified lately is estimated as if seen this often at the kind's level
# Whether drafting pays is judged by its recent rate (tokens per second of drafted cycles), each
# cycle weighing less as output goes by: its weight halves every HALF_LIFE tokens, plain steps'
# tokens included, over a prior of PRIOR_CYCLES cycles at what the acceptance predictor and the
# cost model expect of a cycle (Policy.drafting). Accepted lengths vary widely cycle to cycle (a
# rejection at the first proposal is common even where drafting pays), so a bad run of cycles
# turns a run to plain steps now and then; the evidence then fades as plain tokens go by, and
# once the estimate is back at plain decoding's rate the next cycle drafts again (a probe), whose
# outcome counts like any other. A fixed window of 8 cycles, with a probe judged by itself (one cycle against
# plain decoding's rate, failed probes waiting twice as long for the next) turned requests where
# drafting pays 1.16x on an H200 into plain steps for 92% of their tokens (1.03x median).
HALF_LIFE = 24
PRIOR_CYCLES = 4
# Most plain steps in a streak: where even the prior says drafting does not pay (a draft that
# never agrees with this target), only this cap, or the target's own confidence (keep_plain),
# calls a probe. A failing probe costs a drafted cycle less the one token it commits: with a
# random Qwen3-4B-shaped pair on the H200 (a 3.4-step cycle at a block of 16, nothing ever
# accepted) a probe every 128 plain steps costs about 2%.
MAX_PROBE_WAIT = 128
TARGET_WINDOW = 4  # plain tokens whose target probability can call a probe early
# A run that drafts from its first cycle on would never time a plain step: the cost model would
# take it from the probe's shape (one row's verify scaled like the drafted cycles), which on a CPU
# put a drafted cycle at 1.0-1.1 plain steps where it measured 1.8, and drafting went on at 0.82x.
# So where the run goes on drafting and no plain step has been timed (in this run or, for a
# pipelined run, one before it: CostModel.carry; or none for RECALIBRATE drafted cycles: costs
# move as the context grows), CALIBRATION_STEPS plain steps are taken: a plain step costs what
# plain decoding costs, so measuring it loses nothing against the baseline.
CALIBRATION_STEPS = 2
RECALIBRATE = 64
# A cycle timed at more than OUTLIER times the model's prediction counts as OUTLIER times it: a
# hiccup (12-26 ms among 5-9 ms cycles on an H100: a collection, the host descheduled) would
# otherwise set the level of its kind for several cycles, and drafting's rate for HALF_LIFE
# tokens. Above the probe's worst error of shape (a drafted cycle measured 1.8 plain steps on a
# CPU where probed at 1.0-1.1), so a wrong shape is still corrected within a cycle or two.
OUTLIER = 3.0


def _bin_middle(b: int) -> float:
    lo = CONFIDENCE_EDGES[b - 1] if b else 0.0
    hi = CONFIDENCE_EDGES[b] if b < len(CONFIDENCE_EDGES) else 1.0
    return (lo + hi) / 2


def default_policy(min_confidence=None, sampling=None) -> str:
    """Adaptive, unless a --min-confidence asks for the fixed policy, or a seeded sampling run
    must repeat its output exactly: the adaptive policy's choices follow measured time, and a
    plain step draws its random numbers otherwise than a drafted cycle (the distribution stays
    the target's either way)."""
    fixed = min_confidence is not None or (sampling is not None and sampling.seed is not None)
    return "fixed" if fixed else "adaptive"


class AcceptancePredictor:
    """P(proposal k accepted | proposals before k accepted), kept as hits / trials per bin of the
    draft's probability of the proposal, and per block position for decisions taken without it.
    The priors are the draft's shipped figures (its benchmark's `acceptance_by_confidence` and
    `acceptance_by_position`), weighed as PRIOR_TRIALS observations; without them, a bin's own
    confidence (a calibrated draft's probability is its acceptance chance) and one half."""

    def __init__(self, block_size: int, prior: dict = None):
        prior = prior or {}
        by_confidence = prior.get("acceptance_by_confidence") or []
        self.by_confidence = [
            _weighed(*(by_confidence[b] if b < len(by_confidence) else (0, 0)), default=_bin_middle(b))
            for b in range(len(CONFIDENCE_EDGES) + 1)
        ]
        reached = [1.0, *(prior.get("acceptance_by_position") or [])]  # P(accepted length >= k)
        self.by_position = [
            _weighed(reached[k + 1], reached[k], default=0.5) if k + 1 < len(reached) else _weighed(0, 0, 0.5)
            for k in range(block_size - 1)
        ]

    def p(self, confidence: list | None) -> list:
        """Per proposal; None: by block position alone (the draft's confidence not read)."""
        if confidence is None:
            return [h / n for h, n in self.by_position]
        return [h / n for h, n in (self.by_confidence[confidence_bin(c)] for c in confidence)]

    def observe(self, ev: CycleEvent):
        for k, (b, accepted) in enumerate(confidence_outcomes(ev)):
            for row in (self.by_confidence[b], self.by_position[k]):
                row[0] += accepted
                row[1] += 1


def _weighed(hits: float, trials: float, default: float) -> list:
    """A prior rate as PRIOR_TRIALS observations: hits / trials where trials > 0, else `default`."""
    rate = hits / trials if trials > 0 else default
    return [rate * PRIOR_TRIALS, float(PRIOR_TRIALS)]


@dataclass
class CostProfile:
    """Seconds measured once for a pair on this device: the draft's forward over a block, and
    target forwards of 1..B rows (`verify_s[r - 1]`, interpolated between the probed row counts)."""

    draft_s: float
    verify_s: list
    # what pipelined runs measured, by how their cycles ran (CostModel's `way`), so that such a
    # run starts from the last one's level instead of the probe's, which times synchronous
    # forwards: on an H100 it put a compiled cycle at 2.1 plain steps where runs measured 1.5
    # once under way, and runs whose first drafted cycles failed stepped plainly on it.
    # (Synchronous runs start from the probe: replayed on a CPU's costs, carrying the level from
    # run to run read 0.87x on the long prompt against 0.97x.)
    carried: dict = field(default_factory=dict)


def _interpolated(points: dict, n: int) -> list:
    rows = sorted(points)
    out = []
    for r in range(1, n + 1):
        hi = next(x for x in rows if x >= r)
        lo = max(x for x in rows if x <= r)
        w = 0 if hi == lo else (r - lo) / (hi - lo)
        out.append(points[lo] * (1 - w) + points[hi] * w)
    return out


def probe_costs(
    target, draft, head, block_size: int, context_ids: list, most_rows: int = None, repeats: int = 2
) -> CostProfile:
    """Time the draft's forward and target forwards of a few row counts, up to `most_rows` (the
    block's by default; more where copies from the context may be longer), on a short context
    (the target's cache is reset by the run's own prefill afterwards). Fastest of `repeats`:
    noise only ever adds time."""
    from .draft import DraftContext

    most_rows = most_rows or block_size
    ctx = DraftContext(draft)
    target.prefill(context_ids, on_taps=ctx.extend)
    mx.eval(*(c.state for c in target.cache))
    # On a GPU a forward costs milliseconds and its cost steps where a kernel changes: the default
    # target's verify on an H100 read 6.1-6.6 ms for 1-3 rows, 7.6-8.1 for 4-7 (the fused
    # attention starts at 4) and 7.0-7.6 for 8-16 (MLX's quantized GEMM takes over at 8), so every
    # row count is timed there. On a CPU, where a forward costs far more and grows smoothly with
    # its rows, a few are, and the rest interpolated.
    rows = (
        range(1, most_rows + 1)
        if not backend.on_cpu()
        else sorted({1, 2, max(2, block_size // 2), block_size, most_rows})
    )
    fill = (context_ids * most_rows)[:most_rows]

    def timed(fn) -> float:
        best = math.inf
        for _ in range(repeats + 1):  # the first also warms up
            t = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - t)
        return best

    def verify(r):
        logits, _ = target.verify(fill[:r])
        mx.eval(mx.argmax(logits, axis=-1))
        target.rollback(kept=1, fed=r)
        mx.eval(target.gdn_state())

    def propose():
        block = target.embed(mx.array(fill[:1] + [draft.config.mask_token_id] * (block_size - 1)))[None]
        logits = head.logits(draft.propose(block, ctx.kv, ctx.length)[:, 1:])[0]
        mx.eval(mx.argmax(logits, axis=-1), mx.logsumexp(logits, axis=-1))

    verify_s = {r: timed(lambda r=r: verify(r)) for r in rows}
    return CostProfile(timed(propose), _interpolated(verify_s, most_rows))


class CostModel:
    """Predicted seconds of a plain step and of a drafted cycle that verifies v proposals.

    The probe gives the shape; the run's own cycles give the level and correct the shape. Each
    estimate is a ratio of decayed sums, measured over probed seconds, first per kind (plain
    steps, drafted cycles) and then, for drafted cycles, per v, where the kind's level stands in
    for PRIOR_V_CYCLES cycles until v has been seen. A ratio of sums, not a mean of ratios:
    pipelined cycles take uneven turns (a cycle's wait is short where the device finished it
    while the host built the next) that add up to the right total. Until a kind has been seen it
    follows the other's."""

    def __init__(self, profile: CostProfile, way=None):
        # way: how a pipelined run's cycles run, whose level carries to the next run of that way
        # (see CostProfile); None: a synchronous run, which starts from the probe and carries nothing
        self.profile, self.way = profile, way
        sums, by_v = profile.carried.get(way) or (
            {"plain": [0.0, 0.0], "drafted": [0.0, 0.0]},
            [[0.0, 0.0]] * len(profile.verify_s),
        )
        self.sums = {kind: list(pair) for kind, pair in sums.items()}  # [measured, probed], decayed
        self.by_v = [list(pair) for pair in by_v]  # drafted cycles: [measured, probed] per v

    def timed_plain(self) -> bool:
        return self.sums["plain"][1] > 0

    def carry(self):
        """Leave the run's measured level to the profile's next run of the same way (if any)."""
        if self.way is not None:
            self.profile.carried[self.way] = (self.sums, self.by_v)

    def _probed(self, plain: bool, v: int) -> float:
        p = self.profile
        return p.verify_s[0] if plain else p.draft_s + p.verify_s[v]

    def _scale(self, kind: str) -> float:
        for k in (kind, "drafted" if kind == "plain" else "plain"):
            measured, probed = self.sums[k]
            if probed > 0:
                return measured / probed
        return 1.0

    def plain_s(self) -> float:
        return self._probed(True, 0) * self._scale("plain")

    def cycle_s(self, v: int) -> float:
        probed = self._probed(False, v)
        measured, seen = self.by_v[v]
        return (PRIOR_V_CYCLES * probed * self._scale("drafted") + measured) / (PRIOR_V_CYCLES * probed + seen) * probed

    def verify_s(self, v: int) -> float:
        """A verify of v proposals alone, with no draft forward (a copy from the context)."""
        return self.profile.verify_s[v] * self._scale("drafted")

    def observe(self, plain: bool, v: int, seconds: float) -> float:
        """Fold in a cycle's time; returns it as counted (at most OUTLIER times its prediction)."""
        seconds = min(seconds, OUTLIER * (self.plain_s() if plain else self.cycle_s(v)))
        probed = self._probed(plain, v)
        rows = [self.sums["plain" if plain else "drafted"]] + ([] if plain else [self.by_v[v]])
        for sums in rows:
            sums[0] = COST_MEMORY * sums[0] + seconds
            sums[1] = COST_MEMORY * sums[1] + probed
        return seconds


class DraftingRate:
    """Drafted cycles' tokens and seconds, each cycle weighing half as much every HALF_LIFE tokens
    of output since (`age`), and what they say with the prior: tokens a cycle, seconds a cycle."""

    def __init__(self):
        self.cycles = self.tokens = self.seconds = 0.0

    def age(self, tokens: int):
        fade = 0.5 ** (tokens / HALF_LIFE)
        self.cycles, self.tokens, self.seconds = self.cycles * fade, self.tokens * fade, self.seconds * fade

    def add(self, tokens: int, seconds: float):
        self.cycles, self.tokens, self.seconds = self.cycles + 1, self.tokens + tokens, self.seconds + seconds

    def per_cycle(self, prior_tokens: float, prior_seconds: float) -> tuple:
        """(tokens, seconds) a drafted cycle: the faded cycles over PRIOR_CYCLES at the prior's."""
        n = PRIOR_CYCLES + self.cycles
        return (PRIOR_CYCLES * prior_tokens + self.tokens) / n, (PRIOR_CYCLES * prior_seconds + self.seconds) / n


def confident_prefix(confidence: list, min_confidence: float) -> int:
    """How many leading proposals go to the target: the first always, then each while the
    draft's top-1 probability stays >= min_confidence (0 sends all)."""
    k = 1
    while k < len(confidence) and confidence[k] >= min_confidence:
        k += 1
    return k


def expected_tokens(p_accept: list, v: int) -> float:
    """1 (the staged token) + the chance that each of the first v proposals survives."""
    total, survive = 1.0, 1.0
    for p in p_accept[:v]:
        survive *= p
        total += survive
    return total


def _first(v: int, p_copied: list) -> str:
    """How much of a copy the target checks, for the reason line: the rows that pay for themselves."""
    return f", the first {v} verified" if v < len(p_copied) else ""


def _plain_step(plain_s: float, why: str) -> Decision:
    """A plain step's Decision: one token for one step's cost."""
    return Decision(0, True, 1.0, 1.0, plain_s * 1e3, f"plain step: {why}", draft_forward=False)


class Policy:
    """One run's verification policy: adaptive (`min_confidence` None) or fixed."""

    def __init__(
        self,
        block_size: int,
        costs: CostModel,
        acceptance: AcceptancePredictor,
        min_confidence=None,
        reads_confidence: bool = True,
    ):
        self.B = block_size
        self.costs = costs
        self.acceptance = acceptance
        self.min_confidence = min_confidence
        # whether after_draft is given the draft's confidences (a host sync before the verify);
        # the fixed policy's threshold needs them
        self.reads_confidence = reads_confidence or bool(min_confidence)
        self.rate = DraftingRate()  # drafted cycles lately, the evidence on whether drafting pays
        self.drafted_any = False
        self.plain_streak = 0
        self.calibrating = False  # the plain steps in progress time a plain step, not a probe's wait
        # drafted cycles since the last plain step was timed (None: none yet, in this run or, as
        # carried, an earlier one)
        self.since_plain = 0 if costs.timed_plain() else None
        self.target_sure = deque(maxlen=TARGET_WINDOW)  # the target's probability of its last plain tokens
        # whether the target's confidence may call a probe early: not after an early probe failed,
        # until drafting pays again (a target sure of a repeated phrase the draft still misses,
        # as on a long pasted source beyond the contexts the draft was trained on, would otherwise
        # call a failing probe every few tokens)
        self.early_probes = True
        self.early_probe = False  # the plain streak in progress ended on the target's confidence

    @property
    def adaptive(self) -> bool:
        return self.min_confidence is None

    @property
    def name(self) -> str:
        return "adaptive" if self.adaptive else "fixed"

    def drafting(self) -> tuple:
        """Drafting's expected (tokens, plain steps) a cycle, from recent cycles over the prior: a
        cycle verifying as many proposals as after_draft's criterion takes by block position (a
        whole block's where rows are cheap; a few where each row costs, as on a CPU, so that a
        draft worth its first proposals is not judged by the rows it would not verify)."""
        p = self.acceptance.p(None)
        v = self._verified(p)
        prior = expected_tokens(p, v), self.costs.cycle_s(v)
        tokens, seconds = self.rate.per_cycle(*prior)
        return tokens, seconds / self.costs.plain_s()

    def _verified(self, p_accept: list) -> int:
        """How many proposals a drafted cycle verifies, given each one's chance: those whose
        expected tokens beat what plain decoding would commit in their rows' time (after_draft)."""
        rate = 1 / self.costs.plain_s()
        return max(range(1, self.B), key=lambda n: expected_tokens(p_accept, n) - rate * self.costs.cycle_s(n))

    def _pays(self) -> bool:
        tokens, steps = self.drafting()
        return tokens >= steps

    def before_draft(self) -> Decision | None:
        """A plain step's Decision (plain steps follow until keep_plain says no), or None: draft."""
        if not self.adaptive or not self.drafted_any or self.plain_streak:  # the first cycle, or a probe is due
            return None
        # set here, not cleared by observing a drafted cycle: a pipelined run decides a cycle
        # before it observes the one in flight
        self.calibrating = False
        plain_s = self.costs.plain_s()
        if self._pays():  # drafting goes on, judged by a plain step's cost as last timed
            if self.since_plain is not None and self.since_plain < RECALIBRATE:
                return None
            self.calibrating = True
            return _plain_step(plain_s, f"timing {CALIBRATION_STEPS} plain steps, against which drafting is judged")
        tokens, steps = self.drafting()
        return _plain_step(plain_s, f"drafted cycles lately commit {tokens:.1f} tokens each for {steps:.1f} steps")

    def keep_plain(self) -> bool:
        """Whether the plain steps go on (asked with one step in flight): until drafting's recent
        cycles have faded enough that it is expected to pay again, or MAX_PROBE_WAIT steps, or
        sooner where the target has been sure of its own tokens lately, which is where a draft is
        accepted: when, taking the target's recent probability as the chance that each proposal
        is accepted, a drafted cycle would pay for itself."""
        if self.calibrating:
            return self.plain_streak + 1 < CALIBRATION_STEPS
        if self.plain_streak + 1 >= MAX_PROBE_WAIT or self._pays():
            return False
        if not self.early_probes or len(self.target_sure) < self.target_sure.maxlen:
            return True
        sure = sum(self.target_sure) / len(self.target_sure)
        v = self.B - 1
        self.early_probe = expected_tokens([sure] * v, v) >= self.costs.cycle_s(v) / self.costs.plain_s()
        return not self.early_probe

    def after_draft(self, confidence: list | None) -> Decision:
        """How many proposals to verify, given the draft's probability of each (None: not read;
        the acceptance by block position stands in)."""
        plain_s = self.costs.plain_s()
        p = self.acceptance.p(confidence)
        probe = self.adaptive and self.plain_streak > 0 and not self.calibrating
        if self.adaptive:
            # The draft is paid for; each further row must earn more tokens than plain decoding
            # would in its time (Dinkelbach's criterion for a rate, maximise tokens - rate *
            # seconds, at the plain rate: a lower bound of the best rate, which keeps rows that
            # the predictor undervalues where accepted runs are long). At least one row: a cycle
            # that verifies nothing tells nothing.
            v = self._verified(p)
        elif self.min_confidence > 0:
            v = confident_prefix(confidence, self.min_confidence)
        else:
            v = self.B - 1
        tokens, steps = expected_tokens(p, v), self.costs.cycle_s(v) / plain_s
        why = f"expected {tokens:.1f} tokens for {steps:.1f} steps"
        if v < self.B - 1:
            why += f"; proposal {v + 1} would be accepted with chance {p[v]:.0%}"
        if probe:
            reason = f"probe after {self.plain_streak} plain steps: verify {v} of {self.B - 1}, {why}"
        elif self.adaptive:
            reason = f"verify {v} of {self.B - 1}: {why}"
        else:
            reason = f"fixed policy (min confidence {self.min_confidence:g}): verify {v} of {self.B - 1}, {why}"
        return Decision(v, False, tokens, steps, plain_s * 1e3, reason)

    def copy_length(self, p_copied: list) -> int:
        """How many of a copy's tokens to verify, given each one's chance of acceptance (those
        before it accepted): as many as earn more tokens than plain decoding would in their rows'
        time (after_draft's criterion; a copy pays no draft forward), at least one."""
        rate = 1 / self.costs.plain_s()
        return max(
            range(1, len(p_copied) + 1), key=lambda n: expected_tokens(p_copied, n) - rate * self.costs.verify_s(n)
        )

    def copy_alone(self, p_copied: list, why: str) -> Decision | None:
        """A copy verified without a draft forward, where its expected tokens per step beat what
        the run would do otherwise: drafted cycles at their recent rate, or plain steps; else None
        (the draft runs, and copy_instead may still choose the copy)."""
        v = self.copy_length(p_copied)
        tokens, steps = expected_tokens(p_copied, v), self.costs.verify_s(v) / self.costs.plain_s()
        drafted_tokens, drafted_steps = self.drafting()
        if tokens / steps <= max(drafted_tokens / drafted_steps, 1.0):
            return None
        why += f"{_first(v, p_copied)}: expected {tokens:.1f} tokens for {steps:.1f} steps, no draft forward"
        why += f" (drafted cycles lately {drafted_tokens:.1f} for {drafted_steps:.1f})"
        return Decision(v, False, tokens, steps, self.costs.plain_s() * 1e3, why, draft_forward=False)

    def copy_instead(self, p_copied: list, why: str, drafted: Decision) -> Decision | None:
        """The copy instead of the draft's block (its forward already paid), where its expected
        tokens less what its rows cost, at plain decoding's rate (after_draft's criterion), beat
        the block's; else None."""
        plain_s = self.costs.plain_s()
        v = self.copy_length(p_copied)
        tokens = expected_tokens(p_copied, v)
        worth = tokens - self.costs.verify_s(v) / plain_s
        if worth <= drafted.expected_tokens - self.costs.verify_s(drafted.verified) / plain_s:
            return None
        why += f"{_first(v, p_copied)}: expected {tokens:.1f} tokens, the draft's block {drafted.expected_tokens:.1f}"
        steps = drafted.predicted_steps + (self.costs.verify_s(v) - self.costs.verify_s(drafted.verified)) / plain_s
        return Decision(v, False, tokens, steps, plain_s * 1e3, why)

    def observe(self, ev: CycleEvent, seconds: float):
        """A finished cycle: its timing and outcome update the models."""
        plain = ev.decision.plain_step
        if not plain and self.plain_streak:
            # A probe pays for leaving plain steps, which drafting, if it goes on, does not pay
            # again: it runs alone (nothing is launched behind a cycle whose outcome decides the
            # next), and a synchronous run's probe extends the draft's context by every plain
            # step's features at once. Its outcome counts at the cost the model predicts.
            seconds = self.costs.cycle_s(ev.verified)
        else:
            seconds = self.costs.observe(plain, ev.verified, seconds)
        tokens = ev.accepted_len + 1
        self.rate.age(tokens)
        if plain:
            self.plain_streak += 1
            self.since_plain = 0
            self.target_sure.append(ev.confidence[0])
            return
        self.acceptance.observe(ev)
        self.rate.add(tokens, seconds)
        self.drafted_any = True
        self.since_plain = None if self.since_plain is None else self.since_plain + 1
        paid = self._pays()
        self.early_probes = paid or (self.early_probes and not self.early_probe)
        self.early_probe = False
        self.plain_streak = 0
        self.target_sure.clear()
