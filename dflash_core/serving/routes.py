"""An OpenAI-compatible HTTP server over one loaded pair, with Prometheus metrics.

Every request runs through DFlash: greedy at temperature 0 (or absent), speculative sampling
above it (the target's own distribution, `top_p` and `seed` honoured). A request field
`"dflash": false` asks for plain decoding through mlx-lm instead (for A/B comparisons), and every
response says which path served it in the `x-dflash-path` header (`dflash` or `plain`). All MLX work runs on the one worker thread, so
concurrent requests queue there and each gets exactly the tokens a lone run would give.

DFlash runs under the server's verification policy (`serve --policy`: adaptive, which may take plain
one-token steps where drafting does not pay, or fixed, the draft's confident prefix of every block;
none given: the engine's default, policy.default_policy); a request field
`"dflash_policy": "adaptive" | "fixed"` overrides it for that request.

Waiting holds no thread: the handlers are async and await the worker's events, so /health and
/metrics answer however many requests wait. The queue is bounded: `max_queue` requests may wait
behind the one generating, more are answered 429 with a Retry-After header. A run never waits
for its client: it goes on at the worker's pace and queues its text for the client; a client that
hangs up (streamed or not) has its run cancelled at the next cycle, and a streaming client that
leaves more than `stream_buffer` pieces of text unread is cut off. Metrics are fed only from the
engine's own events: CycleEvents while a request runs, its RunSummary at the end; the prefix
cache's counts are its own, read when /metrics is scraped.

A prefix cache (`prefix_cache_mb`, `serve --prefix-cache-mb`) keeps snapshots of what earlier runs
fed the target: a conversation's next turn restores its longest cached prefix and prefills only
the new tokens (dflash_core.prefix_cache); `usage.prompt_tokens_details.cached_tokens` says how many.

With an API key the /v1 routes want it as a Bearer token; /health, /metrics and /metrics.json stay
open for monitors.
"""

import asyncio
import collections
import json
import math
import secrets
import threading
import time
import uuid

import anyio
from fastapi import APIRouter, Depends, FastAPI, Header, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from mlx_lm.generate import wired_limit
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException

from ..engine.events import CycleEvent, RunSummary
from ..engine.policy import POLICIES
from ..engine.prefix_cache import DEFAULT_PREFIX_CACHE_MB, PrefixCache
from ..engine.sampling import Sampling
from ..errors import DFlashError
from ..models.tokenizer import TextStream, chat_ids
from .worker import default_worker

DEFAULT_MAX_TOKENS = 256  # when a request gives none (clipped to the room left in the context)
MAX_QUEUE = 64  # requests that may wait behind the one generating
STREAM_BUFFER = 256  # pieces of text a streaming client may leave unread before it is cut off
HISTORY = 50  # request summaries kept for /metrics.json


# --- requests (the OpenAI fields this server understands; others are ignored) ---------------


