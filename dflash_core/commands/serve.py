"""serve: the OpenAI-compatible API, Prometheus metrics and the playground in one process. The
core server (dflash_core.serving.routes) builds the API alone; this command mounts the playground beside
it, so that the server stays usable without the UI."""

import os
import secrets
import socket
import sys

from ..argtypes import count, positive_int
from ..errors import DFlashError
from ..models import distributed
from ..models.registry import DEFAULT_PAIR
from ..serving.worker import default_worker
from .common import add_pair_args, add_policy_args, load, log, policy_of


def add_parser(sub):
    p = sub.add_parser(
        "serve",
        help="serve an OpenAI-compatible API with metrics (and the playground)",
        description="One process: POST /v1/chat/completions and /v1/completions (greedy through "
        "DFlash, temperature > 0 by speculative sampling), GET /v1/models, /health, "
        "/metrics (Prometheus), /metrics.json, and the playground at /.",
    )
    add_pair_args(p)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=positive_int, default=8000, help="default 8000")
    p.add_argument("--no-playground", action="store_true", help="serve the API only, without the UI at /")
    p.add_argument(
        "--api-key",
        metavar="KEY",
        help="require 'Authorization: Bearer KEY' on /v1 (the playground asks for KEY as its password; "
        "/health and /metrics stay open)",
    )
    p.add_argument(
        "--allowed-origins",
        nargs="+",
        metavar="ORIGIN",
        help="web origins whose pages may call the API from a browser (CORS), e.g. "
        "https://app.example.com, or * for any (default: none)",
    )
    # defaults: the server's own (not imported here: the server's packages load slowly for --help)
    p.add_argument(
        "--max-tokens",
        type=positive_int,
        metavar="N",
        help="new tokens for a request that gives no max_tokens (default 256; clipped to the room left in the context)",
    )
    p.add_argument(
        "--max-queue",
        type=count,
        metavar="N",
        help="requests that may wait behind the one generating; more are answered 429 with Retry-After (default 64)",
    )
    p.add_argument(
        "--prefix-cache-mb",
        type=count,
        metavar="MB",
        help="memory for snapshots of earlier prompts and replies, so that a conversation's next turn "
        "prefills only its new tokens (default 1024; 0: off; off when the target is "
        "split across processes)",
    )
    add_policy_args(p)  # the server's; a request's "dflash_policy" overrides it
    p.set_defaults(func=run)


def server_policy_options(args, grouped: bool) -> dict:
    """--policy / --min-confidence for the server ({}: its defaults, the engine's), checked
    before anything loads."""
    policy = policy_of(args)
    if grouped and policy == "adaptive":
        raise DFlashError(
            "--policy adaptive cannot serve a target split across processes (each would decide from its own "
            "timings): give --policy fixed, or leave it out"
        )
    given = {"policy": policy, "min_confidence": args.min_confidence}
    return {k: v for k, v in given.items() if v is not None}


def _check_port(host: str, port: int):
    """Say so in one line now, rather than in uvicorn's log after the model has loaded."""
    if not 1 <= port <= 65535:
        raise DFlashError(f"port {port} is out of range: use 1..65535")
    try:
        with socket.create_server((host, port)):
            pass
    except OSError as e:
        raise DFlashError(f"cannot listen on {host}:{port} ({e.strerror}); pick another --port or --host") from None


def mount_playground(app, model: str = None, draft: str = None) -> bool:
    """Mount the Gradio playground at / of an app from server.create_app when the `ui` package is
    present, offering the served pair (model/draft as given to `serve`) first, already loaded. The
    API routes keep priority (they were added first). A playground that cannot be built leaves the
    API running. With an API key the playground asks for it as the password (any user name)."""
    server = app.state.server
    try:
        import gradio as gr

        from ..layout import playground_package

        build_app = playground_package().build_app
    except ImportError:
        return False
    try:
        blocks, launch_kwargs = build_app(model, draft, worker=server.worker, pair=server.pair)
    except DFlashError as e:
        print(f"warning: the playground is not served: {e}", file=sys.stderr)
        return False
    if server.api_key is not None:
        launch_kwargs["auth"] = lambda user, password: secrets.compare_digest(
            password.encode(), server.api_key.encode()
        )
    gr.mount_gradio_app(app, blocks, path="/", **launch_kwargs)
    return True


def serving_app(pair, model_id: str, playground: dict = None, **options):
    """The app `serve` serves: server.create_app(**options), with the playground at / when
    `playground` gives build_app's model/draft (e.g. {"model": None, "draft": None} for the shipped
    default). app.state.playground says whether the playground is mounted."""
    from ..serving.routes import create_app

    app = create_app(pair, model_id, **options)
    app.state.playground = playground is not None and mount_playground(app, **playground)
    return app


def run(args) -> int:
    from ..serving.routes import serve

    policy = server_policy_options(args, distributed.size() > 1)  # on every rank, before anything loads
    if distributed.primary():  # under mlx.launch only rank 0 serves HTTP
        _check_port(args.host, args.port)
    worker = default_worker()
    pair = worker.call(load, args)  # the models belong to the worker thread
    if not distributed.primary():
        worker.call(distributed.follow, pair)  # run what rank 0 runs, until it stops serving
        # Nothing is left to do, and MLX's teardown of the group can race rank 0's own exit (once
        # in CI this rank aborted at exit, after rank 0 had stopped serving): leave without it.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    grouped = distributed.size() > 1
    if grouped:
        pair = distributed.Leader(pair)
    model_id = args.model or pair.name
    # the playground loads pairs and runs engines of its own accord, which the other ranks of a
    # group could not follow: a group serves the API alone
    playground = None if args.no_playground or grouped else {"model": args.model or DEFAULT_PAIR, "draft": args.draft}
    log(
        f"serving {pair.name} as '{model_id}' on http://{args.host}:{args.port} "
        "(/v1/chat/completions, /v1/completions, /v1/models, /health, /metrics, /metrics.json"
        + ("" if playground is None else ", the playground at /")
        + ")"
        + (" with an API key" if args.api_key else "")
        + f"; {policy.get('policy') or ('fixed' if policy or grouped else 'the default')} policy"
        + (f"; the target is split across {distributed.size()} processes (no playground)" if grouped else "")
    )
    # every process of a group would have to restore the same prefixes: no prefix cache there
    prefix_cache_mb = 0 if grouped else args.prefix_cache_mb
    given = {"max_queue": args.max_queue, "max_tokens": args.max_tokens, "prefix_cache_mb": prefix_cache_mb, **policy}
    try:
        app = serving_app(
            pair,
            model_id,
            playground,
            api_key=args.api_key,
            allowed_origins=args.allowed_origins,
            **{k: v for k, v in given.items() if v is not None},
        )
        serve(app, args.host, args.port)
    finally:
        if grouped:
            worker.call(pair.close)
    return 0
