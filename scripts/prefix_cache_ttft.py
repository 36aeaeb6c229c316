"""Time to first token of a conversation's last turn through the server, with the prefix cache on
and off, in one run: a 6-turn chat (the server's own replies sent back as the assistant's turns,
as a chat client does) on a server with its prefix cache, then the same last request on a server
without one. Both servers serve the same loaded pair, one after the other; each repeat starts
with an empty cache. The last turn's replies must be identical.

    python scripts/prefix_cache_ttft.py                  # the default shipped pair, 3 repeats
    python scripts/prefix_cache_ttft.py --repeats 5 --max-tokens 96 --json out.json
"""

import argparse
import json
import sys
import threading
import time
from pathlib import Path
from statistics import median

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import dflash_core  # noqa: E402,F401  (system OpenBLAS before MLX)

# isort: split
import httpx  # noqa: E402
import uvicorn  # noqa: E402

from dflash_core.models.loading import load_pair  # noqa: E402
from dflash_core.serving.routes import create_app  # noqa: E402
from dflash_core.serving.worker import default_worker  # noqa: E402

# six user turns of a conversation about one piece of work: each asks for more of the same
TURNS = [
    "I am writing a small command-line tool in Python that reads a CSV file of expenses (date, "
    "category, amount) and prints a monthly summary. How should I structure the program? Please "
    "describe the modules and functions you would write, and what each one is responsible for.",
    "Good. Now write the function that parses the CSV file. It should skip the header, convert the "
    "date to a datetime.date, the amount to a Decimal, and report a clear error with the line "
    "number when a row is malformed.",
    "Next, write the function that groups the parsed rows by month and category and sums the "
    "amounts. Use a dictionary keyed by (year, month) whose values map each category to its total.",
    "Now the output: print one table per month, categories sorted by total, largest first, with the "
    "amounts right-aligned and a total line at the bottom of each table.",
    "Add command-line options with argparse: the CSV path, an optional --month YYYY-MM to show one "
    "month only, and --top N to show only the N largest categories. Show the main function.",
    "Finally, write a few pytest tests for the parser and the grouping function, including a "
    "malformed row and an empty file. Explain briefly what each test checks.",
]


class Served:
    """A uvicorn server over create_app(pair, **options) on a free port, in a thread."""

    def __init__(self, pair, port: int, **options):
        self.server = uvicorn.Server(
            uvicorn.Config(create_app(pair, **options), host="127.0.0.1", port=port, log_level="warning")
        )
        self.url = f"http://127.0.0.1:{port}"
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self):
        self.thread.start()
        while not self.server.started:
            time.sleep(0.05)
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(30)


def ask(url: str, messages: list, max_tokens: int) -> tuple:
    """(seconds to the first streamed text, the reply's text, usage) of one streamed chat request."""
    body = {
        "messages": messages,
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    t0, first, text, usage = time.perf_counter(), None, [], None
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            usage = chunk.get("usage") or usage
            for choice in chunk.get("choices", []):
                piece = choice["delta"].get("content")
                if piece:
                    first = first or time.perf_counter() - t0
                    text.append(piece)
    return first, "".join(text), usage


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", help="target (default: the shipped default pair)")
    p.add_argument("--draft")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=128, help="per reply (default 128)")
    p.add_argument("--port", type=int, default=8765)
    p.add_argument("--json", help="write the measurements here")
    a = p.parse_args(argv)
    worker = default_worker()
    pair = worker.call(load_pair, a.model, a.draft)
    rows = []
    with Served(pair, a.port, prefix_cache_mb=0) as s:  # warm-up: BLAS threads, the policy's probe
        ask(s.url, [{"role": "user", "content": TURNS[0]}], 8)
    for repeat in range(a.repeats):
        messages = []
        with Served(pair, a.port) as s:
            for turn in TURNS:
                messages.append({"role": "user", "content": turn})
                on_s, on_text, usage = ask(s.url, messages, a.max_tokens)
                messages.append({"role": "assistant", "content": on_text})
        last = messages[:-1]
        with Served(pair, a.port, prefix_cache_mb=0) as s:
            off_s, off_text, _ = ask(s.url, last, a.max_tokens)
        row = {
            "repeat": repeat,
            "prompt_tokens": usage["prompt_tokens"],
            "cached_tokens": usage["prompt_tokens_details"]["cached_tokens"],
            "ttft_on_s": round(on_s, 3),
            "ttft_off_s": round(off_s, 3),
            "ratio": round(on_s / off_s, 3),
            "identical": on_text == off_text,
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    summary = {
        "prompt_tokens": rows[-1]["prompt_tokens"],
        "cached_tokens": rows[-1]["cached_tokens"],
        "ttft_on_median_s": median(r["ttft_on_s"] for r in rows),
        "ttft_off_median_s": median(r["ttft_off_s"] for r in rows),
        "ratio_of_medians": round(median(r["ttft_on_s"] for r in rows) / median(r["ttft_off_s"] for r in rows), 3),
        "all_identical": all(r["identical"] for r in rows),
    }
    print(json.dumps(summary))
    if a.json:
        Path(a.json).write_text(json.dumps({"rows": rows, "summary": summary}, indent=2) + "\n")
    return 0 if summary["all_identical"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
