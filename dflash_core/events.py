"""Plain records of what the engines did. The UI, CLI, server and benchmark all read these;
nothing downstream recomputes them."""

from dataclasses import asdict, dataclass, field

from .sampling import Draws, Sampling


@dataclass
class CycleEvent:
    """One DFlash cycle: draft, verify, accept, commit, rollback."""

    cycle: int  # 0-based
    staged_token: int  # the target's own choice, known before this cycle
    drafted: list  # the draft's B-1 proposals
    verified: int  # how many of them the target checked: B-1, fewer under min_confidence
    posterior: list  # the target's greedy choice after each of the verified + 1 positions
    accepted_len: int  # a: greedy, the longest prefix where drafted == posterior[:-1]; sampling, kept by the draws
    committed: list  # [staged, drafted[:a]] (cut at EOS / max tokens)
    next_staged: int  # a correction when a < verified, a bonus when a = verified: greedy, posterior[a];
    # sampling, a draw from the residual max(0, p - q) after a rejection, else from p
    kv_trimmed: int  # attention-cache entries dropped per attention layer (verified - a)
    gdn_replayed: int  # GatedDeltaNet steps replayed per linear layer (a+1; 0 if none)
    draft_ms: float
    verify_ms: float
    rollback_ms: float
    t: float  # seconds since decoding started (after prefill), when committed
    draws: Draws | None = None  # sampling only: p(d), q(d) and the uniform draw per examined proposal

    @property
    def block_size(self) -> int:
        return len(self.drafted) + 1

    @property
    def is_bonus(self) -> bool:
        return self.accepted_len == self.verified


@dataclass
class CycleTally:
    """The running statistics of a DFlash run, kept one cycle at a time: the engine's summary and
    the page's live figures both come from here."""

    block_size: int
    cycles: int = 0
    committed_tokens: int = 0
    drafted_tokens: int = 0  # proposals the target verified
    accepted_tokens: int = 0
    accepted_per_position: list = None  # k=1..B-1: cycles accepting >= k

    def __post_init__(self):
        if self.accepted_per_position is None:
            self.accepted_per_position = [0] * (self.block_size - 1)

    def add(self, ev: CycleEvent) -> "CycleTally":
        self.cycles += 1
        self.committed_tokens += len(ev.committed)
        self.drafted_tokens += ev.verified
        self.accepted_tokens += ev.accepted_len
        for k in range(ev.accepted_len):
            self.accepted_per_position[k] += 1
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
    def acceptance_by_position(self) -> list:
        """Fraction of cycles whose draft was accepted at block position k = 1..B-1."""
        return [n / self.cycles for n in self.accepted_per_position] if self.cycles else []


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
    accepted_per_position: list = field(default_factory=list)  # k=1..B-1: cycles accepting >= k
    sampling: Sampling | None = None  # None: greedy

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
