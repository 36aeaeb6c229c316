"""Fixtures for the playground tests: the pair to serve and the launched app.

The shipped pair is used when it is present. Without it the tests build a random pair; a random
draft almost never agrees with a random target, so the pages would never show an accepted token
and the checks for accepted spans could not fail for the right reason. The fallback draft is
therefore pinned: its layers are zeroed and its final norm aimed so that every proposal is the
token the random target falls into repeating on the test prompt. The engine and the target still
verify every proposal, so acceptances, rejections and the lossless verdict are all real.
"""

import socket
from collections import Counter
from pathlib import Path

import mlx.core as mx
import pytest

import dflash_core  # noqa: F401  (system BLAS before MLX)
from dflash_core.models.loading import load_pair
from dflash_core.models.registry import DEFAULT_PAIR, SHIPPED
from dflash_core.serving.worker import default_worker
from dflash_core.training.random_models import write_draft, write_target

PROMPT = "def binary_search(items, target):\n"
MAX_TOKENS = 48
SHIPPED_TARGET = SHIPPED[DEFAULT_PAIR][0]  # the GGUF that scripts/install.sh fetches


def pin_draft(target_dir: Path, draft_dir: Path, prompt: str, max_tokens: int):
    """Rewrite the random draft so that it always proposes the target's most repeated token."""
    pair = load_pair(str(target_dir), str(draft_dir))
    ids = pair.encode(prompt, chat_template=False)
    tokens = list(pair.baseline(ids, max_tokens))[-1].tokens
    loop_token = Counter(tokens).most_common(1)[0][0]
    weights = dict(mx.load(str(draft_dir / "model.safetensors")))
    for name in weights:
        if name.endswith(("o_proj.weight", "down_proj.weight")):
            weights[name] = mx.zeros_like(weights[name])  # the block passes through unchanged
    mask = pair.target.embed(mx.array([pair.draft.config.mask_token_id]))[0]
    # logits_j = head_j . (norm(mask) * w); with w = mask * head_loop the loop token wins
    weights["norm.weight"] = mask * pair.model.lm_head.weight[loop_token]
    mx.save_safetensors(str(draft_dir / "model.safetensors"), weights)


def pinned_random_pair(root: Path):
    """(target dir, draft dir, loaded Pair): a random qwen3 pair with its draft pinned, for the
    server's tests."""
    target = write_target(root / "target", "qwen3", seed=3)
    draft = write_draft(root / "draft", target, layers=1, seed=4)
    worker = default_worker()
    worker.call(pin_draft, target, draft, PROMPT, MAX_TOKENS)
    return target, draft, worker.call(load_pair, str(target), str(draft))


def playground_pair(root: Path):
    """(model, draft) for build_app: the shipped default pair, or a pinned random pair."""
    if SHIPPED_TARGET.exists():
        return None, None
    target = write_target(root / "target", "qwen3", seed=3)
    draft = write_draft(root / "draft", target, layers=1, seed=4)
    default_worker().call(pin_draft, target, draft, PROMPT, MAX_TOKENS)
    return str(target), str(draft)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The launched playground: (url, model key, demo)."""
    from ui import build_app

    model, draft = playground_pair(tmp_path_factory.mktemp("ui-pair"))
    demo, launch_kwargs = build_app(model, draft, max_tokens_cap=256)
    port = free_port()
    demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True, **launch_kwargs)
    key = f"{model} + {draft}" if model else DEFAULT_PAIR
    yield f"http://127.0.0.1:{port}/", key, demo
    demo.close()
