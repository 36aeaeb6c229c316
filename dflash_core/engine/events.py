"""Plain records of what the engines did. The UI, CLI, server and benchmark all read these;
nothing downstream recomputes them."""

from bisect import bisect_right
from dataclasses import asdict, dataclass, field

from .sampling import Draws, Sampling

# upper edges of the draft-confidence bins acceptance is counted in (the last bin ends at 1)
CONFIDENCE_EDGES = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99)


def confidence_bin(c: float) -> int:
    return bisect_right(CONFIDENCE_EDGES, c)


def confidence_outcomes(ev: "CycleEvent"):
    """(confidence bin, accepted) of each proposal a cycle tells about: the verified ones up to
    and including the first rejection."""
    for k in range(min(ev.accepted_len + 1, ev.verified)):
        yield confidence_bin(ev.confidence[k]), k < ev.accepted_len


@dataclass
class Decision:
    """What the policy chose for one cycle (dflash_core.engine.policy), and why."""

    verified: int  # proposals the target checks
    plain_step: bool  # no draft forward: a one-token target step (verified 0)
    expected_tokens: float  # tokens the cycle was expected to commit
    predicted_steps: float  # its predicted cost, in plain one-token steps
    step_ms: float  # the cost model's plain step when it decided
    reason: str  # one line, for the inspector
    draft_forward: bool = True  # whether the draft ran (not in a plain step, nor for a copy verified alone)


@dataclass
class CycleEvent:
    """One DFlash cycle: draft, verify, accept, commit, rollback. A plain step (decision.plain_step)
    drafts nothing and verifies only the staged token."""

    cycle: int  # 0-based
    block_size: int  # B: the draft's block (its forward proposes B-1 tokens)
    staged_token: int  # the target's own choice, known before this cycle
    drafted: list  # the draft's B-1 proposals; [] in a plain step
    confidence: list  # the draft's probability of each proposal; a plain step: the target's of its token
    verified: int  # how many of them the target checked (the policy's v)
    posterior: list  # the target's greedy choice after each of the verified + 1 positions
    accepted_len: int  # a: greedy, the longest prefix where drafted == posterior[:-1]; sampling, kept by the draws
    committed: list  # [staged, drafted[:a]] (cut at EOS / max tokens)
    next_staged: int  # a correction when a < verified, a bonus when a = verified: greedy, posterior[a];
    # sampling, a draw from the residual max(0, p - q) after a rejection, else from p
    kv_trimmed: int  # attention-cache entries dropped per attention layer (verified - a)
    gdn_replayed: int  # GatedDeltaNet steps replayed per linear layer (a+1; 0 if none)
    # a pipelined cycle (dflash_core.engine.pipeline): draft_ms is the host's time to build and
    # launch the whole cycle, verify_ms the rest of its share of the pipeline's time
    draft_ms: float
    verify_ms: float
    rollback_ms: float
    t: float  # seconds since decoding started (after prefill), when committed
    decision: Decision | None = None
    draws: Draws | None = None  # sampling only: p(d), q(d) and the uniform draw per examined proposal
    # where `drafted` holds tokens copied from the context instead (dflash_core.engine.copy_source): the
    # prompt + output position of the first, which followed an earlier occurrence of the last
    # `copy_match` tokens; None: the draft proposed them (its confidence: the copy's acceptance rate)
    copied_from: int | None = None
    copy_match: int = 0

    @property
    def source(self) -> str:
        """Where the proposals came from: "draft", "copy", or "plain" (a plain step has none)."""
        return "plain" if self.plain_step else "draft" if self.copied_from is None else "copy"

    @property
    def draft_ran(self) -> bool:
        """Whether the draft's forward ran: not in a plain step, nor for a copy verified alone."""
        return not self.plain_step and (self.decision is None or self.decision.draft_forward)

    @property
    def plain_step(self) -> bool:
        return not self.drafted

    @property
    def is_bonus(self) -> bool:
        return self.accepted_len == self.verified and not self.plain_step

    @property
    def cycle_ms(self) -> float:
        return self.draft_ms + self.verify_ms + self.rollback_ms

    @property
    def measured_steps(self) -> float | None:
        """The cycle's measured cost in the cost model's plain steps (None without a decision)."""
        return self.cycle_ms / self.decision.step_ms if self.decision else None


def plain_step_fields(committed: list, token: int, sure: float, decision, step_ms: float, t: float) -> dict:
    """A plain step's CycleEvent fields: nothing drafted, the staged token checked alone; its
    `confidence` is the target's own probability of the token it chose."""
    return dict(
        staged_token=committed[0],
        drafted=[],
        confidence=[sure],
        verified=0,
        posterior=[token],
        accepted_len=0,
        committed=committed,
        next_staged=token,
        kv_trimmed=0,
        gdn_replayed=0,
        draft_ms=0.0,
        verify_ms=step_ms,
        rollback_ms=0.0,
        t=t,
        decision=decision,
    )


