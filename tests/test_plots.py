"""Benchmark pictures: the figure shows the numbers of the results it is given."""

import pytest

import dflash_core  # noqa: F401  (system BLAS before MLX)
from dflash_core.benchmark import run_benchmark
from dflash_core.errors import DFlashError
from dflash_core.plots import benchmark_figure, save_benchmark_figure


@pytest.fixture(scope="module")
def results(random_pairs):
    return run_benchmark(
        random_pairs["qwen3"], ["def fib(n):"], max_tokens=24, repeat=1, oracle=True, sweep=[4, 16], log=lambda *a: None
    )


def test_figure_shows_the_results(results):
    fig = benchmark_figure(results)
    titles = [a.text for a in fig.layout.annotations]
    assert titles == ["decode speed by engine (tok/s)", "speedup vs block size", "acceptance by block position"]
    bars = {t.name: t.y[0] for t in fig.data if t.type == "bar" and t.name in ("baseline", "dflash", "oracle")}
    runs = results["runs"]
    for engine in ("baseline", "dflash", "oracle"):
        expected = [r["decode_tps"] for r in runs if r["engine"] == engine and r["block_size"] == 16]
        assert bars[engine] == pytest.approx(expected[0])
    speedup = next(t for t in fig.data if t.name == "speedup")
    assert list(speedup.x) == [4, 16]
    assert list(speedup.y) == [s["speedup_median"] for s in results["summary"]["sweep"]]
    accepted = next(t for t in fig.data if t.name == "accepted")
    assert list(accepted.y) == results["summary"]["acceptance_by_position"]
    s = results["summary"]
    assert f"{s['overall_speedup_median']:.2f}x overall" in fig.layout.title.text
    assert f"{s['tokens_per_cycle_mean']:.2f} tokens/cycle (mean)" in fig.layout.title.text


def test_figure_without_sweep_has_two_panels(results):
    no_sweep = {**results, "summary": {k: v for k, v in results["summary"].items() if k != "sweep"}}
    assert len(benchmark_figure(no_sweep).layout.annotations) == 2


def test_saving(results, tmp_path):
    html = save_benchmark_figure(results, tmp_path / "bench.html")
    text = html.read_text()
    assert "plotly" in text and "speedup vs block size" in text
    with pytest.raises(DFlashError, match=r"\.html"):
        save_benchmark_figure(results, tmp_path / "bench.svgz")
