"""Regenerate docs/playground-{light,dark}.png: launch the playground on the shipped pair, run the
first example prompt in headless Chromium, and capture the page in both themes. With --policy,
docs/playground-policy.png instead: the black-hole example under the adaptive policy, from the
speedup to the cycle inspector opened on the run's last plain step (its reason line). With --copy,
docs/playground-copy.png: a context-reuse request (fix the typos in a pasted paragraph) with
proposals copied from the context, the inspector opened on the copied cycle that committed most.

    .venv/bin/python scripts/playground_screenshots.py [--model DIR --draft DIR] [--max-tokens N]
    .venv/bin/python scripts/playground_screenshots.py --policy
    .venv/bin/python scripts/playground_screenshots.py --copy
"""

import argparse
import io
import json
import socket
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from PIL import Image  # noqa: E402
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
    p.add_argument("--policy", action="store_true", help="the black-hole example's plain steps (playground-policy.png)")
    p.add_argument("--copy", action="store_true", help="proposals copied from the context (playground-copy.png)")
    a = p.parse_args()
    if a.policy:
        a.prompt = a.prompt or "Explain what a black hole is in simple terms."
    if a.copy:
        reuse = json.loads((ROOT / "assets" / "prompts" / "context_reuse.json").read_text())
        a.prompt = a.prompt or next(q for q in reuse if q.startswith("Fix the typos"))
    demo, kwargs = build_app(a.model, a.draft)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True, **kwargs)
    url = f"http://127.0.0.1:{port}/?max_tokens={a.max_tokens}" + ("&copy=1" if a.copy else "")
    with sync_playwright() as pw:
        browser = launch_chromium(pw)
        for theme in ("light",) if a.policy or a.copy else ("light", "dark"):
            page = browser.new_page(viewport={"width": 1360, "height": 900})
            page.goto(f"{url}&__theme={theme}")
            expect(page.locator("#prompt textarea")).not_to_have_value("", timeout=30_000)
            if a.prompt:
                page.locator("#prompt textarea").fill(a.prompt)
            page.locator("#run").click()
            expect(page.locator("#lossless .v")).not_to_contain_text("lossless check runs", timeout=600_000)
            page.wait_for_timeout(14_000)  # the race replay finishes (3-12 s)
            if a.policy:
                inspector_shot(page, f"{a.out}/playground-policy.png", last_plain_step(page))
                continue
            if a.copy:
                inspector_shot(page, f"{a.out}/playground-copy.png", best_copied_cycle(page))
                continue
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


def last_plain_step(page) -> str | None:
    """The run's last plain step (its cycle number), printed with its reason."""
    steps = page.locator("#dflash-tokens span.cycle.plain-step")
    if steps.count() == 0:
        return None
    print(f"plain steps: {steps.count()}; the last: {steps.last.get_attribute('title')}")
    return steps.last.get_attribute("data-cycle")


def best_copied_cycle(page) -> str | None:
    """The copied cycle that committed the most copied tokens (its cycle number)."""
    cycles = page.locator("#dflash-tokens span.cycle:has(.tok-copied)")
    accepted = [cycles.nth(i).locator(".tok-accepted.tok-copied").count() for i in range(cycles.count())]
    if not accepted:
        return None
    best = max(range(len(accepted)), key=accepted.__getitem__)
    print(f"copied cycles: {len(accepted)}; copied tokens accepted in each: {accepted}")
    return cycles.nth(best).get_attribute("data-cycle")


def inspector_shot(page, path: str, cycle: str | None):
    """The speedup, both panes and the inspector opened on `cycle`."""
    if cycle is None:
        print("no such cycle in this run: nothing to show", file=sys.stderr)
        return
    print(f"inspecting cycle {cycle}")
    box = page.locator("#cycle-slider input[type=number]")
    box.fill(cycle)
    box.press("Enter")
    expect(page.locator("#inspector")).to_contain_text(f"Cycle {cycle}", timeout=30_000)
    # two crops, stacked (the race and the charts between them left out): speedup to both panes,
    # then the inspector
    print("speedup:", " ".join(page.locator("#speedup").inner_text().split()))
    scroll = page.evaluate("window.scrollY")  # boxes are in the viewport, full-page clips in the page

    def box(selector):
        b = page.locator(selector).bounding_box()
        return b["y"] + scroll, b["y"] + scroll + b["height"]

    (top, _), (_, panes_end) = box("#speedup"), box("#all-rejected")
    (insp_top, _), (_, insp_end) = box("#cycle-slider"), box("#inspector")
    crops = [
        {"x": 0, "y": top - 12, "width": 1360, "height": panes_end - top + 24},
        {"x": 0, "y": insp_top - 12, "width": 1360, "height": insp_end - insp_top + 28},
    ]
    images = [Image.open(io.BytesIO(page.screenshot(clip=c, full_page=True))) for c in crops]
    out = Image.new("RGB", (1360, sum(im.height for im in images)), "white")
    y = 0
    for im in images:
        out.paste(im, (0, y))
        y += im.height
    # a page has few colours: 256 of them keep it sharp at about a third of the bytes
    out.quantize(colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE).save(path, optimize=True)


if __name__ == "__main__":
    main()