@dataclass
class CycleTally:
    """The running statistics of a DFlash run, kept one cycle at a time: the engine's summary and
    the page's live figures both come from here."""

    block_size: int
    cycles: int = 0  # every target forward after prefill, plain steps included
    committed_tokens: int = 0
    drafted_tokens: int = 0  # proposals the target verified
    accepted_tokens: int = 0
    accepted_per_position: list = None  # k=1..B-1: drafted cycles accepting >= k
    plain_steps: int = 0
    verified_rows: list = None  # v = 0..B-1: cycles that verified v proposals (plain steps at 0)
    cycle_s: float = 0.0  # the cycles' measured draft + verify + rollback time
    by_confidence: list = None  # per confidence bin: [accepted, verified up to the first rejection]
    # cycles that verified a copy from the context: their count, committed tokens, verified and
    # accepted copied tokens (the drafted figures above count the draft's proposals only)
    copied_cycles: int = 0
    copied_committed: int = 0
    copied_verified: int = 0
    copied_accepted: int = 0

    def __post_init__(self):
        if self.by_confidence is None:
            self.by_confidence = [[0, 0] for _ in range(len(CONFIDENCE_EDGES) + 1)]
        if self.accepted_per_position is None:
            self.accepted_per_position = [0] * (self.block_size - 1)
        if self.verified_rows is None:
            self.verified_rows = [0] * self.block_size

    def add(self, ev: CycleEvent) -> "CycleTally":
        self.cycles += 1
        self.committed_tokens += len(ev.committed)
        self.cycle_s += ev.cycle_ms / 1e3
        if ev.source == "copy":
            self.copied_cycles += 1
            self.copied_committed += len(ev.committed)
            self.copied_verified += ev.verified
            self.copied_accepted += ev.accepted_len
            return self
        self.drafted_tokens += ev.verified
        self.accepted_tokens += ev.accepted_len
        for k in range(ev.accepted_len):
            self.accepted_per_position[k] += 1
        self.plain_steps += ev.plain_step
        self.verified_rows[ev.verified] += 1
        for b, accepted in confidence_outcomes(ev):
            self.by_confidence[b][0] += accepted
            self.by_confidence[b][1] += 1
        return self

    @classmethod
    def of(cls, cycles: list) -> "CycleTally":
        tally = cls(cycles[0].block_size if cycles else 0)
        for ev in cycles:
            tally.add(ev)
        return tally

    @property
    def tokens_per_cycle(self) -> float:
        return self.committed_tokens / self.cycles if self.cycles else 0.0

    @property
    def acceptance_rate(self) -> float:
        """accepted / drafted (vLLM's definition; not dflash-mlx's 1 - 1/tau)."""
        return self.accepted_tokens / self.drafted_tokens if self.drafted_tokens else 0.0

    @property
    def drafted_cycles(self) -> int:
        return self.cycles - self.plain_steps - self.copied_cycles

    @property
    def tokens_per_drafted_cycle(self) -> float:
        """What a drafted cycle commits (plain steps commit one each)."""
        n = self.drafted_cycles
        return (self.committed_tokens - self.plain_steps - self.copied_committed) / n if n else 0.0

    @property
    def tokens_per_copied_cycle(self) -> float:
        """What a cycle that verified a copy from the context commits."""
        return self.copied_committed / self.copied_cycles if self.copied_cycles else 0.0

    @property
    def copy_acceptance_rate(self) -> float:
        return self.copied_accepted / self.copied_verified if self.copied_verified else 0.0

    @property
    def acceptance_by_position(self) -> list:
        """Fraction of drafted cycles whose draft was accepted at block position k = 1..B-1."""
        n = self.drafted_cycles
        return [k / n for k in self.accepted_per_position] if n else []


@dataclass
class TokenEvent:
    """One baseline (plain greedy) token."""

    index: int
    token: int
    t: float  # seconds since decoding started (after prefill)


