"""An OpenAI-compatible HTTP server over one loaded pair, with Prometheus metrics.

Greedy requests (temperature 0 or absent) run through DFlash; temperature > 0 is plain sampling
through mlx-lm (speculative sampling is not implemented), and every response says which path
served it in the `x-dflash-path` header. All MLX work runs on the one worker thread, so
concurrent requests queue there and each gets exactly the tokens a lone run would give.
Metrics are fed only from the engine's own events: CycleEvents while a request runs, its
RunSummary at the end.
"""
import collections
import json
import sys
import threading
import time
import uuid
from typing import Optional, Union

import anyio
import mlx.core as mx
from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from mlx_lm.sample_utils import make_sampler
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException

from .errors import DFlashError
from .events import CycleEvent, RunSummary
from .worker import default_worker

DEFAULT_MAX_TOKENS = 256  # when a request gives none (clipped to the room left in the context)
HISTORY = 50  # request summaries kept for /metrics.json


# --- requests (the OpenAI fields this server understands; others are ignored) ---------------

class _Base(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: Optional[str] = None
    max_tokens: Optional[int] = None
    temperature: Optional[float] = Field(None, ge=0, le=2)
    top_p: Optional[float] = Field(None, gt=0, le=1)
    stop: Union[str, list[str], None] = None
    stream: bool = False
    stream_options: Optional[dict] = None
    seed: Optional[int] = None
    n: int = 1
    logprobs: Union[bool, int, None] = None


class _ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: str
    text: Optional[str] = None


class _Message(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: str
    content: Union[str, list[_ContentPart], None] = None


class ChatRequest(_Base):
    messages: list[_Message] = Field(min_length=1)
    max_completion_tokens: Optional[int] = None
    tools: Optional[list] = None


class CompletionRequest(_Base):
    prompt: Union[str, list[str], list[int]]
    echo: bool = False
    suffix: Optional[str] = None
    best_of: Optional[int] = None


class APIError(Exception):
    """A request the server refuses, answered in OpenAI's error shape."""

    def __init__(self, status: int, message: str, param: str = None, code: str = None,
                 kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status)


# --- metrics ---------------------------------------------------------------------------------

class Metrics:
    """Prometheus counters in a registry of their own, plus the last requests' summaries."""

    def __init__(self, block_size: int):
        self.registry = r = CollectorRegistry()
        self.drafts = Counter("dflash_spec_decode_num_drafts", "DFlash cycles (one draft block each)", registry=r)
        self.draft_tokens = Counter("dflash_spec_decode_num_draft_tokens", "Draft proposals the target verified", registry=r)
        self.accepted = Counter("dflash_spec_decode_num_accepted_tokens", "Draft tokens accepted by the target", registry=r)
        self.accepted_per_pos = Counter(
            "dflash_spec_decode_num_accepted_tokens_per_pos",
            "Cycles whose draft was accepted at this position (0 = first proposal)", ["position"], registry=r)
        self.prompt_tokens = Counter("dflash_prompt_tokens", "Prompt tokens prefilled", ["path"], registry=r)
        self.generation_tokens = Counter("dflash_generation_tokens", "Tokens generated", ["path"], registry=r)
        self.requests = Counter("dflash_requests", "Requests by serving path and outcome", ["path", "outcome"], registry=r)
        self.running = Gauge("dflash_requests_running", "Requests generating or queued for the worker", registry=r)
        self.latency = Histogram("dflash_request_latency_seconds", "Request time from arrival to last token",
                                 ["path"], registry=r,
                                 buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300))
        self.first_token = Histogram("dflash_time_to_first_token_seconds",
                                     "Request time from arrival to its first committed token (queueing and prefill)",
                                     ["path"], registry=r, buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60))
        self.tokens_per_cycle = Histogram("dflash_tokens_per_cycle", "Tokens committed per DFlash cycle",
                                          registry=r, buckets=tuple(range(1, block_size + 1)))
        for k in range(block_size - 1):  # every position shows, at 0 until accepted once
            self.accepted_per_pos.labels(position=str(k))
        self.recent = collections.deque(maxlen=HISTORY)
        self._lock = threading.Lock()

    def cycle(self, ev: CycleEvent):
        self.drafts.inc()
        self.draft_tokens.inc(ev.verified)
        self.accepted.inc(ev.accepted_len)
        for k in range(ev.accepted_len):
            self.accepted_per_pos.labels(position=str(k)).inc()
        self.tokens_per_cycle.observe(len(ev.committed))
        self.generation_tokens.labels(path="dflash").inc(len(ev.committed))

    def finish(self, record: dict, summary: Optional[RunSummary], latency: float):
        path, outcome = record["path"], record["outcome"]
        self.requests.labels(path=path, outcome=outcome).inc()
        if summary is not None:
            self.prompt_tokens.labels(path=path).inc(summary.prompt_tokens)
            self.latency.labels(path=path).observe(latency)
            record.update(summary.stats(), latency_s=round(latency, 4))
        with self._lock:
            self.recent.append(record)

    def invalid(self):
        self.requests.labels(path="none", outcome="invalid").inc()

    def totals(self) -> dict:
        get = self.registry.get_sample_value
        return {
            "drafts": get("dflash_spec_decode_num_drafts_total"),
            "draft_tokens": get("dflash_spec_decode_num_draft_tokens_total"),
            "accepted_tokens": get("dflash_spec_decode_num_accepted_tokens_total"),
        }

    def snapshot(self) -> dict:
        with self._lock:
            recent = list(self.recent)
        return {"totals": self.totals(), "requests": recent}


