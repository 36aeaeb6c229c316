"""The benchmark's side-by-side settings: each summary figure comes from its own runs only."""

import statistics

import pytest

import dflash_core  # noqa: F401  (system BLAS before MLX)
from dflash_core.benchmark import run_benchmark


@pytest.mark.slow
def test_confidence_sweep_runs_side_by_side_and_keeps_the_main_figures_apart(random_pairs):
    res = run_benchmark(
        random_pairs["qwen3"],
        ["def fib(n):", "class A:"],
        max_tokens=24,
        repeat=1,
        log=lambda *a: None,
        min_confidence=0.0,
        confidence_sweep=[0.0, 1.0],
    )
    dflash = [r for r in res["runs"] if r["engine"] == "dflash"]
    main = [r for r in dflash if r["min_confidence"] == 0.0]
    strict = [r for r in dflash if r["min_confidence"] == 1.0]
    assert len(main) == len(strict) == 2 and all(r["identical"] for r in dflash)
    # threshold 0 verifies past the first proposal (the last cycles only as many as the budget
    # leaves room for), threshold 1 only the first
    assert all(r["cycles"] < r["drafted_tokens"] <= 15 * r["cycles"] for r in main)
    assert all(r["drafted_tokens"] == r["cycles"] for r in strict)  # only the first, always
    s = res["summary"]
    assert s["dflash_tps_median"] == statistics.median(r["decode_tps"] for r in main)
    assert s["tokens_per_cycle_median"] == statistics.median(r["tokens_per_cycle"] for r in main)
    assert s["tokens_per_cycle_mean"] == sum(r["generated_tokens"] for r in main) / sum(r["cycles"] for r in main)
    base = [r for r in res["runs"] if r["engine"] == "baseline"]
    tps = lambda rs: sum(r["generated_tokens"] - 1 for r in rs) / sum(r["decode_s"] for r in rs)
    assert abs(s["overall_speedup_median"] - tps(main) / tps(base)) < 1e-9  # one repeat: one ratio
    assert s["confidence_sweep"][1]["overall_speedup_median"] == tps(strict) / tps(base)
    assert [c["min_confidence"] for c in s["confidence_sweep"]] == [0.0, 1.0]
    assert s["confidence_sweep"][1]["tokens_per_cycle_median"] == statistics.median(
        r["tokens_per_cycle"] for r in strict
    )
    assert res["config"]["confidence_sweep"] == [0.0, 1.0] and "sweep" not in s


def test_overall_speedup_weighs_prompts_by_time_and_takes_the_median_over_repeats():
    """Two prompts per repeat: one fast for DFlash (4x), one slow (1x). Each repeat's prompts
    are one workload, so the slow prompt's time dominates; the figure is the median of the
    repeats' ratios, not of the runs'."""
    from dflash_core.benchmark import overall_speedup

    def run(repeat, engine, seconds):
        return {"repeat": repeat, "engine": engine, "generated_tokens": 101, "decode_s": seconds}

    base, dflash = [], []
    for r, scale in enumerate([1.0, 1.0, 2.0]):  # the third repeat's DFlash runs twice as slow
        base += [run(r, "baseline", 1.0), run(r, "baseline", 1.0)]
        dflash += [run(r, "dflash", 0.25 * scale), run(r, "dflash", 1.0 * scale)]
    # repeat 0 and 1: 200 tokens in 2 s vs 1.25 s -> 1.6x; repeat 2: 2 s vs 2.5 s -> 0.8x
    assert overall_speedup(dflash, base) == 1.6


