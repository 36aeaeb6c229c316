"""serve: the OpenAI-compatible API, Prometheus metrics and the playground in one process."""
import socket

from ..argtypes import positive_int
from ..errors import DFlashError
from ..loading import DEFAULT_PAIR
from ..worker import default_worker
from .common import add_pair_args, load, log


def add_parser(sub):
    p = sub.add_parser("serve", help="serve an OpenAI-compatible API with metrics (and the playground)",
                       description="One process: POST /v1/chat/completions and /v1/completions (greedy through "
                                   "DFlash, temperature > 0 by plain sampling), GET /v1/models, /health, "
                                   "/metrics (Prometheus), /metrics.json, and the playground at /.")
    add_pair_args(p)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=positive_int, default=8000, help="default 8000")
    p.add_argument("--no-playground", action="store_true", help="serve the API only, without the UI at /")
    p.set_defaults(func=run)


def _check_port(host: str, port: int):
    """Say so in one line now, rather than in uvicorn's log after the model has loaded."""
    if not 1 <= port <= 65535:
        raise DFlashError(f"port {port} is out of range: use 1..65535")
    try:
        with socket.create_server((host, port)):
            pass
    except OSError as e:
        raise DFlashError(f"cannot listen on {host}:{port} ({e.strerror}); pick another --port or --host") from None


def run(args) -> int:
    from ..server import serve

    _check_port(args.host, args.port)
    pair = default_worker().call(load, args)  # the models belong to the worker thread
    model_id = args.model or pair.name
    playground = None if args.no_playground else {"model": args.model or DEFAULT_PAIR, "draft": args.draft}
    log(f"serving {pair.name} as '{model_id}' on http://{args.host}:{args.port} "
        "(/v1/chat/completions, /v1/completions, /v1/models, /health, /metrics, /metrics.json"
        + ("" if args.no_playground else ", the playground at /") + ")")
    serve(pair, model_id, args.host, args.port, playground=playground)
    return 0