# --- generation ------------------------------------------------------------------------------

def sample_generate(pair, prompt_ids, max_tokens, temperature, top_p, seed, should_stop):
    """Plain sampling through mlx-lm (the temperature > 0 path). Runs on the worker thread."""
    if seed is not None:
        mx.random.seed(seed)
    sampler = make_sampler(temp=temperature, top_p=top_p or 0.0)
    return pair.baseline(prompt_ids, max_tokens, should_stop, sampler=sampler)


def _held_back(text: str, stops: list) -> int:
    """How many trailing characters must not be sent yet: the start of a stop string, or an
    incomplete UTF-8 character (decoded as one U+FFFD until its last byte arrives)."""
    hold = 1 if text.endswith("\ufffd") else 0
    for s in stops:
        for n in range(min(len(s) - 1, len(text)), 0, -1):
            if text.endswith(s[:n]):
                hold = max(hold, n)
                break
    return hold


def _first_stop(text: str, stops: list, start: int):
    """Where the earliest stop string begins in text[start:], or None."""
    found = [i for s in stops if (i := text.find(s, start)) >= 0]
    return min(found, default=None)


class Detokenizer:
    """The text of the tokens so far, decoding only the tokens since the last complete
    character (decoding everything per cycle is quadratic in the output length)."""

    CONTEXT = 4  # finished tokens decoded along with the new ones: SentencePiece drops the
    # leading space of a sequence's first token, so new tokens are never decoded on their own

    def __init__(self, decode, skip: set):
        self.decode, self.skip = decode, skip
        self.text, self.done, self.pending = "", [], []  # text and tokens up to a character boundary; tokens after it

    def add(self, tokens: list) -> str:
        self.pending += [t for t in tokens if t not in self.skip]
        ctx = self.done[-self.CONTEXT:]
        head, full = self.decode(ctx), self.decode(ctx + self.pending)
        tail = full[len(head):] if full.startswith(head) else self.decode(self.pending)
        if tail.endswith("\ufffd"):
            return self.text + tail
        self.text, self.done, self.pending = self.text + tail, ctx + self.pending, []
        return self.text


