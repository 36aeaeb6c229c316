"""Moved to dflash_core.serving (routes, queue, jobs, metrics, protocol); this name stays for imports."""

from .serving.jobs import Job, StopCut  # noqa: F401
from .serving.metrics import Metrics  # noqa: F401
from .serving.protocol import APIError, ChatRequest, CompletionRequest  # noqa: F401
from .serving.queue import DEFAULT_MAX_TOKENS, MAX_QUEUE, STREAM_BUFFER, Server  # noqa: F401
from .serving.routes import create_app, serve, server_policy  # noqa: F401
