"""`train-draft --data chat`: requests from templates and ones the target writes itself, never
the held-out evaluation requests."""

import json
import random

import pytest

import dflash_core  # noqa: F401  (system BLAS before MLX)
from dflash_core.models.registry import DEFAULT_PAIR, SHIPPED
from dflash_core.training.chat_prompts import HELDOUT, MIX, chat_prompts, template_prompts, user_turn_prefix
from dflash_core.training.decoding import load_frozen_target


def test_template_prompts_are_distinct_filled_requests_of_every_kind():
    kinds = json.loads(MIX.read_text())["kinds"]
    prompts = template_prompts(600, random.Random(0))
    assert len(prompts) == len(set(prompts)) == 600
    assert not any("{" in p or "}" in p for p in prompts)
    used = {
        kind
        for kind, k in kinds.items()
        if any(p.startswith(t.split("{topic}")[0]) for t in k["templates"] for p in prompts)
    }
    assert used == set(kinds)
    assert template_prompts(600, random.Random(0)) == prompts  # seeded


@pytest.mark.slow
def test_own_prompts_come_from_an_empty_user_turn_and_skip_the_heldout_set():
    model, tokenizer = load_frozen_target(str(SHIPPED[DEFAULT_PAIR][0]))
    prefix = user_turn_prefix(tokenizer)
    assert prefix.startswith("<|im_start|>system\n") and prefix.endswith("<|im_start|>user\n")
    train, held = chat_prompts(model, tokenizer, 20, seed=0, own_fraction=0.5, log=lambda _: None)
    assert held == json.loads(HELDOUT.read_text()) and not set(train) & set(held)
    assert 15 <= len(train) <= 20 and all(isinstance(p, str) and len(p) >= 12 and "<|" not in p for p in train)
