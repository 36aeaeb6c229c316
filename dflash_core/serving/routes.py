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
the new tokens (dflash_core.engine.prefix_cache); `usage.prompt_tokens_details.cached_tokens` says how many.

With an API key the /v1 routes want it as a Bearer token; /health, /metrics and /metrics.json stay
open for monitors.
"""

import time

import anyio
from fastapi import APIRouter, Depends, FastAPI, Header, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException

from ..engine.policy import POLICIES
from ..engine.prefix_cache import DEFAULT_PREFIX_CACHE_MB
from ..errors import DFlashError
from .jobs import Job
from .protocol import CUT_OFF, APIError, ChatRequest, CompletionRequest, internal_error, sse
from .queue import DEFAULT_MAX_TOKENS, MAX_QUEUE, STREAM_BUFFER, Server


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
    (dflash_core.engine.prefix_cache; 0: none)."""
    policy, min_confidence = server_policy(pair, policy, min_confidence)
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
        return internal_error(e).response()

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
                    yield sse(make_chunk(piece, None))
            finally:
                job.client_left()  # if the run goes on, the client left early (or was cut off)
            if job.error is not None or job.cut_off:  # the status line is sent: say it in the stream
                yield sse((CUT_OFF if job.cut_off else internal_error(job.error)).body())
                yield "data: [DONE]\n\n"
                return
            yield sse(make_chunk(None, job.finish_reason))
            if stream_usage:
                yield sse({**make_chunk(None, None), "choices": [], "usage": job.usage})
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