class Job:
    """One request's generation. `text_deltas()` is a plain generator, consumed on a request
    thread (never the worker's): it yields text as the engine commits it, cuts at stop strings,
    and feeds the metrics. After it ends, `finish_reason` and `usage` are set."""

    def __init__(self, server, rid, endpoint, ids, max_tokens, temperature, top_p, seed, stops):
        self.server, self.rid, self.endpoint = server, rid, endpoint
        self.ids, self.max_tokens = ids, max_tokens
        self.temperature, self.top_p, self.seed = temperature, top_p, seed
        self.stops = [s for s in stops if s]
        self.path = "dflash" if not temperature else "sampling"
        self.cancel = threading.Event()
        self.client_gone = False
        self.finish_reason, self.usage, self.summary = None, None, None
        self.t_arrival = time.perf_counter()

    def _events(self):
        pair, cancel = self.server.pair, self.cancel
        if self.path == "dflash":
            return pair.dflash(self.ids, self.max_tokens, should_stop=cancel.is_set)
        return sample_generate(pair, self.ids, self.max_tokens, self.temperature, self.top_p, self.seed,
                               cancel.is_set)

    def text_deltas(self):
        metrics = self.server.metrics
        detok = Detokenizer(self.server.pair.decode, self.server.pair.eos_ids)
        tokens, text, sent, used, stopped = [], "", 0, None, False
        metrics.running.inc()
        outcome = "error"
        try:
            for ev in self.server.worker.stream(self._events, self.cancel):
                if isinstance(ev, RunSummary):
                    self.summary = ev
                    continue
                if isinstance(ev, CycleEvent):
                    metrics.cycle(ev)
                    new = ev.committed
                else:
                    metrics.generation_tokens.labels(path="sampling").inc()
                    new = [ev.token]
                if not tokens and not stopped:
                    metrics.first_token.labels(path=self.path).observe(time.perf_counter() - self.t_arrival)
                if stopped:
                    continue  # the engine stops at its next check; what it made meanwhile is dropped
                tokens += new
                text = detok.add(new)
                cut = _first_stop(text, self.stops, sent)
                if cut is not None:
                    stopped, used = True, self._tokens_for(tokens, cut, len(tokens) - len(new))
                    self.cancel.set()
                    if cut > sent:
                        yield text[sent:cut]
                    continue
                safe = len(text) - _held_back(text, self.stops)
                if safe > sent:
                    yield text[sent:safe]
                    sent = safe
            s = self.summary
            if not stopped and len(text) > sent:
                yield text[sent:]
            self.finish_reason = "stop" if stopped or s.stop_reason == "eos" else "length"
            generated = used if stopped else s.generated
            self.usage = {"prompt_tokens": len(self.ids), "completion_tokens": generated,
                          "total_tokens": len(self.ids) + generated}
            outcome = self.finish_reason
        finally:
            metrics.running.dec()
            if self.client_gone:
                outcome = "cancelled"
            record = {"id": self.rid, "endpoint": self.endpoint, "path": self.path,
                      "outcome": outcome, "time": time.time()}
            metrics.finish(record, self.summary, time.perf_counter() - self.t_arrival)

    def _tokens_for(self, tokens: list, cut: int, lo: int) -> int:
        """The fewest generated tokens (more than lo) whose text reaches past `cut`, where a stop
        string begins: what the client was given, for `usage`."""
        for n in range(lo + 1, len(tokens)):
            if len(self.server.pair.text(tokens[:n])) > cut:
                return n
        return len(tokens)

    def collect(self) -> str:
        return "".join(self.text_deltas())

    async def stream_deltas(self):
        """The same deltas for an async response. If the client goes away (this generator is
        closed early), the engine is told to stop and the rest is drained, so the worker is
        free for the next request and the metrics still see the run."""
        deltas = self.text_deltas()
        try:
            while (delta := await anyio.to_thread.run_sync(next, deltas, None)) is not None:
                yield delta
        finally:
            if self.finish_reason is None:
                self.client_gone = True
                self.cancel.set()
                with anyio.CancelScope(shield=True):
                    await anyio.to_thread.run_sync(collections.deque, deltas, 0)


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
    def __init__(self, pair, model_id: str, worker=None):
        self.pair, self.model_id = pair, model_id
        self.worker = worker or default_worker()
        self.metrics = Metrics(pair.block_size)
        self.started = int(time.time())

    @staticmethod
    def new_id(prefix: str) -> str:
        return f"{prefix}{uuid.uuid4().hex[:24]}"

    def check_model(self, name):
        if name is not None and name not in (self.model_id, self.pair.name):
            raise APIError(404, f"model '{name}' is not served here; this server serves '{self.model_id}' "
                                "(see GET /v1/models)", param="model", code="model_not_found")

    def check_supported(self, req, fields: dict):
        if req.n != 1:
            raise APIError(400, "only n=1 is supported", param="n")
        for name, default in fields.items():
            value = getattr(req, name, default)
            if value not in (default, None, False, 0, []):
                raise APIError(400, f"'{name}' is not supported by this server", param=name)

    def chat_ids(self, messages) -> list:
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
            text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False, enable_thinking=False)
        except Exception as e:  # the template itself refuses (e.g. roles out of order)
            raise APIError(400, f"the chat template refused these messages: {e}".splitlines()[0], param="messages") from None
        return self._room(tok.encode(text, add_special_tokens=False), "messages")

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
            raise APIError(400, f"the prompt has {len(ids)} tokens but the model's context is "
                                f"{self.pair.context_length}; shorten it", param=param)
        return ids

    def job(self, rid, endpoint, req, ids, max_tokens) -> Job:
        if max_tokens is None:
            max_tokens = min(DEFAULT_MAX_TOKENS, self.pair.context_length - len(ids))
        try:
            self.pair.check_request(ids, max_tokens, 2)
        except DFlashError as e:
            raise APIError(400, str(e), param="max_tokens") from None
        stops = [req.stop] if isinstance(req.stop, str) else (req.stop or [])
        return Job(self, rid, endpoint, ids, max_tokens, req.temperature, req.top_p, req.seed, stops)


