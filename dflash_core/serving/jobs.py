"""One admitted request's run (Job): generated on the worker, its text cut at stop strings
(StopCut) and queued for the client, whether or not the client reads."""

import asyncio
import threading
import time

import anyio
from fastapi import Request
from mlx_lm.generate import wired_limit

from ..engine.events import CycleEvent, RunSummary
from ..models.tokenizer import TextStream


class StopCut:
    """Cuts generated text where the first stop string begins. add() takes newly completed text
    and returns what may be sent now: a tail that could still grow into a stop string is held back
    until the next text settles it. Only whole characters come in, so a stop string whose
    character was split across cycles is found once that character is complete."""

    def __init__(self, stops: list):
        self.stops = [s for s in stops if s]
        self.text, self.sent = "", 0
        self.at = None  # where the stop string begins, once found

    def add(self, new: str) -> str:
        if self.at is not None:
            return ""
        self.text += new
        found = [i for s in self.stops if (i := self.text.find(s, self.sent)) >= 0]
        if found:
            self.at = min(found)
            return self._send(self.at)
        return self._send(len(self.text) - self._held_back())

    def finish(self, rest: str) -> str:
        """At the end of the run: the rest of the text, unless a stop string cut it."""
        piece = self.add(rest)
        return piece if self.at is not None else piece + self._send(len(self.text))

    def _held_back(self) -> int:
        """How many trailing characters could be the start of a stop string."""
        hold = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(self.text)), hold, -1):
                if self.text.endswith(s[:n]):
                    hold = n
                    break
        return hold

    def _send(self, upto: int) -> str:
        piece = self.text[self.sent : upto]
        self.sent = max(self.sent, upto)
        return piece


class Job:
    """One admitted request's run. run() generates on the worker, feeds the metrics and queues
    the client's text in `pieces` (None ends them); it returns once the engine has stopped,
    whether or not anyone reads. With a `buffer`, a client that leaves more pieces than that
    unread is cut off: its run is cancelled rather than let its text pile up. After run(),
    `outcome` is set, and unless the run was cancelled before it started, `finish_reason`,
    `usage` and `summary` too."""

    def __init__(self, server, rid, endpoint, ids, max_tokens, sampling, use_dflash, stops, buffer=None, policy=None):
        self.server, self.rid, self.endpoint = server, rid, endpoint
        self.ids, self.max_tokens = ids, max_tokens
        self.sampling = sampling  # None: greedy
        self.policy = policy  # DFlash's verification policy (POLICIES; None: the engine's default)
        self.stops = stops
        self.path = "dflash" if use_dflash else "plain"
        self.buffer = buffer
        self.pieces = asyncio.Queue()
        self.cancel = threading.Event()
        self.client_gone = self.cut_off = False
        self.outcome = self.finish_reason = self.usage = self.summary = self.error = None
        self.t_arrival = time.perf_counter()

    def _events(self):
        """The engine's events, on the worker thread, inside mlx-lm's wired limit as mlx-lm's own
        generation runs (on Apple silicon it keeps the weights resident; elsewhere a no-op)."""
        pair, stop = self.server.pair, self.cancel.is_set
        with wired_limit(pair.model):
            if self.path == "dflash":
                # the fixed policy's threshold is the server's (None: the backend's default)
                fixed = self.policy == "fixed"
                yield from pair.dflash(
                    self.ids,
                    self.max_tokens,
                    should_stop=stop,
                    min_confidence=self.server.min_confidence if fixed else None,
                    sampling=self.sampling,
                    policy=self.policy,
                )
            else:
                yield from pair.baseline(self.ids, self.max_tokens, stop, sampling=self.sampling)

    async def run(self):
        pair, metrics = self.server.pair, self.server.metrics
        words, cut = TextStream(pair.tokenizer, pair.eos_ids), StopCut(self.stops)
        tokens, used = [], None
        try:
            async for ev in self.server.worker.astream(self._events, self.cancel):
                if isinstance(ev, RunSummary):
                    self.summary = ev
                    continue
                new = self._count(ev)
                if not tokens:
                    metrics.first_token.labels(path=self.path).observe(time.perf_counter() - self.t_arrival)
                if cut.at is not None:
                    continue  # the engine stops at its next check; what it made meanwhile is dropped
                before = len(tokens)
                tokens += new
                self._give(cut.add(words.add(new)))
                if cut.at is not None:
                    used = self._tokens_for(tokens, cut.at, before)
                    self.cancel.set()
            self._give(cut.finish(words.finish()))
            if self.summary is not None:
                stopped = cut.at is not None
                self.finish_reason = "stop" if stopped or self.summary.stop_reason == "eos" else "length"
                generated = self.summary.generated if not stopped else used or len(tokens)
                self.usage = {
                    "prompt_tokens": len(self.ids),
                    "completion_tokens": generated,
                    "total_tokens": len(self.ids) + generated,
                    "prompt_tokens_details": {"cached_tokens": self.summary.cached_prompt_tokens},
                }
        except Exception as e:  # the engine failed: the client is told (a 500, or an error event)
            self.error = e
        finally:
            self.outcome = (
                "cut_off" if self.cut_off else "cancelled" if self.client_gone else self.finish_reason or "error"
            )
            self.server.release()
            record = {
                "id": self.rid,
                "endpoint": self.endpoint,
                "path": self.path,
                "outcome": self.outcome,
                "time": time.time(),
            }
            metrics.finish(record, self.summary, time.perf_counter() - self.t_arrival)
            self.pieces.put_nowait(None)

    def _count(self, ev) -> list:
        """Feed an engine event to the metrics; the tokens it committed."""
        if isinstance(ev, CycleEvent):
            self.server.metrics.cycle(ev)
            return ev.committed
        self.server.metrics.generation_tokens.labels(path="plain").inc()
        return [ev.token]

    def _give(self, piece: str):
        if not piece or self.cut_off:
            return
        if self.buffer is not None and self.pieces.qsize() >= self.buffer:
            self.cut_off = True
            self.cancel.set()
            return
        self.pieces.put_nowait(piece)

    def _tokens_for(self, tokens: list, cut: int, lo: int) -> int:
        """The fewest generated tokens (more than lo) whose text reaches past `cut`, where a stop
        string begins: what the client was given, for `usage`."""
        for n in range(lo + 1, len(tokens)):
            if len(self.server.pair.text(tokens[:n])) > cut:
                return n
        return len(tokens)

    def client_left(self):
        """The client hung up: a run still going is cancelled at its next cycle."""
        if self.outcome is None:
            self.client_gone = True
            self.cancel.set()

    async def text(self, request: Request) -> str:
        """Run to the end and return the whole text. The client may hang up meanwhile: nothing is
        sent until the end, so its disconnect is watched for."""
        async with anyio.create_task_group() as watch:
            watch.start_soon(self._cancel_on_disconnect, request)
            await self.run()
            watch.cancel_scope.cancel()
        pieces = []
        while (piece := self.pieces.get_nowait()) is not None:
            pieces.append(piece)
        return "".join(pieces)

    async def _cancel_on_disconnect(self, request: Request):
        while (await request.receive())["type"] != "http.disconnect":
            pass
        self.client_left()
