"""The server's prefix cache over a multi-turn chat: each turn's reply is what a lone cold greedy
run gives, /metrics counts the prompt tokens it restored instead of prefilling (the figure is
computed here from the token ids), and concurrent conversations keep their own answers."""

from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest
from test_server import MODEL, metric_values, serving
from ui_pair import pinned_random_pair

from dflash_core.models.tokenizer import chat_ids
from dflash_core.serving.worker import default_worker

pytestmark = pytest.mark.slow

TURNS = ["class Stack:", "def push(self, item):", "and pop?"]
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def pinned(tmp_path_factory):
    _, _, pair = pinned_random_pair(tmp_path_factory.mktemp("prefix-pair"))
    return SimpleNamespace(pair=pair, worker=default_worker())


def cold_reply(s, messages) -> tuple:
    """(prompt ids, reply text, reply ids): a lone plain greedy run of the conversation so far."""
    ids = chat_ids(s.pair.tokenizer, messages)
    *_, summary = s.worker.call(lambda: list(s.pair.baseline(ids, MAX_TOKENS)))
    return ids, s.pair.text(summary.tokens), summary.tokens


def common_length(a, b) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def chat(s, messages):
    return s.client.chat.completions.create(model=MODEL, messages=messages, max_tokens=MAX_TOKENS)


def test_a_conversation_reuses_its_earlier_turns(pinned):
    with serving(pinned) as s:
        messages, seen, reused = [], [], 0
        for turn in TURNS:
            messages.append({"role": "user", "content": turn})
            ids, text, reply = cold_reply(s, messages)
            # attention caches resume from the longest prefix fed before, short of the last token
            expected = max((min(common_length(ids, fed), len(ids) - 1) for fed in seen), default=0)
            r = chat(s, messages)
            assert r.choices[0].message.content == text
            assert r.usage.prompt_tokens_details.cached_tokens == expected
            reused += expected
            seen += [ids, ids + reply]
            messages.append({"role": "assistant", "content": text})
        m = metric_values(s)
        assert m["dflash_prefix_cache_reused_tokens_total"] == reused > len(chat_ids(s.pair.tokenizer, messages[:1]))
        assert m["dflash_prefix_cache_hits_total"] == len(TURNS) - 1
        assert m["dflash_prefix_cache_misses_total"] == 1
        assert m["dflash_prefix_cache_snapshots"] == 2 * len(TURNS)
        assert 0 < m["dflash_prefix_cache_bytes"] <= m["dflash_prefix_cache_limit_bytes"] == 1024 * 2**20


def test_concurrent_conversations_each_get_a_cold_runs_answer(pinned):
    """Two-turn conversations sent at once, some sharing their first turn: every reply is a lone
    cold run's, whichever snapshots the others left meanwhile."""
    firsts = ["class Stack:", "import os\n", "class Stack:", "hello"]
    with serving(pinned) as s:
        conversations = []
        for first in firsts:
            messages = [{"role": "user", "content": first}]
            _, text, _ = cold_reply(s, messages)
            messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "more"}]
            conversations.append((messages, cold_reply(s, messages)[1]))

        def ask(conversation):
            messages, _ = conversation
            return [chat(s, messages[:1]).choices[0].message.content, chat(s, messages).choices[0].message.content]

        with ThreadPoolExecutor(len(conversations)) as pool:
            answers = list(pool.map(ask, conversations))
        assert answers == [[m[1]["content"], text] for m, text in conversations]
        assert metric_values(s)["dflash_prefix_cache_hits_total"] >= len(firsts)


def test_no_prefix_cache_at_0_mb(pinned):
    with serving(pinned, prefix_cache_mb=0) as s:
        messages = [{"role": "user", "content": "class Stack:"}]
        for _ in range(2):
            r = chat(s, messages)
            assert r.usage.prompt_tokens_details.cached_tokens == 0
        assert not any(k.startswith("dflash_prefix_cache") for k in metric_values(s))
        assert s.pair.prefix_cache is None