def create_app(pair, model_id: str = None, worker=None, playground: dict = None) -> FastAPI:
    """The API; with `playground` (build_app's model/draft, e.g. {"model": None, "draft": None}
    for the shipped default) also the Gradio playground at /, when the `ui` package is present."""
    server = Server(pair, model_id or pair.name, worker)
    app = FastAPI(title="DFlash server", docs_url="/docs", redoc_url=None)
    app.state.server = server

    @app.exception_handler(APIError)
    async def _api_error(request, e: APIError):
        server.metrics.invalid()
        return e.response()

    @app.exception_handler(RequestValidationError)
    async def _bad_request(request, e: RequestValidationError):
        server.metrics.invalid()
        err = e.errors()[0]
        if err.get("type") == "json_invalid":
            return APIError(400, f"the request body is not valid JSON ({err.get('ctx', {}).get('error', 'parse error')})").response()
        where = ".".join(str(x) for x in err.get("loc", ()) if x != "body")
        return APIError(400, f"{where or 'body'}: {err.get('msg')}", param=where or None).response()

    @app.exception_handler(HTTPException)
    async def _http_error(request, e: HTTPException):
        return APIError(e.status_code, str(e.detail), code="not_found" if e.status_code == 404 else None).response()

    @app.exception_handler(Exception)
    async def _internal(request, e: Exception):
        return _internal_error(e).response()

    def respond(job: Job, make_body, make_chunk, stream_usage: bool):
        headers = {"x-dflash-path": job.path}
        if make_chunk is None:
            text = job.collect()
            return JSONResponse(make_body(text, job), headers=headers)

        async def events():
            deltas = job.stream_deltas()
            try:
                async for delta in deltas:
                    yield _sse(make_chunk(delta, None))
            except Exception as e:  # the status line is sent: say it in the stream, as OpenAI does
                yield _sse(_internal_error(e).body())
                yield "data: [DONE]\n\n"
                return
            finally:
                await deltas.aclose()  # the client may be gone: this stops the engine
            yield _sse(make_chunk(None, job.finish_reason))
            if stream_usage:
                yield _sse({**make_chunk(None, None), "choices": [], "usage": job.usage})
            yield "data: [DONE]\n\n"

        return _SSE(events(), headers=headers)

    def _wants_usage(req) -> bool:
        return bool(req.stream_options and req.stream_options.get("include_usage"))

    @app.post("/v1/chat/completions")
    def chat_completions(req: ChatRequest):
        server.check_model(req.model)
        server.check_supported(req, {"logprobs": None, "tools": None})
        ids = server.chat_ids(req.messages)
        rid, created, model = server.new_id("chatcmpl-"), int(time.time()), server.model_id
        job = server.job(rid, "chat", req, ids, req.max_completion_tokens or req.max_tokens)

        def body(text, job):
            return {"id": rid, "object": "chat.completion", "created": created, "model": model,
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                 "logprobs": None, "finish_reason": job.finish_reason}],
                    "usage": job.usage, "dflash": {"path": job.path, **job.summary.stats()}}

        first = [True]

        def chunk(delta, finish):
            d = {} if delta is None else {"content": delta}
            if first[0]:
                d, first[0] = {"role": "assistant", **d}, False
            return {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
                    "choices": [{"index": 0, "delta": d, "logprobs": None, "finish_reason": finish}]}

        return respond(job, body, chunk if req.stream else None, req.stream and _wants_usage(req))

    @app.post("/v1/completions")
    def completions(req: CompletionRequest):
        server.check_model(req.model)
        server.check_supported(req, {"logprobs": None, "echo": False, "suffix": None, "best_of": 1})
        ids = server.completion_ids(req.prompt)
        rid, created, model = server.new_id("cmpl-"), int(time.time()), server.model_id
        job = server.job(rid, "completion", req, ids, req.max_tokens)

        def body(text, job):
            return {"id": rid, "object": "text_completion", "created": created, "model": model,
                    "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": job.finish_reason}],
                    "usage": job.usage, "dflash": {"path": job.path, **job.summary.stats()}}

        def chunk(delta, finish):
            return {"id": rid, "object": "text_completion", "created": created, "model": model,
                    "choices": [{"index": 0, "text": delta or "", "logprobs": None, "finish_reason": finish}]}

        return respond(job, body, chunk if req.stream else None, req.stream and _wants_usage(req))

    def model_card():
        return {"id": server.model_id, "object": "model", "created": server.started, "owned_by": "dflash",
                "pair": pair.name}

    @app.get("/v1/models")
    def models():
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{name:path}")
    def model(name: str):
        server.check_model(name)
        return model_card()

    @app.get("/health")
    def health():
        return {"status": "ok", "model": server.model_id, "pair": pair.name, "block_size": pair.block_size,
                "context_length": pair.context_length,
                "requests_running": server.metrics.registry.get_sample_value("dflash_requests_running")}

    @app.get("/metrics")
    def metrics():
        return PlainTextResponse(generate_latest(server.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/metrics.json")
    def metrics_json():
        return server.metrics.snapshot()

    if playground is not None:
        app.state.playground = mount_playground(app, server, **playground)
    return app


def mount_playground(app: FastAPI, server: Server, model: str = None, draft: str = None) -> bool:
    """Mount the Gradio playground at / when the `ui` package is present, offering the served
    pair (model/draft as given to `serve`) first, already loaded. The API routes keep priority
    (they were added first). A playground that cannot be built leaves the API running."""
    try:
        import gradio as gr
        from ui import build_app
    except ImportError:
        return False
    try:
        blocks, launch_kwargs = build_app(model, draft, worker=server.worker, pair=server.pair)
    except DFlashError as e:
        print(f"warning: the playground is not served: {e}", file=sys.stderr)
        return False
    gr.mount_gradio_app(app, blocks, path="/", **launch_kwargs)
    return True


def serve(pair, model_id: str, host: str = "127.0.0.1", port: int = 8000, playground: dict = None):
    import uvicorn

    app = create_app(pair, model_id, playground=playground)
    uvicorn.run(app, host=host, port=port, log_level="info")
