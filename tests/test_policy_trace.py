"""scripts/policy_trace.py: a trace's cycles summed by kind, measured against predicted."""

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "policy_trace.py"


def load_script():
    spec = importlib.util.spec_from_file_location("policy_trace", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_trace_sums_each_kind_of_cycle_in_plain_decoding_steps():
    summary = load_script().summary
    # [plain step, verified, accepted_len, cycle_ms, expected_tokens, predicted_steps, reason]
    cycles = [
        [0, 7, 3, 30.0, 2.5, 1.5, "verify 7 of 7"],
        [1, 0, 0, 11.0, 1.0, 1.0, "plain step"],
        [0, 7, 0, 15.0, 2.1, 1.4, "verify 7 of 7"],
        [1, 0, 0, 9.0, 1.0, 1.0, "plain step"],
        [0, 5, 5, 15.0, 3.0, 1.3, "verify 5 of 7"],
    ]
    out = summary(cycles, step_ms=10.0)
    assert out["plain_steps"] == 2 and out["drafted_cycles"] == 3
    assert out["plain_step_in_steps"] == 1.0  # 20 ms over 2 steps of 10 ms
    assert out["drafted_tokens"] == 3.67  # (4 + 1 + 6) / 3, rounded
    assert out["drafted_cycle_in_steps"] == 2.0  # 60 ms over 3 cycles of 10 ms steps
    assert out["drafted_expected_tokens"] == 2.5 and out["drafted_predicted_steps"] == 1.4  # medians


def test_a_trace_of_plain_steps_alone_has_no_drafted_figures():
    out = load_script().summary([[1, 0, 0, 12.0, 1.0, 1.0, "plain step"]], step_ms=10.0)
    assert out == {"plain_steps": 1, "drafted_cycles": 0, "plain_step_in_steps": 1.2}
