"""Regenerate docs/playground-{light,dark}.png: launch the playground on the shipped pair, run the
first example prompt in headless Chromium, and capture the page in both themes.

    .venv/bin/python scripts/playground_screenshots.py [--model DIR --draft DIR] [--max-tokens N]
"""

import argparse
import socket
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from playwright.sync_api import expect, sync_playwright  # noqa: E402

import dflash_core  # noqa: E402,F401  (system BLAS before MLX)
from ui import build_app  # noqa: E402
from ui.headless import launch as launch_chromium  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model")
    p.add_argument("--draft")
    p.add_argument("--max-tokens", type=int, default=160)
    p.add_argument(
        "--prompt",
        help="default: the prompt the page opens on (its first example, the Python function), a sensible reply with "
        "accepted runs and rejections in most cycles",
    )
    p.add_argument("--out", default=str(ROOT / "docs"))
    a = p.parse_args()
    demo, kwargs = build_app(a.model, a.draft)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True, **kwargs)
    url = f"http://127.0.0.1:{port}/?max_tokens={a.max_tokens}"
    with sync_playwright() as pw:
        browser = launch_chromium(pw)
        for theme in ("light", "dark"):
            page = browser.new_page(viewport={"width": 1360, "height": 900})
            page.goto(f"{url}&__theme={theme}")
            expect(page.locator("#prompt textarea")).not_to_have_value("", timeout=30_000)
            if a.prompt:
                page.locator("#prompt textarea").fill(a.prompt)
            page.locator("#run").click()
            expect(page.locator("#lossless .v")).not_to_contain_text("lossless check runs", timeout=600_000)
            page.wait_for_timeout(14_000)  # the race replay finishes (3-12 s)
            if theme == "light":  # controls, verdict, both panes
                bottom = page.locator("#all-rejected").bounding_box()
                clip = {"x": 0, "y": 0, "width": 1360, "height": bottom["y"] + bottom["height"] + 16}
            else:  # race, charts and the cycle inspector
                top = page.locator("#race").bounding_box()["y"] - 60
                end = page.locator("#inspector").bounding_box()
                clip = {"x": 0, "y": top, "width": 1360, "height": end["y"] + end["height"] + 20 - top}
            page.screenshot(path=f"{a.out}/playground-{theme}.png", clip=clip, full_page=True)
        browser.close()
    demo.close()


if __name__ == "__main__":
    main()
