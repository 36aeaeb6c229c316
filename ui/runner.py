"""One playground request: the baseline alone, then DFlash alone (never both at once on the same
device), then the lossless check. Everything MLX runs on the worker thread; this module only
collects the engines' events into a `Comparison` that the page renders."""

import threading
from dataclasses import dataclass, field

from dflash_core.engine.events import Divergence, RunSummary, lossless_verdict, to_dict
from dflash_core.engine.sampling import Sampling


@dataclass
class Comparison:
    pair_name: str
    prompt: str
    prompt_ids: list
    max_tokens: int
    block_size: int
    chat_template: bool
    hybrid: bool = False
    min_confidence: float = None  # the fixed policy's threshold; None: the backend's default
    policy: str = "adaptive"  # "adaptive" | "fixed" (dflash_core.engine.policy.POLICIES)
    sampling: Sampling = None  # None: greedy, both engines; else plain vs speculative sampling, seeded alike
    thinking: bool = False  # the chat template's thinking mode was on
    draft_quant: int = None  # bits of the draft's quantized linear layers; None: as stored
    copy: bool = False  # proposals also copied from the context (dflash_core.engine.copy_source)
    stage: str = "queued"  # baseline | dflash | check | done
    baseline: list = field(default_factory=list)  # TokenEvents
    baseline_summary: RunSummary = None
    cycles: list = field(default_factory=list)  # CycleEvents
    dflash_summary: RunSummary = None
    verdict: str = "pending"  # identical | diverged | partial | pending | sampled
    divergence: Divergence = None

    @property
    def stopped(self) -> bool:
        return any(s is not None and s.stop_reason == "cancelled" for s in (self.baseline_summary, self.dflash_summary))

    def dflash_tokens(self) -> list:
        return [t for c in self.cycles for t in c.committed]

    def to_json(self) -> dict:
        return {
            "pair": self.pair_name,
            "prompt": self.prompt,
            "prompt_ids": self.prompt_ids,
            "settings": {
                "max_tokens": self.max_tokens,
                "block_size": self.block_size,
                "chat_template": self.chat_template,
                "thinking": self.thinking,
                "draft_quant": self.draft_quant,
                "copy": self.copy,
                "policy": self.dflash_summary.policy if self.dflash_summary else self.policy,
                # the threshold applies to the fixed policy alone
                "min_confidence": self.dflash_summary.min_confidence
                if self.dflash_summary and self.dflash_summary.policy == "fixed"
                else None,
                "temperature": self.sampling.temperature if self.sampling else 0.0,
                "top_p": self.sampling.top_p if self.sampling else 1.0,
                "seed": self.sampling.seed if self.sampling else None,
            },
            "baseline": {
                "events": [to_dict(e) for e in self.baseline],
                "summary": to_dict(self.baseline_summary) if self.baseline_summary else None,
            },
            "dflash": {
                "events": [to_dict(e) for e in self.cycles],
                "summary": to_dict(self.dflash_summary) if self.dflash_summary else None,
            },
            "lossless": {"verdict": self.verdict, "divergence": to_dict(self.divergence) if self.divergence else None},
        }


def _engine_stream(worker, make_iter, user_stop: threading.Event):
    """Stream one engine on the worker. The engine stops at its next cycle when the user presses
    Stop or when the page goes away (worker.stream sets `closed` as the generator closes)."""
    closed = threading.Event()

    def should_stop():
        return user_stop.is_set() or closed.is_set()

    return worker.stream(lambda: make_iter(should_stop), closed)


def _run_stage(worker, run: Comparison, stage: str, make_iter, user_stop: threading.Event):
    """One engine into `run`: its per-step events into run.baseline / run.cycles, its summary
    into run.<stage>_summary; yields `run` before the engine starts and after each event."""
    events = run.baseline if stage == "baseline" else run.cycles
    run.stage = stage
    yield run  # before the engine starts: the page shows the new stage without slowing the run
    for ev in _engine_stream(worker, make_iter, user_stop):
        if isinstance(ev, RunSummary):
            setattr(run, f"{stage}_summary", ev)
        else:
            events.append(ev)
        yield run


def compare(worker, pair, run: Comparison, user_stop: threading.Event):
    """Fill `run` event by event, yielding it after each one. Raises DFlashError on bad input."""
    ids, n, B = run.prompt_ids, run.max_tokens, run.block_size
    worker.call(pair.check_request, ids, n, B)

    yield from _run_stage(
        worker, run, "baseline", lambda stop: pair.baseline(ids, n, stop, sampling=run.sampling), user_stop
    )
    if user_stop.is_set():
        run.stage, run.verdict = "done", "partial"
        yield run
        return
    yield from _run_stage(
        worker,
        run,
        "dflash",
        lambda stop: pair.dflash(
            ids,
            n,
            B,
            stop,
            min_confidence=run.min_confidence if run.policy == "fixed" else None,
            sampling=run.sampling,
            policy=run.policy,
            copy=run.copy,
        ),
        user_stop,
    )
    if run.sampling:  # the same distribution, not the same tokens: nothing to compare token by token
        run.stage, run.verdict = "done", "sampled"
        yield run
        return

    run.stage = "check"
    yield run
    run.verdict = lossless_verdict(run.dflash_summary, run.baseline_summary)
    if run.verdict == "diverged":
        ours, ref = run.dflash_summary.tokens, run.baseline_summary.tokens
        if run.stopped:  # where the tokens both have first differ
            k = min(len(ours), len(ref))
            ours, ref = ours[:k], ref[:k]
        run.divergence = worker.call(pair.divergence, ids, ours, ref)
    run.stage = "done"
    yield run
