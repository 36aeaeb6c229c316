"""Benchmark results (benchmark.run_benchmark's dict) as one plotly figure: decode speed by
engine, speedup against block size when a sweep was run, and acceptance by block position."""

import statistics
from pathlib import Path

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .errors import DFlashError

COLORS = {"baseline": "#7f7f7f", "dflash": "#1f77b4", "oracle": "#2ca02c"}


def _title(results: dict) -> str:
    cfg = results["config"]
    m = cfg.get("machine", {})
    where = ", ".join(str(x) for x in (m.get("device"), f"MLX {m['mlx']}" if m.get("mlx") else None) if x)
    return (
        f"{cfg['model']}: {cfg['max_tokens']} new tokens, median of {cfg['repeat']} x "
        f"{len(cfg['prompts'])} prompts" + (f" ({where})" if where else "")
    )


def benchmark_figure(results: dict) -> go.Figure:
    cfg, runs, summary = results["config"], results["runs"], results["summary"]
    block = cfg["block_size"]
    sweep = summary.get("sweep")
    panels = ["decode speed by engine (tok/s)", "acceptance by block position"]
    if sweep:
        panels.insert(1, "speedup vs block size")
    fig = make_subplots(rows=1, cols=len(panels), subplot_titles=panels)

    # 1. tok/s by engine at the main block size: the median as a bar, every run as a dot
    engines = [e for e in ("baseline", "dflash", "oracle") if any(r["engine"] == e for r in runs)]
    for e in engines:
        tps = [r["decode_tps"] for r in runs if r["engine"] == e and r["block_size"] == block]
        label = e if e == "baseline" else f"{e} (B={block})"
        fig.add_bar(
            x=[label],
            y=[statistics.median(tps)],
            marker_color=COLORS[e],
            name=e,
            row=1,
            col=1,
            text=[f"{statistics.median(tps):.1f}"],
            textposition="outside",
            showlegend=False,
        )
        fig.add_scatter(
            x=[label] * len(tps),
            y=tps,
            mode="markers",
            marker=dict(color="black", size=5),
            name=f"{e} runs",
            showlegend=False,
            row=1,
            col=1,
        )
    fig.update_yaxes(title_text="tokens / s", rangemode="tozero", row=1, col=1)

    # 2. speedup and tokens per cycle against block size
    if sweep:
        sizes = [s["block_size"] for s in sweep]
        fig.add_scatter(
            x=sizes,
            y=[s["speedup_median"] for s in sweep],
            mode="lines+markers",
            name="speedup",
            marker_color=COLORS["dflash"],
            row=1,
            col=2,
        )
        fig.add_scatter(
            x=sizes,
            y=[s["tokens_per_cycle_median"] for s in sweep],
            mode="lines+markers",
            name="tokens / cycle",
            line=dict(dash="dot"),
            marker_color="#ff7f0e",
            row=1,
            col=2,
        )
        fig.add_hline(y=1, line=dict(color="gray", width=1, dash="dash"), row=1, col=2)
        fig.update_xaxes(title_text="block size", tickvals=sizes, row=1, col=2)
        fig.update_yaxes(title_text="x baseline / tokens per cycle", rangemode="tozero", row=1, col=2)

    # 3. fraction of cycles whose draft was accepted at position k (k = 1 is the first proposal)
    by_pos = summary.get("acceptance_by_position") or []
    col = len(panels)
    fig.add_bar(
        x=list(range(1, len(by_pos) + 1)),
        y=by_pos,
        marker_color=COLORS["dflash"],
        name="accepted",
        showlegend=False,
        row=1,
        col=col,
    )
    fig.update_xaxes(title_text="block position k", row=1, col=col)
    fig.update_yaxes(title_text="fraction of cycles", range=[0, 1], row=1, col=col)

    verdict = "identical to greedy" if summary.get("identical") else "OUTPUT DIFFERS FROM GREEDY"
    facts = [f"speedup {summary.get('speedup_median') or 0:.2f}x median"]
    if summary.get("overall_speedup_median"):  # results saved before these figures existed lack them
        facts.append(f"{summary['overall_speedup_median']:.2f}x overall")
    if summary.get("tokens_per_cycle_mean"):
        facts.append(f"{summary['tokens_per_cycle_mean']:.2f} tokens/cycle (mean)")
    facts += [f"acceptance rate {summary.get('acceptance_rate_median') or 0:.1%}", verdict]
    fig.update_layout(
        title=dict(text=f"{_title(results)}<br><sup>{', '.join(facts)}</sup>"),
        template="plotly_white",
        height=460,
        width=420 * len(panels),
        margin=dict(t=110),
        legend=dict(orientation="h", y=-0.2),
    )
    return fig


def save_benchmark_figure(results: dict, path: str) -> Path:
    """Write the figure as self-contained HTML (plotly.js inside: opens offline), or as PNG when
    kaleido is installed."""
    path = Path(path)
    fig = benchmark_figure(results)
    if path.suffix.lower() == ".png":
        try:
            import kaleido  # noqa: F401
        except ImportError:
            raise DFlashError(
                f"writing '{path}' needs kaleido (and a Chrome it can drive); write an .html file instead"
            ) from None
        fig.write_image(str(path))
    elif path.suffix.lower() in (".html", ".htm"):
        fig.write_html(str(path), include_plotlyjs=True)
    else:
        raise DFlashError(f"cannot tell the format of '{path}': use .html (or .png with kaleido installed)")
    return path