class _Base(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: dict | None = None
    seed: int | None = None
    dflash: bool = True  # false: plain decoding (greedy or sampling) through mlx-lm, for comparisons
    dflash_policy: str | None = None  # "adaptive" | "fixed": this request's verification policy (None: the server's)
    n: int = 1
    logprobs: bool | int | None = None


class _ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: str
    text: str | None = None


class _Message(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: str
    content: str | list[_ContentPart] | None = None


class ChatRequest(_Base):
    messages: list[_Message] = Field(min_length=1)
    max_completion_tokens: int | None = None
    tools: list | None = None
    chat_template_kwargs: dict | None = None  # e.g. {"enable_thinking": true}; thinking is off unless asked


class CompletionRequest(_Base):
    prompt: str | list[str] | list[int]
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None


class APIError(Exception):
    """A request the server refuses, answered in OpenAI's error shape."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str = None,
        code: str = None,
        kind: str = "invalid_request_error",
        headers: dict = None,
    ):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind
        self.headers = headers

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


CUT_OFF = APIError(
    503,
    "the stream was cut off: this client read it too slowly, and the server does not "
    "hold a run's text back for long; read the stream as it comes",
    code="client_too_slow",
    kind="server_error",
)


# --- metrics ---------------------------------------------------------------------------------


class Metrics:
    """Prometheus counters in a registry of their own, plus the last requests' summaries."""

    def __init__(self, block_size: int, prefix_cache: PrefixCache = None):
        self.registry = r = CollectorRegistry()
        if prefix_cache is not None:
            r.register(_PrefixCacheCollector(prefix_cache))
        self.drafts = Counter(
            "dflash_spec_decode_num_drafts", "DFlash cycles that drafted a block (plain steps draft none)", registry=r
        )
        self.draft_tokens = Counter(
            "dflash_spec_decode_num_draft_tokens", "Draft proposals the target verified", registry=r
        )
        self.accepted = Counter(
            "dflash_spec_decode_num_accepted_tokens", "Draft tokens accepted by the target", registry=r
        )
        self.accepted_per_pos = Counter(
            "dflash_spec_decode_num_accepted_tokens_per_pos",
            "Drafted cycles whose draft was accepted at this position (0 = first proposal)",
            ["position"],
            registry=r,
        )
        self.prompt_tokens = Counter("dflash_prompt_tokens", "Prompt tokens prefilled", ["path"], registry=r)
        self.generation_tokens = Counter("dflash_generation_tokens", "Tokens generated", ["path"], registry=r)
        self.requests = Counter(
            "dflash_requests",
            "Requests by serving path and outcome (stop, length; cancelled: the client "
            "hung up; cut_off: it read its stream too slowly; error; refused: invalid, unauthorized, queue_full)",
            ["path", "outcome"],
            registry=r,
        )
        self.running = Gauge("dflash_requests_running", "Requests generating or queued for the worker", registry=r)
        self.latency = Histogram(
            "dflash_request_latency_seconds",
            "Request time from arrival to last token",
            ["path"],
            registry=r,
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
        )
        self.first_token = Histogram(
            "dflash_time_to_first_token_seconds",
            "Request time from arrival to its first committed token (queueing and prefill)",
            ["path"],
            registry=r,
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
        )
        self.tokens_per_cycle = Histogram(
            "dflash_tokens_per_cycle",
            "Tokens committed per DFlash cycle (plain steps included: one each)",
            registry=r,
            buckets=tuple(range(1, block_size + 1)),
        )
        self.plain_steps = Counter(
            "dflash_policy_plain_steps",
            "Cycles where the adaptive policy drafted nothing: one plain target step over the staged token",
            registry=r,
        )
        self.verified_rows = Histogram(
            "dflash_policy_verified_rows",
            "Draft proposals the target verified per DFlash cycle, as the policy chose (plain steps at 0)",
            registry=r,
            buckets=tuple(range(block_size)),
        )
        for k in range(block_size - 1):  # every position shows, at 0 until accepted once
            self.accepted_per_pos.labels(position=str(k))
        self.recent = collections.deque(maxlen=HISTORY)
        self._lock = threading.Lock()

    def cycle(self, ev: CycleEvent):
        if ev.plain_step:
            self.plain_steps.inc()
        else:
            self.drafts.inc()
        self.verified_rows.observe(ev.verified)
        self.draft_tokens.inc(ev.verified)
        self.accepted.inc(ev.accepted_len)
        for k in range(ev.accepted_len):
            self.accepted_per_pos.labels(position=str(k)).inc()
        self.tokens_per_cycle.observe(len(ev.committed))
        self.generation_tokens.labels(path="dflash").inc(len(ev.committed))

    def finish(self, record: dict, summary: RunSummary | None, latency: float):
        path, outcome = record["path"], record["outcome"]
        self.requests.labels(path=path, outcome=outcome).inc()
        if summary is not None:
            self.prompt_tokens.labels(path=path).inc(summary.prompt_tokens)
            self.latency.labels(path=path).observe(latency)
            record.update(summary.stats(), latency_s=round(latency, 4))
        with self._lock:
            self.recent.append(record)

    def refused(self, outcome: str):
        self.requests.labels(path="none", outcome=outcome).inc()

    def mean_run_seconds(self) -> float:
        """How long the worker spent on a request lately (prefill and decoding; 1 s before any)."""
        with self._lock:
            runs = [r["prefill_s"] + r["decode_s"] for r in self.recent if "decode_s" in r]
        return sum(runs) / len(runs) if runs else 1.0

    def totals(self) -> dict:
        get = self.registry.get_sample_value
        return {
            "drafts": get("dflash_spec_decode_num_drafts_total"),
            "draft_tokens": get("dflash_spec_decode_num_draft_tokens_total"),
            "accepted_tokens": get("dflash_spec_decode_num_accepted_tokens_total"),
            "plain_steps": get("dflash_policy_plain_steps_total"),
        }

    def snapshot(self) -> dict:
        with self._lock:
            recent = list(self.recent)
        return {"totals": self.totals(), "requests": recent}


class _PrefixCacheCollector:
    """The prefix cache's own counts, read when /metrics is scraped (the worker thread keeps
    them; the playground's runs on the same pair count too)."""

    def __init__(self, cache: PrefixCache):
        self.cache = cache

    def collect(self):
        c = self.cache
        for name, doc, value in (
            ("hits", "DFlash runs whose prompt began with a cached prefix", c.hits),
            ("misses", "DFlash runs whose prompt began with no cached prefix", c.misses),
            ("reused_tokens", "Prompt tokens restored from prefix snapshots instead of prefilled", c.reused_tokens),
            ("evictions", "Prefix snapshots dropped to stay within the cache's bytes", c.evictions),
        ):
            yield CounterMetricFamily(f"dflash_prefix_cache_{name}", doc, value=value)
        yield GaugeMetricFamily("dflash_prefix_cache_bytes", "Bytes the prefix snapshots hold", value=c.nbytes)
        yield GaugeMetricFamily("dflash_prefix_cache_limit_bytes", "The prefix cache's limit", value=c.max_bytes)
        yield GaugeMetricFamily("dflash_prefix_cache_snapshots", "Prefix snapshots held", value=len(c))


# --- generation ------------------------------------------------------------------------------


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


class _SSE(StreamingResponse):
    """Closes its body generator however the response ends (Starlette leaves that to the
    garbage collector when the client disconnects)."""

    media_type = "text/event-stream"

    async def stream_response(self, send):
        try:
            await super().stream_response(send)
        finally:
            with anyio.CancelScope(shield=True):
                await self.body_iterator.aclose()


def _internal_error(e: Exception) -> APIError:
    return APIError(500, f"internal error: {type(e).__name__}: {e}".splitlines()[0], kind="server_error")


def _sse(obj) -> str:
    return f"data: {json.dumps(obj)}\n\n"


# --- the app ---------------------------------------------------------------------------------


class Server:
    def __init__(
        self,
        pair,
        model_id: str,
        worker=None,
        api_key: str = None,
        max_queue: int = MAX_QUEUE,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        stream_buffer: int = STREAM_BUFFER,
        policy: str = None,
        min_confidence: float = None,
        prefix_cache_mb: int = DEFAULT_PREFIX_CACHE_MB,
    ):
        self.pair, self.model_id = pair, model_id
        # the pair's DFlash runs (the playground's on it too) resume from this cache's snapshots
        pair.prefix_cache = PrefixCache(prefix_cache_mb * 2**20) if prefix_cache_mb else None
        self.policy, self.min_confidence = server_policy(pair, policy, min_confidence)
        self.worker = worker or default_worker()
        self.api_key, self.max_queue = api_key, max_queue
        self.default_max_tokens, self.stream_buffer = max_tokens, stream_buffer
        self.metrics = Metrics(pair.block_size, pair.prefix_cache)
        self.started = int(time.time())
        self.admitted = 0  # requests generating or waiting for the worker
        self._runs = set()  # streamed runs' tasks (the event loop keeps only weak references)

    @staticmethod
    def new_id(prefix: str) -> str:
        return f"{prefix}{uuid.uuid4().hex[:24]}"

    def check_key(self, authorization: str | None):
        if self.api_key is None:
            return
        scheme, _, key = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not secrets.compare_digest(key.strip().encode(), self.api_key.encode()):
            raise APIError(
                401,
                "this server wants an API key: send it as the header 'Authorization: Bearer KEY'",
                code="invalid_api_key",
                headers={"WWW-Authenticate": "Bearer"},
            )

    def check_model(self, name):
        if name is not None and name not in (self.model_id, self.pair.name):
            raise APIError(
                404,
                f"model '{name}' is not served here; this server serves '{self.model_id}' (see GET /v1/models)",
                param="model",
                code="model_not_found",
            )

    def check_supported(self, req, fields: dict):
        if req.n != 1:
            raise APIError(400, "only n=1 is supported", param="n")
        for name, default in fields.items():
            value = getattr(req, name, default)
            if value not in (default, None, False, 0, []):
                raise APIError(400, f"'{name}' is not supported by this server", param=name)

    def chat_ids(self, messages, template_kwargs: dict = None) -> list:
        tok = self.pair.tokenizer
        if not getattr(tok, "has_chat_template", False):
            raise APIError(400, "this model has no chat template; use /v1/completions", param="messages")
        msgs = []
        for m in messages:
            if isinstance(m.content, list):
                if any(p.type != "text" for p in m.content):
                    raise APIError(400, "only text content parts are supported", param="messages")
                content = "".join(p.text or "" for p in m.content)
            else:
                content = m.content or ""
            msgs.append({"role": m.role, "content": content})
        try:
            ids = chat_ids(tok, msgs, template_kwargs)
        except Exception as e:  # the template itself refuses (e.g. roles out of order)
            raise APIError(
                400, f"the chat template refused these messages: {e}".splitlines()[0], param="messages"
            ) from None
        return self._room(ids, "messages")

    def completion_ids(self, prompt) -> list:
        if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
            if len(prompt) != 1:
                raise APIError(400, "only one prompt per request is supported", param="prompt")
            prompt = prompt[0]
        if isinstance(prompt, str):
            try:
                return self.pair.encode(prompt, chat_template=False)
            except DFlashError as e:
                raise APIError(400, str(e), param="prompt") from None
        vocab = self.pair.draft.config.vocab_size
        if not prompt or not all(0 <= t < vocab for t in prompt):
            raise APIError(400, f"token prompts must be non-empty ids in 0..{vocab - 1}", param="prompt")
        return self._room(list(prompt), "prompt")

    def _room(self, ids, param) -> list:
        if not ids:
            raise APIError(400, "the prompt is empty", param=param)
        if len(ids) >= self.pair.context_length:
            raise APIError(
                400,
                f"the prompt has {len(ids)} tokens but the model's context is {self.pair.context_length}; shorten it",
                param=param,
            )
        return ids

    def request_policy(self, value) -> str | None:
        """The verification policy a request's "dflash_policy" asks for, else the server's (None:
        the engine's default for the request, policy.default_policy)."""
        if value is None:
            return self.policy
        if value not in POLICIES:
            raise APIError(
                400,
                f'dflash_policy {json.dumps(value)} is not a policy: use "adaptive" or "fixed", '
                f"or leave it out for this server's ({self.policy or 'the default'})",
                param="dflash_policy",
            )
        if value == "adaptive" and getattr(self.pair, "fixed_policy_only", False):
            raise APIError(
                400,
                "dflash_policy 'adaptive' cannot run here: the target is split across processes, which would "
                'each decide from their own timings; use "fixed" or leave it out',
                param="dflash_policy",
            )
        return value

    def job(self, rid, endpoint, req, ids, max_tokens, param: str = "max_tokens") -> Job:
        """The request's run, checked. `param` names the field max_tokens came from."""
        policy = self.request_policy(req.dflash_policy)
        if max_tokens is None:
            max_tokens = min(self.default_max_tokens, self.pair.context_length - len(ids))
        try:
            self.pair.check_request(ids, max_tokens, 2)
        except DFlashError as e:
            raise APIError(400, f"{param}: {e}", param=param) from None
        stops = [req.stop] if isinstance(req.stop, str) else (req.stop or [])
        sampling = Sampling(req.temperature, req.top_p or 1.0, req.seed) if req.temperature else None
        return Job(
            self,
            rid,
            endpoint,
            ids,
            max_tokens,
            sampling,
            req.dflash,
            stops,
            buffer=self.stream_buffer if req.stream else None,
            policy=policy,
        )

    def admit(self):
        """Take a place in the worker's queue, or refuse with 429 when all are taken."""
        if self.admitted > self.max_queue:  # the one generating, and max_queue waiting
            raise APIError(
                429,
                f"the server is busy: {self.admitted} requests are running or waiting; "
                "retry after the time in the Retry-After header",
                code="queue_full",
                kind="rate_limit_error",
                headers={"Retry-After": str(max(1, math.ceil(self.metrics.mean_run_seconds())))},
            )
        self.admitted += 1
        self.metrics.running.inc()

    def release(self):
        self.admitted -= 1
        self.metrics.running.dec()

    def start(self, job: Job):
        """Run a streamed job on a task of its own: it goes on whether or not the client reads."""
        task = asyncio.create_task(job.run())
        self._runs.add(task)
        task.add_done_callback(self._runs.discard)


def server_policy(pair, policy: str = None, min_confidence: float = None) -> tuple:
    """(policy, min_confidence) a server runs DFlash under, checked: policy None is fixed when a
    min_confidence is given or the pair can run nothing else (a target split across processes:
    distributed.Leader.fixed_policy_only), else None: the engine's default for each request
    (policy.default_policy: adaptive, but fixed for seeded sampling, which must repeat)."""
    fixed_only = getattr(pair, "fixed_policy_only", False)
    policy = policy or ("fixed" if min_confidence is not None or fixed_only else None)
    if policy is not None and policy not in POLICIES:
        raise DFlashError(f"policy '{policy}' is not one of {', '.join(POLICIES)}")
    if policy == "adaptive" and min_confidence is not None:
        raise DFlashError("a min confidence applies to the fixed policy: give the fixed policy, or no min confidence")
    if policy == "adaptive" and fixed_only:
        raise DFlashError(
            "the adaptive policy cannot serve a target split across processes (each would decide from its "
            "own timings): use the fixed policy"
        )
    return policy, min_confidence


def create_app(
    pair,
    model_id: str = None,
    worker=None,
    api_key: str = None,
    allowed_origins: list = None,
    max_queue: int = MAX_QUEUE,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    stream_buffer: int = STREAM_BUFFER,
    policy: str = None,
    min_confidence: float = None,
    prefix_cache_mb: int = DEFAULT_PREFIX_CACHE_MB,
) -> FastAPI:
    """The API, its health check and metrics; app.state.server is the Server behind them, for
    whatever a caller mounts beside them. api_key: wanted as a Bearer token on /v1. allowed_origins:
    the web origins whose pages may call the API (CORS). max_queue: requests that may wait behind
    the one generating. max_tokens: the default for requests that give none. stream_buffer: the
    pieces of text a streaming client may leave unread before it is cut off. policy: DFlash's
    verification policy ("adaptive" | "fixed"; None: fixed when min_confidence is given, else the
    engine's default for each request, see server_policy), which a request's "dflash_policy"
    overrides; min_confidence: the fixed policy's threshold (None: the backend's default).
    prefix_cache_mb: the bytes (MiB) of prefix snapshots the pair's DFlash runs resume from
    (dflash_core.prefix_cache; 0: none)."""
    server = Server(
        pair,
        model_id or pair.name,
        worker,
        api_key,
        max_queue,
        max_tokens,
        stream_buffer,
        policy,
        min_confidence,
        prefix_cache_mb,
    )
    app = FastAPI(title="DFlash server", docs_url="/docs", redoc_url=None)
    app.state.server = server
    if allowed_origins:
        app.add_middleware(
            CORSMiddleware, allow_origins=list(allowed_origins), allow_methods=["*"], allow_headers=["*"]
        )

    @app.exception_handler(APIError)
    async def _api_error(request, e: APIError):
        server.metrics.refused({401: "unauthorized", 429: "queue_full"}.get(e.status, "invalid"))
        return e.response()

    @app.exception_handler(RequestValidationError)
    async def _bad_request(request, e: RequestValidationError):
        server.metrics.refused("invalid")
        err = e.errors()[0]
        if err.get("type") == "json_invalid":
            return APIError(
                400, f"the request body is not valid JSON ({err.get('ctx', {}).get('error', 'parse error')})"
            ).response()
        where = ".".join(str(x) for x in err.get("loc", ()) if x != "body")
        return APIError(400, f"{where or 'body'}: {err.get('msg')}", param=where or None).response()

    @app.exception_handler(HTTPException)
    async def _http_error(request, e: HTTPException):
        return APIError(e.status_code, str(e.detail), code="not_found" if e.status_code == 404 else None).response()

    @app.exception_handler(Exception)
    async def _internal(request, e: Exception):
        return _internal_error(e).response()

    async def respond(request: Request, job: Job, make_body, make_chunk, stream_usage: bool):
        headers = {"x-dflash-path": job.path}
        server.admit()
        if make_chunk is None:
            text = await job.text(request)
            if job.error is not None:
                raise job.error
            if job.summary is None:  # the client hung up before its run began: nobody reads this
                return Response(status_code=499)  # nginx's "client closed request"
            return JSONResponse(make_body(text, job), headers=headers)
        server.start(job)

        async def events():
            try:
                while (piece := await job.pieces.get()) is not None:
                    yield _sse(make_chunk(piece, None))
            finally:
                job.client_left()  # if the run goes on, the client left early (or was cut off)
            if job.error is not None or job.cut_off:  # the status line is sent: say it in the stream
                yield _sse((CUT_OFF if job.cut_off else _internal_error(job.error)).body())
                yield "data: [DONE]\n\n"
                return
            yield _sse(make_chunk(None, job.finish_reason))
            if stream_usage:
                yield _sse({**make_chunk(None, None), "choices": [], "usage": job.usage})
            yield "data: [DONE]\n\n"

        return _SSE(events(), headers=headers)

    def _wants_usage(req) -> bool:
        return bool(req.stream_options and req.stream_options.get("include_usage"))

    async def require_key(authorization: str | None = Header(None)):
        server.check_key(authorization)

    api = APIRouter(dependencies=[Depends(require_key)])

    @api.post("/v1/chat/completions")
    async def chat_completions(req: ChatRequest, request: Request):
        server.check_model(req.model)
        server.check_supported(req, {"logprobs": None, "tools": None})
        ids = server.chat_ids(req.messages, req.chat_template_kwargs)
        rid, created, model = server.new_id("chatcmpl-"), int(time.time()), server.model_id
        if req.max_completion_tokens is not None:  # OpenAI's newer name wins, as in its API
            job = server.job(rid, "chat", req, ids, req.max_completion_tokens, "max_completion_tokens")
        else:
            job = server.job(rid, "chat", req, ids, req.max_tokens)

        def body(text, job):
            return {
                "id": rid,
                "object": "chat.completion",
                "created": created,
                "model": model,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": text},
                        "logprobs": None,
                        "finish_reason": job.finish_reason,
                    }
                ],
                "usage": job.usage,
                "dflash": {"path": job.path, **job.summary.stats()},
            }

        first = [True]

        def chunk(delta, finish):
            d = {} if delta is None else {"content": delta}
            if first[0]:
                d, first[0] = {"role": "assistant", **d}, False
            return {
                "id": rid,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "choices": [{"index": 0, "delta": d, "logprobs": None, "finish_reason": finish}],
            }

        return await respond(request, job, body, chunk if req.stream else None, req.stream and _wants_usage(req))

    @api.post("/v1/completions")
    async def completions(req: CompletionRequest, request: Request):
        server.check_model(req.model)
        server.check_supported(req, {"logprobs": None, "echo": False, "suffix": None, "best_of": 1})
        ids = server.completion_ids(req.prompt)
        rid, created, model = server.new_id("cmpl-"), int(time.time()), server.model_id
        job = server.job(rid, "completion", req, ids, req.max_tokens)

        def body(text, job):
            return {
                "id": rid,
                "object": "text_completion",
                "created": created,
                "model": model,
                "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": job.finish_reason}],
                "usage": job.usage,
                "dflash": {"path": job.path, **job.summary.stats()},
            }

        def chunk(delta, finish):
            return {
                "id": rid,
                "object": "text_completion",
                "created": created,
                "model": model,
                "choices": [{"index": 0, "text": delta or "", "logprobs": None, "finish_reason": finish}],
            }

        return await respond(request, job, body, chunk if req.stream else None, req.stream and _wants_usage(req))

    def model_card():
        return {
            "id": server.model_id,
            "object": "model",
            "created": server.started,
            "owned_by": "dflash",
            "pair": pair.name,
        }

    @api.get("/v1/models")
    async def models():
        return {"object": "list", "data": [model_card()]}

    @api.get("/v1/models/{name:path}")
    async def model(name: str):
        server.check_model(name)
        return model_card()

    app.include_router(api)

    @app.get("/health")
    async def health():
        return {
            "status": "ok",
            "model": server.model_id,
            "pair": pair.name,
            "block_size": pair.block_size,
            "context_length": pair.context_length,
            "policy": server.policy or "default",  # default: the engine's, per request (server_policy)
            "requests_running": server.admitted,
        }

    @app.get("/metrics")
    async def metrics():
        return PlainTextResponse(generate_latest(server.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/metrics.json")
    async def metrics_json():
        return server.metrics.snapshot()

    return app


def serve(app: FastAPI, host: str = "127.0.0.1", port: int = 8000):
    """Serve an app from create_app (with whatever its caller mounted beside the API) until interrupted."""
    import uvicorn

    uvicorn.run(app, host=host, port=port, log_level="info")