def test_text_view_lists_the_summary_rounded(random_dirs, capsys):
    """`benchmark` without --json prints one `name: value` line per summary figure, floats to 3
    decimals (lists too), and exits 0 when the outputs are identical."""
    import re

    from dflash_core.cli import main

    target, draft = random_dirs["qwen3"]
    assert (
        main(
            [
                "benchmark",
                "--model",
                str(target),
                "--draft",
                str(draft),
                "--prompt",
                "def f(x):",
                "--max-tokens",
                "12",
                "--repeat",
                "1",
                "--min-confidence",
                "0",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    names = [line.split(":")[0].strip() for line in out.splitlines()]
    assert {"speedup_median", "overall_speedup_median", "tokens_per_cycle_mean", "acceptance_by_position"} <= set(names)
    assert "identical: True" in out
    assert not re.search(r"\d\.\d{4,}", out), out  # no float printed past 3 decimals


class _BaselineWithOneTokenChanged:
    """The pair, but its plain decoding's token at `index` replaced: a divergence the benchmark
    must find and place."""

    def __init__(self, pair, index: int):
        self._pair, self._index = pair, index

    def __getattr__(self, name):
        return getattr(self._pair, name)

    def baseline(self, *args, **kwargs):
        from dataclasses import replace

        *events, summary = self._pair.baseline(*args, **kwargs)
        tokens = list(summary.tokens)
        tokens[self._index] = (tokens[self._index] + 1) % self._pair.target.model.args.vocab_size
        yield from events
        yield replace(summary, tokens=tokens)


@pytest.mark.slow
def test_a_run_that_differs_from_greedy_is_flagged_and_placed(random_pairs):
    from dflash_core.benchmark import divergence_line

    pair = _BaselineWithOneTokenChanged(random_pairs["qwen3"], index=5)
    res = run_benchmark(pair, ["def fib(n):"], max_tokens=16, repeat=1, log=lambda *a: None, min_confidence=0.0)
    dflash = next(r for r in res["runs"] if r["engine"] == "dflash")
    assert dflash["identical"] is False and dflash["divergence"]["index"] == 5
    baseline = next(r for r in res["runs"] if r["engine"] == "baseline")
    assert "divergence" not in baseline  # the baseline against itself
    s = res["summary"]
    assert s["identical"] is False
    assert s["divergences"] == [
        {"repeat": 0, "prompt": 0, "engine": "dflash", "block_size": 16, "policy": "fixed", "min_confidence": 0.0}
        | dflash["divergence"]
    ]
    assert dflash["divergence"]["top2_margin"] >= 0
    line = divergence_line(s)
    assert line.startswith("not identical: 1 run(s)") and "prompt 1, dflash, block 16" in line
    assert "token 5" in line and "\n" not in line


@pytest.mark.slow
def test_a_shared_prefill_runs_every_engine_from_one_prefill_and_changes_no_token(random_pairs):
    pair = random_pairs["llama"]
    prompts = ["def fib(n):\n    if n < 2:\n        return n", "import os\nimport sys\n\n\ndef main():"]
    kw = dict(max_tokens=20, repeat=1, log=lambda *a: None, min_confidence=0.0, policy_sweep=["adaptive"])
    apart = run_benchmark(pair, prompts, **kw)
    shared = run_benchmark(pair, prompts, shared_prefill=True, **kw)
    assert shared["config"]["shared_prefill"] and not apart["config"]["shared_prefill"]
    assert len(apart["runs"]) == len(shared["runs"]) == 6  # per prompt: baseline, fixed, adaptive
    for k, (a, s) in enumerate(zip(apart["runs"], shared["runs"])):
        assert (a["prompt"], a["engine"], a.get("policy")) == (s["prompt"], s["engine"], s.get("policy"))
        assert s["identical"] and a["generated_tokens"] == s["generated_tokens"] and a["cached_prompt_tokens"] == 0
        # plain decoding and the first DFlash run resume short of the last token and feed it; the
        # first DFlash run snapshots the prompt with its logits, which the second then takes whole
        assert s["cached_prompt_tokens"] == s["prompt_tokens"] - (k % 3 < 2)


def test_a_shared_prefill_gives_plain_decoding_the_tokens_of_a_whole_prefill(random_pairs):
    """Plain decoding resumed from a prefix snapshot of all but the prompt's last token writes
    what it writes after prefilling the whole prompt itself."""
    pair = random_pairs["qwen3"]
    ids = pair.encode("class Stack:\n    def __init__(self):", False)
    *_, whole = pair.baseline(ids, 24)
    *_, resumed = pair.baseline(ids, 24, prefix_cache=pair.prefilled(ids))
    assert resumed.cached_prompt_tokens == len(ids) - 1 and whole.cached_prompt_tokens == 0
    assert resumed.tokens == whole.tokens
