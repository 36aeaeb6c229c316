"""The playground's launcher, run by `python app.py` in a clone and `dflash-playground` when
installed: the Gradio playground on the shipped default pair (or --model/--draft)."""

import argparse
import os
import sys

from .argtypes import positive_int, whole_number
from .cli import Parser
from .errors import DFlashError
from .layout import playground_package

# `dflash-playground` when installed, `python app.py` from a clone
PROG = "dflash-playground" if os.path.basename(sys.argv[0]) == "dflash-playground" else "python app.py"
DEFAULT_HOST, DEFAULT_PORT = "127.0.0.1", 7860


def port_number(text: str) -> int:
    value = whole_number(text)
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{text} is not a port: give a whole number 1..65535")
    return value


def parse_args(argv=None):
    p = Parser(
        prog=PROG,
        description="the DFlash playground (Gradio)",
        epilog="Without --host/--port, Gradio's GRADIO_SERVER_NAME / GRADIO_SERVER_PORT apply "
        "(as a container or a Hugging Face Space sets them).",
    )
    p.add_argument("--model", help="target model directory (or a shipped pair's name) to offer first")
    p.add_argument("--draft", help="draft directory for --model")
    p.add_argument("--host", help=f"address to serve on; 0.0.0.0 for the LAN (default {DEFAULT_HOST})")
    p.add_argument("--port", type=port_number, help=f"default {DEFAULT_PORT}")
    p.add_argument("--share", action="store_true", help="also create a public Gradio share link")
    p.add_argument("--auth", metavar="USER:PASS", help="require this login")
    p.add_argument(
        "--allow-downloads",
        action="store_true",
        help="offer the registered hub pairs (downloads tens of GB on first use)",
    )
    p.add_argument("--max-tokens-cap", type=positive_int, default=512, help="most new tokens a visitor may ask for")
    p.add_argument("--concurrency", type=positive_int, default=1, help="requests running at once (one MLX worker)")
    p.add_argument("--queue-size", type=positive_int, default=32, help="most requests waiting in the queue")
    p.add_argument("--no-browser", action="store_true", help="do not open a browser tab")
    args = p.parse_args(argv)
    if args.draft and not args.model:
        p.error("--draft needs --model")
    if args.auth and ":" not in args.auth:
        p.error("--auth takes USER:PASS")
    args.host = args.host or os.environ.get("GRADIO_SERVER_NAME") or DEFAULT_HOST
    if args.port is None:
        try:
            args.port = port_number(os.environ.get("GRADIO_SERVER_PORT") or str(DEFAULT_PORT))
        except argparse.ArgumentTypeError as e:
            p.error(f"GRADIO_SERVER_PORT: {e}")
    return args


def main(argv=None) -> int:
    try:
        args = parse_args(argv)
        demo, launch_kwargs = playground_package().build_app(
            args.model, args.draft, args.allow_downloads, args.max_tokens_cap, args.concurrency, args.queue_size
        )
    except DFlashError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    auth = tuple(args.auth.split(":", 1)) if args.auth else None
    _, local_url, share_url = demo.launch(
        server_name=args.host,
        server_port=args.port,
        share=args.share,
        auth=auth,
        inbrowser=not args.no_browser,
        prevent_thread_lock=True,
        footer_links=["gradio", "settings"],
        **launch_kwargs,
    )
    if args.share and not share_url:
        print(
            "note: could not create a public share link (this machine looks offline, or the Gradio "
            f"tunnel is unreachable); the playground is still served locally at {local_url}",
            flush=True,
        )
    elif share_url:
        print(f"public link: {share_url}", flush=True)
    try:
        demo.block_thread()
    except KeyboardInterrupt:
        pass
    return 0
