"""What stands behind the routes (Server): the API key and model checks, prompts into token
ids, each request's checked run, and the worker's queue (admit, refuse with 429, release)."""

import asyncio
import json
import math
import secrets
import time
import uuid

from ..engine.policy import POLICIES
from ..engine.prefix_cache import DEFAULT_PREFIX_CACHE_MB, PrefixCache
from ..engine.sampling import Sampling
from ..errors import DFlashError
from ..models.tokenizer import chat_ids
from .jobs import Job
from .metrics import Metrics
from .protocol import APIError
from .worker import default_worker

DEFAULT_MAX_TOKENS = 256  # when a request gives none (clipped to the room left in the context)
MAX_QUEUE = 64  # requests that may wait behind the one generating
STREAM_BUFFER = 256  # pieces of text a streaming client may leave unread before it is cut off


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
        self.policy, self.min_confidence = policy, min_confidence  # checked: routes.server_policy
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
