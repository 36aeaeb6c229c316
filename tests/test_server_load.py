"""The server under load, on loopback: many queued streams, hang-ups, a client that stops reading,
concurrent clients. The pair is test_server's pinned random pair; on it "hello" runs to any
max_tokens asked (no EOS), about 8 ms a token on 2 CPU cores, so a run of LONG tokens takes
seconds and a cancelled one is plainly shorter. Every count and wait is bounded."""

import asyncio
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import httpx
import openai
import pytest
from test_server import MODEL, greedy, metric_values, serving
from ui_pair import PROMPT, pinned_random_pair

import dflash_core  # noqa: F401  (system BLAS before MLX)
from dflash_core.serving.routes import create_app
from dflash_core.serving.worker import Worker, default_worker

pytestmark = pytest.mark.slow

LONG = 2000  # tokens: a run this long takes many seconds; a cancelled one stops within a cycle


@pytest.fixture(scope="module")
def pinned(tmp_path_factory):
    _, _, pair = pinned_random_pair(tmp_path_factory.mktemp("load-pair"))
    return SimpleNamespace(pair=pair, worker=default_worker())


@pytest.fixture(scope="module")
def served(pinned):
    with serving(pinned) as s:
        yield s


def running(s) -> int:
    return httpx.get(s.url + "/health", timeout=5).json()["requests_running"]


def wait_for(condition, timeout: float, what: str):
    deadline = time.time() + timeout
    while not condition():
        assert time.time() < deadline, f"gave up waiting: {what}"
        time.sleep(0.05)


def records(s, n: int) -> list:
    return httpx.get(s.url + "/metrics.json").json()["requests"][-n:]


def count(s, outcome: str, path: str = "dflash") -> float:
    return metric_values(s).get(f"dflash_requests_total[outcome={outcome}][path={path}]", 0.0)


def test_48_queued_streams_leave_health_and_metrics_answering(served):
    """48 long streams at once: each is answered with its status line and waits for the worker;
    meanwhile /health and /metrics answer within a second. Closing the 48 frees the worker: the
    one generating stops at its next cycle, the waiting ones never start."""
    s, n = served, 48
    wait_for(lambda: running(s) == 0, 30, "an idle server")
    cancelled_before = count(s, "cancelled")
    body = {"model": MODEL, "prompt": "hello", "max_tokens": LONG, "stream": True}

    async def scenario():
        limits = httpx.Limits(max_connections=n + 4)
        async with httpx.AsyncClient(base_url=s.url, timeout=30, limits=limits) as client:
            streams = await asyncio.gather(
                *(
                    client.send(client.build_request("POST", "/v1/completions", json=body), stream=True)
                    for _ in range(n)
                )
            )
            assert [r.status_code for r in streams] == [200] * n
            waits = []
            for _ in range(3):
                for path in ("/health", "/metrics"):
                    t = time.perf_counter()
                    r = await client.get(path)
                    waits.append(time.perf_counter() - t)
                    assert r.status_code == 200
            queued = (await client.get("/health")).json()["requests_running"]
            for r in streams:
                await r.aclose()  # the client hangs up mid-stream
            return waits, queued

    waits, queued = asyncio.run(asyncio.wait_for(scenario(), 60))
    assert max(waits) < 1.0, waits
    assert queued == n
    t = time.time()
    wait_for(lambda: running(s) == 0, 20, "the worker to be free after the 48 hung up")
    assert count(s, "cancelled") - cancelled_before == n
    assert all(r["outcome"] == "cancelled" for r in records(s, n))
    assert sum(r.get("generated_tokens", 0) for r in records(s, n)) < LONG / 4  # most never started
    # the worker is free: the next request is answered at once, and correctly
    text, _, _ = greedy(s, "x = [1, 2", 40, chat=False)
    assert s.client.completions.create(model=MODEL, prompt="x = [1, 2", max_tokens=40).choices[0].text == text
    assert time.time() - t < 30


