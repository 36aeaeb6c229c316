"""The playground's figures against the headless engine's, side by side in one run.

Each repeat runs the prompt through the launched playground's own run handler (as gradio_client
calls it; its figures are what the page shows, read from the run's export; with --browser, in
headless Chromium on the same machine, read off the page) and straight through the engine on the
same worker and the same loaded pair (as `benchmark` and `generate` run it), in alternating
order. Prints both and the page's share of the headless figures.
  python scripts/page_vs_headless.py [--model NAME] [--prompt P] [--max-tokens N] [--repeat R] [--browser]
"""

import argparse
import json
import socket
import statistics
import sys
from pathlib import Path
from urllib.parse import quote

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gradio_client import Client  # noqa: E402

import dflash_core  # noqa: E402,F401  (system BLAS before MLX)
from dflash_core.models.loading import load_pair  # noqa: E402
from dflash_core.models.registry import DEFAULT_PAIR  # noqa: E402
from dflash_core.serving.worker import default_worker  # noqa: E402
from ui import build_app  # noqa: E402
from ui.headless import launch as launch_chromium  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def headless(worker, pair, ids, max_tokens, min_confidence) -> dict:
    base = worker.call(lambda: list(pair.baseline(ids, max_tokens))[-1])
    dflash = worker.call(lambda: list(pair.dflash(ids, max_tokens, min_confidence=min_confidence))[-1])
    assert base.tokens == dflash.tokens, "DFlash and plain greedy differ"
    return {"baseline": base.decode_tps, "dflash": dflash.decode_tps}


def through_page(client, key, prompt, max_tokens, chat, min_confidence) -> dict:
    # thinking off, the draft as stored, and the fixed policy: the headless run's (min_confidence implies it)
    out = client.predict(
        prompt, key, max_tokens, 16, chat, min_confidence, 0.0, 1.0, 0, False, "as stored", "fixed", api_name="/run"
    )
    export = out[16]["value"] if isinstance(out[16], dict) else out[16]
    run = json.loads(Path(export).read_text())
    assert run["lossless"]["verdict"] == "identical", run["lossless"]
    return {engine: run[engine]["summary"]["decode_tps"] for engine in ("baseline", "dflash")}


def through_browser(page, url, prompt, max_tokens, chat, min_confidence) -> dict:
    from playwright.sync_api import expect

    page.goto(f"{url}?prompt={quote(prompt)}&max_tokens={max_tokens}&chat={int(chat)}&min_confidence={min_confidence}")
    expect(page.locator("#prompt textarea")).to_have_value(prompt, timeout=60_000)
    page.locator("#run").click()
    expect(page.locator("#lossless")).to_contain_text("identical", timeout=600_000)
    # the race replay animates for up to 12 s after a run: the next measurement waits it out
    page.locator("#race .race[data-played]").wait_for(timeout=60_000)
    tps = lambda pane: float(page.locator(f"#{pane}-stats .stat .v").first.inner_text())
    return {"baseline": tps("baseline"), "dflash": tps("dflash")}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=DEFAULT_PAIR)
    p.add_argument(
        "--prompt", default="Write a Python function that returns the sum of the squares of a list of numbers."
    )
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--chat", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--min-confidence", type=float, default=0.2)
    p.add_argument(
        "--browser", action="store_true", help="drive the page in headless Chromium instead of gradio_client"
    )
    p.add_argument("--save", help="write the figures as JSON here")
    a = p.parse_args()

    worker = default_worker()
    pair = worker.call(load_pair, a.model)
    demo, kwargs = build_app(a.model, pair=pair)
    port = free_port()
    demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True, **kwargs)
    url = f"http://127.0.0.1:{port}/"
    if a.browser:
        from playwright.sync_api import sync_playwright

        playwright = sync_playwright().start()
        browser = launch_chromium(playwright)
        page = browser.new_page(viewport={"width": 1360, "height": 900})
        on_page = lambda: through_browser(page, url, a.prompt, a.max_tokens, a.chat, a.min_confidence)
    else:
        client = Client(url, verbose=False)
        on_page = lambda: through_page(client, a.model, a.prompt, a.max_tokens, a.chat, a.min_confidence)
    ids = worker.call(pair.encode, a.prompt, a.chat)
    headless(worker, pair, ids, 8, a.min_confidence)  # warm-up (and each engine's thread probe)

    rows = []
    for r in range(a.repeat):
        order = ["page", "headless"] if r % 2 == 0 else ["headless", "page"]
        row = {}
        for where in order:
            row[where] = on_page() if where == "page" else headless(worker, pair, ids, a.max_tokens, a.min_confidence)
        rows.append(row)
        print(
            f"repeat {r + 1}: page baseline {row['page']['baseline']:.1f} / DFlash {row['page']['dflash']:.1f} tok/s, "
            f"headless {row['headless']['baseline']:.1f} / {row['headless']['dflash']:.1f}",
            file=sys.stderr,
        )
    if a.browser:
        browser.close()
        playwright.stop()
    demo.close()

    def median(where, key):
        if key == "speedup":
            return statistics.median(r[where]["dflash"] / r[where]["baseline"] for r in rows)
        return statistics.median(r[where][key] for r in rows)

    summary = {
        where: {k: round(median(where, k), 3) for k in ("baseline", "dflash", "speedup")}
        for where in ("page", "headless")
    }
    summary["page_share"] = {
        k: round(summary["page"][k] / summary["headless"][k], 3) for k in ("baseline", "dflash", "speedup")
    }
    result = {
        "model": a.model,
        "prompt": a.prompt,
        "max_tokens": a.max_tokens,
        "chat": a.chat,
        "browser": a.browser,
        "min_confidence": a.min_confidence,
        "repeats": rows,
        "median": summary,
    }
    if a.save:
        Path(a.save).write_text(json.dumps(result, indent=1))
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
