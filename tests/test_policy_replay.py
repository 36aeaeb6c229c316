"""scripts/policy_replay.py: the engine's Policy replayed over a recorded reply, and the hindsight
ceiling, on synthetic records whose outcomes are known."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "policy_replay.py"
B = 8
COSTS = {"plain_s": 0.05, "draft_s": 0.015, "verify_s": [0.05 + 0.005 * r for r in range(B)]}


@pytest.fixture(scope="module")
def replay_module():
    spec = importlib.util.spec_from_file_location("policy_replay", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def probed(replay_module, costs: dict):
    """A fresh profile at these costs (no run before)."""
    return replay_module.CostProfile(costs["draft_s"], costs["verify_s"])


def record(right: bool, n: int = 60) -> dict:
    """A reply of n tokens after a 5-token prompt; at each position the draft proposes the next
    B-1 reply tokens (right) or tokens that never occur (wrong), sure of them either way."""
    seq = list(range(100, 105)) + list(range(1000, 1000 + n))
    start = 5
    proposals = []
    for pos in range(start, len(seq)):
        ahead = seq[pos + 1 : pos + B]
        proposals.append((ahead + [-5] * B)[: B - 1] if right else [-7] * (B - 1))
    return {
        "prompt_len": start,
        "seq": seq,
        "target_sure": [0.9] * (n + 1),
        "proposals": proposals,
        "confidence": [[0.95] * (B - 1)] * n,
    }


def test_a_draft_that_is_always_right_reaches_its_ceiling(replay_module):
    rec = record(right=True)
    ceiling = replay_module.hindsight(rec, COSTS, B)
    # every cycle commits B tokens for a draft and an 8-row verify
    assert ceiling == pytest.approx(8 * 0.05 / (0.015 + 0.05 + 0.005 * 7), rel=0.15)
    speedup, per_cycle, plain, cycles = replay_module.replay(
        rec, COSTS, probed(replay_module, COSTS), {}, B, "fixed", np.random.default_rng(0), 0.0
    )
    assert plain == 0 and per_cycle > 6
    assert speedup <= ceiling + 1e-9


def test_a_draft_that_is_always_wrong_leaves_plain_decoding(replay_module):
    rec = record(right=False)
    assert replay_module.hindsight(rec, COSTS, B) == pytest.approx(1.0)
    fixed = replay_module.replay(
        rec, COSTS, probed(replay_module, COSTS), {}, B, "fixed", np.random.default_rng(0), 0.0
    )
    adaptive = replay_module.replay(
        rec, COSTS, probed(replay_module, COSTS), {}, B, "adaptive", np.random.default_rng(0), 0.0
    )
    assert fixed[1] == 1.0 and fixed[0] < 0.9  # one token per drafted cycle: slower than plain
    assert adaptive[2] > adaptive[3] / 2  # the adaptive policy steps plainly most of the time
    assert adaptive[0] > fixed[0]


def test_replayed_as_on_a_gpu_every_proposal_is_verified_whatever_the_draft_says(replay_module):
    """A right draft that doubts all but its first proposal: the CPU's fixed rule (threshold 0.2)
    verifies one proposal a cycle; as on a GPU, where the confidence is not read before the verify,
    the fixed rule verifies the whole block, at the costs `--gpu-costs` gives."""
    rec = record(right=True)
    rec["confidence"] = [[0.95] + [0.05] * (B - 2)] * len(rec["confidence"])
    costs = replay_module.gpu_costs(replay_module.milliseconds("50,15,50,85"), B)
    verify_s = costs["short"]["verify_s"]
    assert verify_s[0] == pytest.approx(0.05) and verify_s[-1] == pytest.approx(0.085)
    rng = np.random.default_rng
    cpu = replay_module.replay(rec, COSTS, probed(replay_module, COSTS), {}, B, "fixed", rng(0), 0.0)
    gpu = replay_module.replay(
        rec, costs["short"], probed(replay_module, costs["probe"]), {}, B, "fixed", rng(0), 0.0, gpu=True
    )
    assert cpu[1] <= 2 and gpu[1] > 6