def test_a_full_queue_answers_429_with_retry_after(pinned):
    """max_queue=1: one request generates, one waits; the next is refused at once with 429, an
    OpenAI-style error body and a Retry-After in whole seconds. Once they are gone, it is served."""
    with serving(pinned, max_queue=1) as s:
        body = {"model": MODEL, "prompt": "hello", "max_tokens": LONG, "stream": True}
        with httpx.Client(base_url=s.url, timeout=30) as client:
            streams = [
                client.send(client.build_request("POST", "/v1/completions", json=body), stream=True) for _ in range(2)
            ]
            try:
                assert running(s) == 2
                r = httpx.post(s.url + "/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 5})
                assert r.status_code == 429
                assert int(r.headers["retry-after"]) >= 1
                error = r.json()["error"]
                assert error["code"] == "queue_full" and "busy" in error["message"]
                with pytest.raises(openai.RateLimitError):
                    s.client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
                assert count(s, "queue_full", path="none") == 2
            finally:
                for r in streams:
                    r.close()
        wait_for(lambda: running(s) == 0, 20, "the two streams to be cancelled")
        text, _, _ = greedy(s, "hi", 5, chat=False)
        assert s.client.completions.create(model=MODEL, prompt="hi", max_tokens=5).choices[0].text == text


def test_a_non_streamed_hang_up_is_cancelled(served):
    """A client that hangs up on a non-streamed request (nothing is sent to it until the end) has
    its run cancelled at the next cycle, and the `cancelled` counter moves."""
    s = served
    wait_for(lambda: running(s) == 0, 30, "an idle server")
    cancelled_before = count(s, "cancelled")
    drafts_before = metric_values(s)["dflash_spec_decode_num_drafts_total"]
    # asks for all the context holds (twice LONG or more), so that even a fast machine would take
    # seconds more to finish it
    room = s.pair.context_length - 16
    assert room >= 2 * LONG
    body = {"model": MODEL, "prompt": "hello", "max_tokens": room}
    with pytest.raises(httpx.ReadTimeout):  # the client gives up and closes the connection
        httpx.post(s.url + "/v1/completions", json=body, timeout=httpx.Timeout(30, read=1.0))
    assert metric_values(s)["dflash_spec_decode_num_drafts_total"] > drafts_before  # it was generating
    wait_for(lambda: running(s) == 0, 10, "the hung-up request to stop")
    assert count(s, "cancelled") == cancelled_before + 1
    last = records(s, 1)[0]
    assert last["outcome"] == "cancelled" and last["stop_reason"] == "cancelled"
    assert last["generated_tokens"] < LONG  # under half the run it asked for


def test_a_client_that_stops_reading_is_cut_off_and_does_not_delay_the_next(pinned):
    """A streaming client whose connection stops taking data (its `send` never returns, as when
    the socket buffers are full) is cut off once stream_buffer pieces wait for it: its run is
    cancelled and counted, and the next client is served meanwhile, while the first still reads
    nothing. If it reads again later, it gets what was queued and then the reason it was cut off.
    Driven through the ASGI interface, where the stalled send can be made exactly."""
    app = create_app(pinned.pair, MODEL, stream_buffer=4)
    expected, _, _ = greedy(pinned, "x = [1, 2", 40, chat=False)

    async def scenario():
        unblock, received = asyncio.Event(), []

        async def stalled_send(message):
            received.append(message)
            if message["type"] == "http.response.body" and len(received) >= 3:
                await unblock.wait()  # the connection stopped taking data

        request = json.dumps({"model": MODEL, "prompt": "hello", "max_tokens": LONG, "stream": True}).encode()
        messages = [{"type": "http.request", "body": request, "more_body": False}]

        async def receive():
            if messages:
                return messages.pop()
            await asyncio.Event().wait()  # the client never hangs up

        scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": "/v1/completions",
            "raw_path": b"/v1/completions",
            "query_string": b"",
            "root_path": "",
            "client": ("127.0.0.1", 1),
            "server": ("127.0.0.1", 80),
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(request)).encode())],
        }
        stalled = asyncio.create_task(app(scope, receive, stalled_send))
        while len(received) < 3:  # it is generating, and has stopped taking data
            await asyncio.sleep(0.01)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test", timeout=30) as client:
            r = await client.post("/v1/completions", json={"model": MODEL, "prompt": "x = [1, 2", "max_tokens": 40})
            seen_by_stalled = len(received)
            metrics = (await client.get("/metrics.json")).json()["requests"]
        unblock.set()  # it reads again
        await stalled
        return r, seen_by_stalled, metrics, received

    r, seen_by_stalled, metrics, received = asyncio.run(asyncio.wait_for(scenario(), 60))
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == expected
    assert seen_by_stalled == 3  # the next client was served while the first still took nothing
    cut = [m for m in metrics if m["outcome"] == "cut_off"]
    assert len(cut) == 1 and cut[0]["generated_tokens"] < LONG / 4
    assert (
        app.state.server.metrics.registry.get_sample_value(
            "dflash_requests_total", {"path": "dflash", "outcome": "cut_off"}
        )
        == 1
    )
    events = b"".join(m.get("body", b"") for m in received[1:]).decode().split("\n\n")
    assert json.loads(events[-3][len("data: ") :])["error"]["code"] == "client_too_slow"
    assert events[-2] == "data: [DONE]"
    texts = [json.loads(e[len("data: ") :])["choices"][0]["text"] for e in events[:-3]]
    assert 2 <= len(texts) <= 2 + 4  # what it took before stalling, then at most the buffer


