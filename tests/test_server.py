"""The OpenAI-compatible server, driven by the official `openai` client against a real uvicorn
server on a free localhost port. The pair is a small random target with its draft pinned to the
token the target falls into repeating (see ui_pair.pin_draft), so some proposals are accepted and
the acceptance counters are checked against something that is not always zero. Every text the
server returns is compared with a lone plain greedy run of the same prompt."""

import contextlib
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import httpx
import openai
import pytest
import uvicorn
from prometheus_client.parser import text_string_to_metric_families
from ui_pair import PROMPT, free_port, pinned_random_pair

import dflash_core  # noqa: F401  (system BLAS before MLX)
from dflash_core.engine.sampling import Sampling
from dflash_core.models.loading import load_pair
from dflash_core.models.registry import DEFAULT_PAIR, SHIPPED
from dflash_core.models.tokenizer import TextStream
from dflash_core.serving.routes import create_app
from dflash_core.serving.worker import default_worker

pytestmark = pytest.mark.slow

MODEL = "random-qwen3"
SHIPPED_TARGET = SHIPPED[DEFAULT_PAIR][0]  # the GGUF that scripts/install.sh fetches
ROOT = Path(__file__).resolve().parent.parent


@contextlib.contextmanager
def serving(pinned, **options):
    """A uvicorn server on a free loopback port over create_app(**options): its state (url, app)."""
    app = create_app(pinned.pair, MODEL, **options)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.time() + 30
    while not server.started and time.time() < deadline:
        time.sleep(0.05)
    assert server.started, "uvicorn did not start"
    url = f"http://127.0.0.1:{port}"
    try:
        yield SimpleNamespace(
            url=url,
            app=app,
            pair=pinned.pair,
            worker=pinned.worker,
            client=openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0),
        )
    finally:
        server.should_exit = True
        thread.join(10)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    target, draft, pair = pinned_random_pair(tmp_path_factory.mktemp("server-pair"))
    with serving(SimpleNamespace(pair=pair, worker=default_worker())) as s:
        s.target, s.draft = target, draft
        yield s


def greedy(s, prompt: str, max_tokens: int, chat: bool):
    """A lone plain greedy run: (text the server must return, generated token ids, prompt ids)."""
    ids = s.pair.encode(prompt, chat_template=chat)
    *_, summary = s.worker.call(lambda: list(s.pair.baseline(ids, max_tokens)))
    text = s.pair.decode([t for t in summary.tokens if t not in s.pair.eos_ids])
    return text, summary.tokens, ids


def finish_reason(s, tokens):
    return "stop" if tokens and tokens[-1] in s.pair.eos_ids else "length"


