"""scripts/policy_trace.py: a trace's cycles summed by kind, measured against predicted."""

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "policy_trace.py"


def load_script():
    spec = importlib.util.spec_from_file_location("policy_trace", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def cycle(plain, verified, accepted, ms, expected, predicted, step_ms=12.5) -> dict:
    """A traced cycle as trace() writes it; the cost model's plain step at `step_ms`."""
    return {
        "plain_step": bool(plain),
        "verified": verified,
        "accepted_len": accepted,
        "cycle_ms": ms,
        "measured_steps": ms / step_ms,
        "step_ms": step_ms,
        "expected_tokens": expected,
        "predicted_steps": predicted,
        "reason": "plain step" if plain else f"verify {verified} of 7",
    }


CYCLES = [
    cycle(0, 7, 3, 30.0, 2.5, 1.5),
    cycle(1, 0, 0, 11.0, 1.0, 1.0),
    cycle(0, 7, 0, 15.0, 2.1, 1.4),
    cycle(1, 0, 0, 9.0, 1.0, 1.0),
    cycle(0, 5, 5, 15.0, 3.0, 1.3),
]


def test_a_trace_sums_each_kind_of_cycle_in_plain_decoding_steps():
    out = load_script().summary(CYCLES, step_ms=10.0)
    assert out["plain_steps"] == 2 and out["drafted_cycles"] == 3
    assert out["plain_step_in_steps"] == 1.0  # 20 ms over 2 steps of 10 ms
    assert out["drafted_tokens"] == 3.67  # (4 + 1 + 6) / 3, rounded
    assert out["drafted_cycle_in_steps"] == 2.0  # 60 ms over 3 cycles of 10 ms steps
    assert out["drafted_expected_tokens"] == 2.5 and out["drafted_predicted_steps"] == 1.4  # medians


def test_a_trace_measures_drafted_cycles_in_the_cost_models_steps_too():
    out = load_script().summary(CYCLES, step_ms=10.0)
    assert out["drafted_measured_steps"] == 1.2  # median of 30, 15, 15 ms over the model's 12.5 ms
    assert out["model_step_in_steps"] == 1.25  # the model's step against plain decoding's 10 ms


def test_a_trace_of_plain_steps_alone_has_no_drafted_figures():
    out = load_script().summary([cycle(1, 0, 0, 12.0, 1.0, 1.0)], step_ms=10.0)
    assert out == {"plain_steps": 1, "drafted_cycles": 0, "plain_step_in_steps": 1.2}