def test_8_concurrent_clients_each_get_their_solo_result(served):
    """Eight clients at once (chat and completions, streamed and not, a stop string, a sampled
    request with a seed) each get exactly what the same request gets alone."""
    s = served
    asks = [
        ("chat", {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 48}),
        ("chat", {"messages": [{"role": "user", "content": "class Stack:"}], "max_tokens": 40, "stream": True}),
        ("completion", {"prompt": PROMPT, "max_tokens": 48}),
        ("completion", {"prompt": "import os\n", "max_tokens": 50, "stream": True}),
        ("completion", {"prompt": "hello", "max_tokens": 120, "stop": ["\n\n", "ab"]}),
        ("completion", {"prompt": "x = [1, 2", "max_tokens": 60, "stream": True}),
        ("completion", {"prompt": "hello", "max_tokens": 30, "temperature": 1.0, "seed": 7}),
        (
            "chat",
            {
                "messages": [{"role": "user", "content": "x = [1, 2"}],
                "max_tokens": 30,
                "temperature": 0.7,
                "seed": 3,
                "stream": True,
            },
        ),
    ]

    def ask(item):
        kind, kw = item
        if kind == "chat":
            r = s.client.chat.completions.create(model=MODEL, **kw)
            if kw.get("stream"):
                return "".join(c.choices[0].delta.content or "" for c in r if c.choices)
            return r.choices[0].message.content
        r = s.client.completions.create(model=MODEL, **kw)
        return "".join(c.choices[0].text for c in r) if kw.get("stream") else r.choices[0].text

    solo = [ask(item) for item in asks]
    with ThreadPoolExecutor(len(asks)) as pool:
        together = list(pool.map(ask, asks))
    assert together == solo
    assert solo[2] == greedy(s, PROMPT, 48, chat=False)[0]  # and the greedy ones are plain greedy's text
    assert len(set(solo)) == len(solo)


def test_a_queued_request_whose_client_hangs_up_never_runs(pinned):
    """A non-streamed request waits behind other work; its client hangs up before its turn. Its
    run never starts, it is counted as cancelled, and the server answers the empty connection
    without an error. Driven through the ASGI interface, where the hang-up can be placed exactly."""
    app = create_app(pinned.pair, MODEL)
    request = json.dumps({"model": MODEL, "prompt": "hello", "max_tokens": LONG}).encode()
    messages = [{"type": "http.disconnect"}, {"type": "http.request", "body": request, "more_body": False}]
    sent = []

    async def receive():
        return messages.pop()

    async def send(message):
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/completions",
        "raw_path": b"/v1/completions",
        "query_string": b"",
        "root_path": "",
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(request)).encode())],
    }
    busy = pinned.worker.submit(time.sleep, 1.0)  # the worker is busy when the request arrives
    asyncio.run(asyncio.wait_for(app(scope, receive, send), 30))
    busy.result()
    record = app.state.server.metrics.snapshot()["requests"][-1]
    assert record["outcome"] == "cancelled" and "generated_tokens" not in record  # it never ran
    assert sent[0]["status"] == 499


def test_the_worker_never_waits_for_a_reader():
    """A thread that takes one item of a long stream and then stops reading (without closing it)
    holds up nothing: the run finishes, and the next job runs at once. A stream whose reader left
    while it waited for the worker never starts."""
    worker, started = Worker("test-worker"), []

    def items():
        started.append(True)
        yield from range(10_000)

    stalled = worker.stream(items)
    assert next(stalled) == 0  # ... and never read again
    assert worker.submit(lambda: "next").result(timeout=10) == "next"
    cancel = threading.Event()
    never = worker.stream(items, cancel)
    cancel.set()
    assert list(never) == [] and len(started) == 1
