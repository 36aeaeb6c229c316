"""`python app.py`: the DFlash playground in a browser, on the shipped default pair.

    python app.py                          # http://127.0.0.1:7860, opens a browser tab
    python app.py --share                  # plus a public gradio.live link (needs internet)
    python app.py --host 0.0.0.0 --auth me:secret
    python app.py --model DIR --draft DIR  # another local pair, offered first
"""
import argparse
import sys

import dflash_core  # noqa: F401  (loads the system BLAS before MLX)
from dflash_core.errors import DFlashError


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python app.py", description="the DFlash playground (Gradio)")
    p.add_argument("--model", help="target model directory (or a shipped pair's name) to offer first")
    p.add_argument("--draft", help="draft directory for --model")
    p.add_argument("--host", default="127.0.0.1", help="address to serve on; 0.0.0.0 for the LAN")
    p.add_argument("--port", type=int, default=7860)
    p.add_argument("--share", action="store_true", help="also create a public Gradio share link")
    p.add_argument("--auth", metavar="USER:PASS", help="require this login")
    p.add_argument("--allow-downloads", action="store_true",
                   help="offer the registered hub pairs (downloads tens of GB on first use)")
    p.add_argument("--max-tokens-cap", type=int, default=512, help="most new tokens a visitor may ask for")
    p.add_argument("--concurrency", type=int, default=1, help="requests running at once (one MLX worker)")
    p.add_argument("--queue-size", type=int, default=32, help="most requests waiting in the queue")
    p.add_argument("--no-browser", action="store_true", help="do not open a browser tab")
    args = p.parse_args(argv)
    if args.draft and not args.model:
        p.error("--draft needs --model")
    if args.auth and ":" not in args.auth:
        p.error("--auth takes USER:PASS")
    if args.max_tokens_cap < 1 or args.concurrency < 1:
        p.error("--max-tokens-cap and --concurrency must be at least 1")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    from ui import build_app

    try:
        demo, launch_kwargs = build_app(args.model, args.draft, args.allow_downloads, args.max_tokens_cap,
                                        args.concurrency, args.queue_size)
    except DFlashError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    auth = tuple(args.auth.split(":", 1)) if args.auth else None
    _, local_url, share_url = demo.launch(
        server_name=args.host, server_port=args.port, share=args.share, auth=auth,
        inbrowser=not args.no_browser, prevent_thread_lock=True, footer_links=["gradio", "settings"],
        **launch_kwargs,
    )
    if args.share and not share_url:
        print("note: could not create a public share link (this machine looks offline, or the Gradio "
              f"tunnel is unreachable); the playground is still served locally at {local_url}", flush=True)
    elif share_url:
        print(f"public link: {share_url}", flush=True)
    try:
        demo.block_thread()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