def idle(s, timeout=30):
    """Wait until no request is generating or queued (a cancelled one finishes its cycle)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if httpx.get(s.url + "/health").json()["requests_running"] == 0:
            return
        time.sleep(0.05)
    raise AssertionError("the server still runs a request")


def metric_values(s) -> dict:
    text = httpx.get(s.url + "/metrics").text
    out = {}
    for fam in text_string_to_metric_families(text):
        for sample in fam.samples:
            key = sample.name + "".join(f"[{k}={v}]" for k, v in sorted(sample.labels.items()))
            out[key] = sample.value
    return out


def test_chat_completion_is_greedy_output(served):
    s = served
    text, tokens, ids = greedy(s, "class Stack:", 40, chat=True)
    raw = s.client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "class Stack:"}], max_tokens=40
    )
    r = raw.parse()
    assert raw.headers["x-dflash-path"] == "dflash"
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == text
    assert r.choices[0].finish_reason == finish_reason(s, tokens)
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (len(ids), len(tokens))
    assert r.usage.total_tokens == len(ids) + len(tokens)
    assert r.model == MODEL


def test_streamed_chat_completion(served):
    s = served
    text, tokens, ids = greedy(s, "hello", 60, chat=True)
    stream = s.client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "hello"}],
        max_tokens=60,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    deltas = [c.choices[0].delta.content or "" for c in chunks if c.choices]
    assert len([d for d in deltas if d]) > 1, "the answer came in one piece, not streamed"
    assert "".join(deltas) == text
    assert chunks[0].choices[0].delta.role == "assistant"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [finish_reason(s, tokens)]
    assert chunks[-1].usage.completion_tokens == len(tokens)
    assert chunks[-1].usage.prompt_tokens == len(ids)


def test_completions_plain_and_streamed(served):
    s = served
    text, tokens, ids = greedy(s, "import os\n", 50, chat=False)
    r = s.client.completions.create(model=MODEL, prompt="import os\n", max_tokens=50)
    assert r.choices[0].text == text
    assert r.usage.completion_tokens == len(tokens)
    assert r.choices[0].finish_reason == finish_reason(s, tokens)
    streamed = list(s.client.completions.create(model=MODEL, prompt="import os\n", max_tokens=50, stream=True))
    assert "".join(c.choices[0].text for c in streamed) == text
    assert streamed[-1].choices[0].finish_reason == finish_reason(s, tokens)
    # a prompt given as token ids is the same request
    r = s.client.completions.create(model=MODEL, prompt=ids, max_tokens=50)
    assert r.choices[0].text == text


def test_stop_strings_cut_the_text(served):
    s = served
    text, tokens, _ = greedy(s, "hello", 120, chat=False)
    assert len(text) > 30, "the test prompt should give a long answer"
    stop = text[20:23]
    expected = text[: text.find(stop)]
    r = s.client.completions.create(model=MODEL, prompt="hello", max_tokens=120, stop=[stop, "\x00never"])
    assert r.choices[0].text == expected
    assert r.choices[0].finish_reason == "stop"
    assert 0 < r.usage.completion_tokens < len(tokens)
    streamed = list(s.client.completions.create(model=MODEL, prompt="hello", max_tokens=120, stop=stop, stream=True))
    assert "".join(c.choices[0].text for c in streamed) == expected
    assert streamed[-1].choices[0].finish_reason == "stop"


def test_temperature_goes_through_dflash_and_dflash_false_is_plain(served):
    """temperature > 0 is speculative sampling through DFlash (the engine's tests prove it keeps
    the target's distribution); the request's seed gives the engine's own seeded run, and
    "dflash": false gives plain sampling through mlx-lm with the same seed."""
    s = served
    ids = s.pair.encode("hello", chat_template=False)
    sampling = Sampling(1.0, 0.9, 7)
    *_, ours = s.worker.call(lambda: list(s.pair.dflash(ids, 30, sampling=sampling)))
    *_, plain = s.worker.call(lambda: list(s.pair.baseline(ids, 30, sampling=sampling)))
    for extra, path, ref in (({}, "dflash", ours), ({"dflash": False}, "plain", plain)):
        raw = s.client.completions.with_raw_response.create(
            model=MODEL, prompt="hello", max_tokens=30, temperature=1.0, top_p=0.9, seed=7, extra_body=extra
        )
        r = raw.parse()
        assert raw.headers["x-dflash-path"] == path
        assert r.choices[0].text == s.pair.decode([t for t in ref.tokens if t not in s.pair.eos_ids])
        assert r.usage.completion_tokens == len(ref.tokens)
        assert metric_values(s)[f"dflash_requests_total[outcome=length][path={path}]"] >= 1
    assert ours.cycles > 0 and ours.sampling == sampling


def test_bad_requests_get_openai_errors(served):
    s = served
    # malformed JSON
    r = httpx.post(
        s.url + "/v1/chat/completions",
        content=b'{"model": "x", "messages": [',
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
    assert r.json()["error"]["type"] == "invalid_request_error"
    # a field of the wrong type
    r = httpx.post(s.url + "/v1/completions", json={"prompt": "x", "max_tokens": "many"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"
    # unknown model
    with pytest.raises(openai.NotFoundError) as e:
        s.client.chat.completions.create(model="gpt-17", messages=[{"role": "user", "content": "hi"}])
    assert "gpt-17" in str(e.value) and e.value.body["code"] == "model_not_found"
    # max_tokens out of range, both ways
    for n in (0, 10**6):
        with pytest.raises(openai.BadRequestError) as e:
            s.client.completions.create(model=MODEL, prompt="hi", max_tokens=n)
        assert e.value.body["param"] == "max_tokens" and "out of range" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError):
        s.client.completions.create(model=MODEL, prompt="hi", temperature=5)
    with pytest.raises(openai.BadRequestError):
        s.client.completions.create(model=MODEL, prompt="", max_tokens=5)
    with pytest.raises(openai.BadRequestError):
        s.client.completions.create(model=MODEL, prompt="hi", max_tokens=5, n=2)
    r = httpx.get(s.url + "/v1/nothing")
    assert r.status_code == 404 and "error" in r.json()
    # and the server still answers
    text, _, _ = greedy(s, "hi", 8, chat=False)
    assert s.client.completions.create(model=MODEL, prompt="hi", max_tokens=8).choices[0].text == text
    assert metric_values(s)["dflash_requests_total[outcome=invalid][path=none]"] >= 8


def test_client_disconnect_stops_generation(served):
    s = served
    idle(s)
    max_tokens = 3000
    body = {"model": MODEL, "prompt": "x = [1, 2", "max_tokens": max_tokens, "stream": True}
    with httpx.stream("POST", s.url + "/v1/completions", json=body, timeout=30) as r:
        assert r.status_code == 200
        lines = 0
        for line in r.iter_lines():
            lines += bool(line)
            if lines == 3:
                break  # leave mid-stream: the connection closes with the response
    idle(s)
    last = httpx.get(s.url + "/metrics.json").json()["requests"][-1]
    assert last["outcome"] == "cancelled" and last["stop_reason"] == "cancelled"
    assert last["generated_tokens"] < max_tokens / 2
    # the worker is free: the next request is answered, and correctly
    text, _, _ = greedy(s, "x = [1, 2", 40, chat=False)
    assert s.client.completions.create(model=MODEL, prompt="x = [1, 2", max_tokens=40).choices[0].text == text


def test_concurrent_clients_each_get_their_own_answer(served):
    s = served
    jobs = [
        ("hello", True, False),
        ("import os\n", False, True),
        ("class Stack:", True, True),
        (PROMPT, False, False),
        ("x = [1, 2", False, True),
        ("hello", False, False),
    ]
    expected = [greedy(s, p, 64, chat)[0] for p, chat, _ in jobs]

    def ask(job):
        prompt, chat, stream = job
        if chat:
            r = s.client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": prompt}], max_tokens=64, stream=stream
            )
            return "".join(c.choices[0].delta.content or "" for c in r) if stream else r.choices[0].message.content
        r = s.client.completions.create(model=MODEL, prompt=prompt, max_tokens=64, stream=stream)
        return "".join(c.choices[0].text for c in r) if stream else r.choices[0].text

    with ThreadPoolExecutor(len(jobs)) as pool:
        answers = list(pool.map(ask, jobs))
    assert answers == expected


def test_metrics_count_what_the_engine_did(served):
    s = served
    # the pinned draft's prompt, under the fixed policy, which verifies what the draft is sure of
    # (on this random pair the adaptive one soon stops drafting: see the next test)
    s.client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=48, extra_body={"dflash_policy": "fixed"})
    idle(s)
    m = metric_values(s)
    runs = [r for r in httpx.get(s.url + "/metrics.json").json()["requests"] if r["path"] == "dflash" and "cycles" in r]
    assert m["dflash_spec_decode_num_drafts_total"] > 0
    assert m["dflash_spec_decode_num_draft_tokens_total"] > 0
    assert m["dflash_spec_decode_num_accepted_tokens_total"] > 0
    # plain steps draft nothing: a draft is a drafted cycle
    assert m["dflash_spec_decode_num_drafts_total"] == sum(r["cycles"] - r["plain_steps"] for r in runs)
    assert m["dflash_policy_plain_steps_total"] == sum(r["plain_steps"] for r in runs)
    assert m["dflash_spec_decode_num_draft_tokens_total"] == sum(r["drafted_tokens"] for r in runs)
    assert m["dflash_spec_decode_num_accepted_tokens_total"] == sum(r["accepted_tokens"] for r in runs)
    per_pos = [sum(r["accepted_per_position"][k] for r in runs) for k in range(s.pair.block_size - 1)]
    assert [
        m[f"dflash_spec_decode_num_accepted_tokens_per_pos_total[position={k}]"] for k in range(s.pair.block_size - 1)
    ] == per_pos
    assert m["dflash_generation_tokens_total[path=dflash]"] == sum(r["generated_tokens"] for r in runs)
    assert m["dflash_tokens_per_cycle_count"] == sum(r["cycles"] for r in runs)  # every cycle, plain steps too
    # the verified-rows histogram: one observation per cycle, v summed, cumulative buckets 0..B-1
    assert m["dflash_policy_verified_rows_count"] == sum(r["cycles"] for r in runs)
    assert m["dflash_policy_verified_rows_sum"] == sum(r["drafted_tokens"] for r in runs)
    B = s.pair.block_size
    for k in range(B):
        below = sum(sum(r["verified_rows"][: k + 1]) for r in runs)
        assert m[f"dflash_policy_verified_rows_bucket[le={float(k)}]"] == below, k
    assert m["dflash_policy_verified_rows_bucket[le=+Inf]"] == sum(r["cycles"] for r in runs)
    assert m["dflash_request_latency_seconds_count[path=dflash]"] == len(runs)
    assert m["dflash_time_to_first_token_seconds_count[path=dflash]"] == len(runs)
    assert m["dflash_requests_running"] == 0


def test_each_request_chooses_its_policy_and_the_metrics_follow(served):
    """A request's "dflash_policy" picks DFlash's verification policy; what its run did moves the
    metrics by exactly as much. On this random pair the adaptive policy takes plain steps (the
    draft rarely agrees off its pinned prompt), and the text is plain greedy's either way."""
    s = served
    idle(s)
    text, tokens, _ = greedy(s, "hello", 48, chat=False)
    for policy in ("adaptive", "fixed"):
        before = metric_values(s)
        r = httpx.post(
            s.url + "/v1/completions",
            json={"model": MODEL, "prompt": "hello", "max_tokens": 48, "dflash_policy": policy},
            timeout=120,
        )
        assert r.status_code == 200, r.text
        body = r.json()
        run = body["dflash"]
        after = metric_values(s)

        def moved(name, after=after, before=before):
            return after[name] - before.get(name, 0.0)

        assert body["choices"][0]["text"] == text and run["generated_tokens"] == len(tokens)
        assert run["policy"] == policy and sum(run["verified_rows"]) == run["cycles"]
        assert moved("dflash_policy_plain_steps_total") == run["plain_steps"]
        assert moved("dflash_spec_decode_num_drafts_total") == run["cycles"] - run["plain_steps"]
        assert moved("dflash_policy_verified_rows_count") == run["cycles"]
        assert moved("dflash_policy_verified_rows_sum") == run["drafted_tokens"]
        assert moved("dflash_policy_verified_rows_bucket[le=0.0]") == run["verified_rows"][0]
        assert moved("dflash_spec_decode_num_draft_tokens_total") == run["drafted_tokens"]
        if policy == "adaptive":
            assert run["plain_steps"] > 0, "the adaptive policy should step plainly on this pair's bad drafts"
        else:
            assert run["plain_steps"] == 0  # the fixed policy always drafts


def test_a_bad_policy_is_a_400_that_says_what_to_send(served):
    s = served
    before = metric_values(s)["dflash_requests_total[outcome=invalid][path=none]"]
    for bad, says in (("greedy", '"greedy" is not a policy'), (3, "valid string")):
        r = httpx.post(s.url + "/v1/completions", json={"model": MODEL, "prompt": "hi", "dflash_policy": bad})
        assert r.status_code == 400, bad
        error = r.json()["error"]
        assert error["param"] == "dflash_policy" and error["type"] == "invalid_request_error"
        assert says in error["message"] and "\n" not in error["message"]
    with pytest.raises(openai.BadRequestError) as e:
        s.client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], extra_body={"dflash_policy": "Adaptive"}
        )
    message = e.value.body["message"]
    assert message == (
        'dflash_policy "Adaptive" is not a policy: use "adaptive" or "fixed", '
        "or leave it out for this server's (the default)"
    )
    assert metric_values(s)["dflash_requests_total[outcome=invalid][path=none]"] == before + 3


