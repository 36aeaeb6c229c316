"""The server's text handling on a scripted pair: the engine's cycles are given (which tokens each
cycle commits), so where a character or a stop string falls across cycles is chosen by the test,
not left to what a random model happens to say. Tokens are single UTF-8 bytes, as byte-level BPE
tokens can be: a multi-byte character is then always split over tokens."""

import json
from types import SimpleNamespace

import pytest
from fastapi.testclient import TestClient

from dflash_core.engine.events import CycleEvent, RunSummary
from dflash_core.errors import DFlashError
from dflash_core.serving.routes import create_app

pytestmark = pytest.mark.slow

EOS = 256
BLOCK = 4


def decode(ids) -> str:
    return bytes(t for t in ids if t != EOS).decode("utf-8", errors="replace")


class ScriptedPair:
    """What the server uses of a Pair; dflash() commits the tokens of `cycles`, a list per cycle."""

    name, block_size, context_length = "scripted", BLOCK, 4096
    model = None  # what the server hands mlx-lm's wired_limit (which ignores it off Apple silicon)
    eos_ids = {EOS}
    tokenizer = SimpleNamespace(has_chat_template=False, decode=decode)
    draft = SimpleNamespace(config=SimpleNamespace(vocab_size=EOS + 1))

    def __init__(self):
        self.cycles = []  # token lists, one per cycle

    def encode(self, prompt, chat_template=True):
        return list(prompt.encode())

    def check_request(self, ids, max_tokens, block_size):
        if not 1 <= max_tokens <= self.context_length - len(ids):
            raise DFlashError(f"max tokens {max_tokens} is out of range")

    def decode(self, ids):
        return decode(ids)

    def text(self, ids):
        return decode(ids)

    def dflash(self, ids, max_tokens, should_stop=lambda: False, min_confidence=None, sampling=None, policy=None):
        tokens, stop = [], "max_tokens"
        for i, committed in enumerate(self.cycles):
            committed = committed[: max_tokens - len(tokens)]
            tokens += committed
            yield CycleEvent(
                cycle=i,
                block_size=BLOCK,
                staged_token=committed[0],
                drafted=[0] * (BLOCK - 1),
                confidence=[1.0] * (BLOCK - 1),
                verified=BLOCK - 1,
                posterior=[0] * BLOCK,
                accepted_len=len(committed) - 1,
                committed=committed,
                next_staged=0,
                kv_trimmed=0,
                gdn_replayed=0,
                draft_ms=0,
                verify_ms=0,
                rollback_ms=0,
                t=0,
            )
            if tokens[-1] == EOS:
                stop = "eos"
                break
            if len(tokens) >= max_tokens:
                break
            if should_stop():
                stop = "cancelled"
                break
        yield RunSummary(
            engine="dflash",
            prompt_tokens=len(ids),
            tokens=tokens,
            prefill_s=0,
            decode_s=0.01,
            stop_reason=stop,
            peak_memory_mb=0,
            block_size=BLOCK,
            cycles=i + 1,
            drafted_tokens=(BLOCK - 1) * (i + 1),
            accepted_tokens=len(tokens) - i - 1,
            accepted_per_position=[0] * (BLOCK - 1),
        )


@pytest.fixture(scope="module")
def scripted():
    pair = ScriptedPair()
    with TestClient(create_app(pair, "scripted")) as client:
        yield pair, client


def ask(client, stop, stream: bool, max_tokens=100):
    body = {"prompt": "go", "max_tokens": max_tokens, "stop": stop, "stream": stream}
    r = client.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    if not stream:
        choice = r.json()["choices"][0]
        return choice["text"], choice["finish_reason"], r.json()["usage"]["completion_tokens"]
    chunks = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
    text = "".join(c["choices"][0]["text"] for c in chunks)
    return text, chunks[-1]["choices"][0]["finish_reason"], None


def split(data: bytes, at: int) -> list:
    """The bytes as two cycles, the first ending before byte `at`."""
    return [list(data[:at]), list(data[at:])]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    "text,stops,expected",
    [
        # 'a中' is the stop string and 中 is three bytes: the text ends just before 'a中'
        ("xya中bc", ["a中"], ("xy", "stop")),
        # characters split over two cycles come out whole
        ("é中😀 ok", ["never"], ("é中😀 ok", "length")),
    ],
)
def test_characters_split_across_cycles(scripted, stream, text, stops, expected):
    """Wherever the cycle boundary falls, inside a multi-byte character included."""
    pair, client = scripted
    data = text.encode()
    for at in range(1, len(data)):
        pair.cycles = split(data, at)
        got, finish, _ = ask(client, stops, stream)
        assert (got, finish) == expected, f"cycle boundary before byte {at}"
