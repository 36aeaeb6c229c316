"""User prompts for training a draft for a chat target (`train-draft --data chat`).

Two sources, mixed: requests filled in from templates (`assets/prompts/chat_mix.json`: questions,
lists, emails, code, poems, ...), and requests the target writes itself: sampled at temperature
1 from an empty user turn, so they read like what its own training data asked (the Magpie
trick). Either way the draft then learns the target's own greedy replies to them.
"""

import json
import random
import time

import mlx.core as mx

from ..layout import ASSETS

PROMPTS = ASSETS / "prompts"
MIX = PROMPTS / "chat_mix.json"
HELDOUT = PROMPTS / "chat_heldout.json"  # hand-written, never trained on: every stage is measured here
_SENTINEL = "\x00USER\x00"


def heldout_requests() -> list:
    return json.loads(HELDOUT.read_text())


def template_prompts(n: int, rng: random.Random) -> list:
    """Up to n distinct requests: a kind drawn uniformly, then one of its templates and topics."""
    kinds = list(json.loads(MIX.read_text())["kinds"].values())
    room = sum(len(k["templates"]) * len(k["topics"]) for k in kinds)
    seen = {}
    while len(seen) < min(n, room * 3 // 4):  # drawn with replacement: stop well before exhausting them
        kind = rng.choice(kinds)
        seen.setdefault(rng.choice(kind["templates"]).format(topic=rng.choice(kind["topics"])), None)
    return list(seen)


def user_turn_prefix(tokenizer) -> str:
    """The chat-formatted text up to where a user's message starts (system prompt included)."""
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": _SENTINEL}], tokenize=False, add_generation_prompt=False, enable_thinking=False
    )
    return text[: text.index(_SENTINEL)]


def own_prompts(model, tokenizer, n: int, seed: int, batch: int = 512, max_tokens: int = 96, log=print) -> list:
    """Up to n distinct user messages the target writes itself: sampled (temperature 1, top-p
    0.95) after an empty user turn, kept when they end their turn within max_tokens."""
    from mlx_lm.sample_utils import make_sampler

    from .decoding import decode_batch

    batch = min(batch, 2 * n)  # a few asked for: a few sampled
    prefix = tokenizer.encode(user_turn_prefix(tokenizer), add_special_tokens=False)
    eos = list(tokenizer.eos_token_ids)
    sampler = make_sampler(temp=1.0, top_p=0.95)
    mx.random.seed(seed)
    kept, t0, tries = {}, time.time(), 0
    while len(kept) < n and tries < 4 * n:
        rows = decode_batch(model, [prefix] * batch, max_tokens, eos, sampler)
        tries += batch
        for row in rows:
            end = next((j for j, t in enumerate(row) if t in eos), None)
            if end is None:
                continue  # still talking after max_tokens: not a request
            text = tokenizer.decode(row[:end]).strip()
            if 12 <= len(text) and "<|" not in text:
                kept.setdefault(text, None)
        log(f"own prompts: {len(kept)}/{n} from {tries} samples, {time.time() - t0:.0f}s")
    return list(kept)[:n]


def chat_prompts(model, tokenizer, n: int, seed: int, own_fraction: float, log=print) -> tuple:
    """(train prompts, eval prompts): n requests, own_fraction of them the target's own; the
    evaluation set is the hand-written held-out file."""
    rng = random.Random(seed)
    own = own_prompts(model, tokenizer, round(n * own_fraction), seed, log=log) if own_fraction else []
    filled = template_prompts(n - len(own), rng)
    log(f"chat prompts: {len(own)} the target's own, {len(filled)} from templates")
    prompts = own + filled
    rng.shuffle(prompts)
    heldout = heldout_requests()
    seen_in_eval = set(heldout)
    return [p for p in prompts if p not in seen_in_eval], heldout