def test_models_and_health(served):
    s = served
    assert [m.id for m in s.client.models.list()] == [MODEL]
    assert s.client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError):
        s.client.models.retrieve("gpt-17")
    h = httpx.get(s.url + "/health").json()
    assert h["status"] == "ok" and h["block_size"] == s.pair.block_size


def test_serve_command_must_show(served):
    """The issue's must-show: `python -m dflash_core serve` (on the shipped pair when it is in the
    checkout, else the pinned random pair) answers the official client, plain and streamed, with
    plain greedy decoding's text; afterwards /metrics counts drafts and accepted tokens above 0."""
    s = served
    if SHIPPED_TARGET.exists():
        args, model, prompt = [], DEFAULT_PAIR, "What is the capital of France?"
        pair = s.worker.call(load_pair)
    else:
        args, model, prompt, pair = ["--model", str(s.target), "--draft", str(s.draft)], str(s.target), PROMPT, s.pair
    lone = SimpleNamespace(pair=pair, worker=s.worker)
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "dflash_core", "serve", *args, "--port", str(port), "--no-playground"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.time() + 60
        while time.time() < deadline and proc.poll() is None:
            try:
                httpx.get(url + "/health")
                break
            except httpx.TransportError:
                time.sleep(0.2)
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        chat_text, _, _ = greedy(lone, prompt, 48, chat=True)
        r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": prompt}], max_tokens=48)
        assert r.choices[0].message.content == chat_text
        text, _, _ = greedy(lone, prompt, 48, chat=False)
        # the default policy answered the chat request; this one asks for the fixed policy, which
        # verifies what the draft is sure of (the adaptive one may stop drafting a random draft)
        stream = client.completions.create(
            model=model, prompt=prompt, max_tokens=48, stream=True, extra_body={"dflash_policy": "fixed"}
        )
        assert "".join(c.choices[0].text for c in stream) == text
        m = metric_values(SimpleNamespace(url=url))
        assert m["dflash_spec_decode_num_drafts_total"] > 0
        assert m["dflash_spec_decode_num_accepted_tokens_total"] > 0
        # a second server on the same port is refused in one line, before loading anything
        busy = subprocess.run(
            [sys.executable, "-m", "dflash_core", "serve", "--port", str(port)],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert busy.returncode == 2
        assert busy.stderr.strip().startswith("error: cannot listen") and "Traceback" not in busy.stderr
    finally:
        proc.terminate()
        proc.wait(10)


def test_playground_is_mounted_beside_the_api(served):
    from fastapi.testclient import TestClient

    from dflash_core.commands.serve import serving_app

    s = served
    app = serving_app(s.pair, MODEL, playground={"model": str(s.target), "draft": str(s.draft)})
    assert app.state.playground
    with TestClient(app) as c:
        page = c.get("/")
        assert page.status_code == 200 and "gradio" in page.text.lower()
        assert c.get("/v1/models").json()["data"][0]["id"] == MODEL
        assert c.get("/metrics").headers["content-type"].startswith("text/plain")


@pytest.mark.parametrize("scheme", ["byte-level", "sentencepiece"])
@pytest.mark.parametrize("step", [1, 3, 16])
def test_detokenizer_streams_exactly_the_full_text(scheme, step):
    """Text streamed a few tokens at a time is the full decode: multi-byte characters split over
    tokens are held back until complete, and SentencePiece's word-initial spaces survive."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    text = "naïve café 中文字 テキスト 😀🚀 the quick brown fox, déjà vu: ünïcödé and   spaces\n\tend"
    tok = Tokenizer(models.BPE())
    if scheme == "byte-level":
        tok.pre_tokenizer, tok.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
        alphabet = pre_tokenizers.ByteLevel.alphabet()
    else:
        tok.pre_tokenizer, tok.decoder = pre_tokenizers.Metaspace(), decoders.Metaspace()
        alphabet = sorted(set(text.replace(" ", "\u2581")))
    tok.train_from_iterator(
        [text] * 3, trainers.BpeTrainer(vocab_size=280, initial_alphabet=alphabet, show_progress=False)
    )
    ids = tok.encode(text).ids
    full = tok.decode(ids)
    assert scheme != "byte-level" or full == text
    detok, pieces = TextStream(tok), []
    for i in range(0, len(ids), step):
        pieces.append(detok.add(ids[i : i + step]))
    pieces.append(detok.finish())
    assert "".join(pieces) == full
    assert not any("\ufffd" in p for p in pieces)  # no piece is half a character
    if step == 1 and scheme == "byte-level":
        assert "" in pieces  # some token was part of a character: it waited for the rest