@dataclass
class RunSummary:
    engine: str  # "dflash" | "baseline" (plain greedy decoding) | "sampling" (plain sampling)
    prompt_tokens: int
    tokens: list  # generated ids after the prompt, EOS included if hit
    prefill_s: float
    decode_s: float
    stop_reason: str  # "eos" | "max_tokens" | "cancelled"
    peak_memory_mb: float
    block_size: int = 0
    min_confidence: float = 0.0
    cycles: int = 0
    drafted_tokens: int = 0  # proposals the target verified
    accepted_tokens: int = 0
    accepted_per_position: list = field(default_factory=list)  # k=1..B-1: drafted cycles accepting >= k
    sampling: Sampling | None = None  # None: greedy
    policy: str = ""  # "adaptive" | "fixed" (dflash_core.engine.policy)
    plain_steps: int = 0
    verified_rows: list = field(default_factory=list)  # v = 0..B-1: cycles that verified v proposals
    cycle_s: float = 0.0  # measured draft + verify + rollback time, summed over cycles
    acceptance_by_confidence: list = field(default_factory=list)  # per confidence bin: [accepted, verified]
    cached_prompt_tokens: int = 0  # prompt tokens restored from a prefix snapshot, not prefilled
    copy: bool = False  # proposals were also copied from the context (dflash_core.engine.copy_source)
    copied_cycles: int = 0  # as CycleTally's
    copied_committed: int = 0
    copied_verified: int = 0
    copied_accepted: int = 0
    pipelined: bool = False  # each cycle launched before the last one was read (dflash_core.engine.pipeline)
    compiled: bool = False  # ... and its drafted cycles ran as compiled graphs (pipeline.CompiledCycles)

    @property
    def generated(self) -> int:
        return len(self.tokens)

    @property
    def decode_tps(self) -> float:
        """Tokens after the first / time after the first: both engines know their first token
        when prefill ends, so this is decode speed alone."""
        return (self.generated - 1) / self.decode_s if self.decode_s > 0 else 0.0

    @property
    def tally(self) -> CycleTally:
        return CycleTally(
            self.block_size,
            self.cycles,
            self.generated,
            self.drafted_tokens,
            self.accepted_tokens,
            self.accepted_per_position,
            self.plain_steps,
            self.verified_rows,
            self.cycle_s,
            copied_cycles=self.copied_cycles,
            copied_committed=self.copied_committed,
            copied_verified=self.copied_verified,
            copied_accepted=self.copied_accepted,
        )

    @property
    def tokens_per_cycle(self) -> float:
        return self.tally.tokens_per_cycle

    @property
    def acceptance_rate(self) -> float:
        return self.tally.acceptance_rate

    @property
    def acceptance_by_position(self) -> list:
        return self.tally.acceptance_by_position

    def stats(self) -> dict:
        out = {
            "prompt_tokens": self.prompt_tokens,
            "cached_prompt_tokens": self.cached_prompt_tokens,
            "generated_tokens": self.generated,
            "prefill_s": round(self.prefill_s, 4),
            "decode_s": round(self.decode_s, 4),
            "decode_tps": round(self.decode_tps, 2),
            "stop_reason": self.stop_reason,
            "peak_memory_mb": round(self.peak_memory_mb, 1),
        }
        if self.sampling:
            out.update(temperature=self.sampling.temperature, top_p=self.sampling.top_p, seed=self.sampling.seed)
        if self.engine == "dflash":
            out.update(
                block_size=self.block_size,
                min_confidence=self.min_confidence,
                cycles=self.cycles,
                tokens_per_cycle=round(self.tokens_per_cycle, 3),
                drafted_tokens=self.drafted_tokens,
                accepted_tokens=self.accepted_tokens,
                acceptance_rate=round(self.acceptance_rate, 4),
                accepted_per_position=list(self.accepted_per_position),
                policy=self.policy,
                plain_steps=self.plain_steps,
                verified_rows=list(self.verified_rows),
                tokens_per_drafted_cycle=round(self.tally.tokens_per_drafted_cycle, 3),
                # how much of the decode time the measured cycle phases take: the speedup achieved
                # over the speedup the measured tokens per cycle and costs allow
                engine_efficiency=round(self.cycle_s / self.decode_s, 4) if self.decode_s > 0 else None,
                acceptance_by_confidence=self.acceptance_by_confidence,
                copy=self.copy,
                pipelined=self.pipelined,
                compiled=self.compiled,
            )
            if self.copy:  # tokens per cycle by the proposals' source
                tally = self.tally
                out.update(
                    copied_cycles=self.copied_cycles,
                    tokens_per_copied_cycle=round(tally.tokens_per_copied_cycle, 3),
                    copy_acceptance_rate=round(tally.copy_acceptance_rate, 4),
                )
        return out


def to_dict(event) -> dict:
    d = asdict(event)
    if isinstance(event, RunSummary):
        d.update(event.stats())
    return d


@dataclass
class Divergence:
    index: int  # first generated position where the two outputs differ
    dflash_token: int | None
    baseline_token: int | None
    top2_margin: float | None  # target's top-1 minus top-2 logit at that position


def lossless_verdict(dflash: RunSummary, baseline: RunSummary) -> str:
    """What the two runs show about losslessness: "identical" (token for token), "diverged",
    "partial" (one was stopped early and the tokens both have agree) or "sampled" (both sampled:
    the same distribution, so no token-for-token claim)."""
    if dflash.sampling or baseline.sampling:
        return "sampled"
    ours, ref = dflash.tokens, baseline.tokens
    if "cancelled" in (dflash.stop_reason, baseline.stop_reason):
        k = min(len(ours), len(ref))
        return "partial" if ours[:k] == ref[:k] else "diverged"
    return "identical" if ours == ref else "diverged"
