"""Plotly figures over the engine's events. Built per batch of cycles or at the end of a run,
never per token (rebuilding a figure per token slows a stream threefold)."""

from collections import Counter

import plotly.graph_objects as go

from dflash_core.engine.events import CycleTally, RunSummary

BASELINE_COLOR = "#8b93a7"
TARGET_COLOR = "#6366f1"
ACCEPT_COLOR = "#10b981"
ROLLBACK_COLOR = "#f59e0b"
PLAIN_COLOR = "#9ca3af"  # plain steps of the adaptive policy


def _layout(fig: go.Figure, title: str, x: str, y: str) -> go.Figure:
    # transparent backgrounds and a mid-grey font read well in both light and dark themes
    fig.update_layout(
        template="none",  # colors are set here; the default template would add ~8 KB per figure
        title=dict(text=title, x=0.02, font=dict(size=14)),
        xaxis_title=x,
        yaxis_title=y,
        margin=dict(l=50, r=16, t=44, b=44),
        height=280,
        paper_bgcolor="rgba(0,0,0,0)",
        plot_bgcolor="rgba(0,0,0,0)",
        font=dict(color="#8a8f98", size=12),
        legend=dict(orientation="h", y=1.02, x=1, xanchor="right", yanchor="bottom"),
        bargap=0.15,
    )
    grid = dict(gridcolor="rgba(128,128,128,0.2)", zerolinecolor="rgba(128,128,128,0.3)")
    fig.update_xaxes(**grid)
    fig.update_yaxes(**grid)
    return fig


def accepted_length_chart(cycles: list) -> go.Figure:
    fig = go.Figure()
    if cycles:
        B = cycles[0].block_size
        fig.add_bar(
            x=[c.cycle for c in cycles],
            y=[c.accepted_len for c in cycles],
            marker_color=[
                PLAIN_COLOR if c.plain_step else ACCEPT_COLOR if c.is_bonus and c.verified else TARGET_COLOR
                for c in cycles
            ],
            hovertemplate="cycle %{x}<br>accepted %{y}<extra></extra>",
            name="accepted",
        )
        fig.update_yaxes(range=[0, B - 0.5])
    return _layout(fig, "Accepted draft tokens per cycle", "cycle", "accepted length")


def acceptance_by_position_chart(tally: CycleTally) -> go.Figure:
    """Fraction of drafted cycles whose draft token at block position k was accepted (k = 1..B-1)."""
    fig = go.Figure()
    rates = tally.acceptance_by_position
    if rates:
        fig.add_bar(
            x=list(range(1, len(rates) + 1)),
            y=rates,
            marker_color=ACCEPT_COLOR,
            hovertemplate="position %{x}<br>%{y:.0%} of drafted cycles<extra></extra>",
        )
        fig.update_yaxes(range=[0, 1], tickformat=".0%")
        fig.update_xaxes(dtick=1)
    return _layout(fig, "Acceptance rate by block position", "block position", "cycles accepted")


def tokens_vs_time_chart(
    baseline: list = (), cycles: list = (), baseline_prefill: float = 0.0, dflash_prefill: float = 0.0
) -> go.Figure:
    """Tokens emitted against seconds since the request started (prefill included), both engines."""
    fig = go.Figure()
    if baseline:
        fig.add_scatter(
            x=[baseline_prefill + e.t for e in baseline],
            y=[e.index + 1 for e in baseline],
            mode="lines",
            name="baseline",
            line=dict(color=BASELINE_COLOR, width=2),
            hovertemplate="%{x:.3f} s<br>%{y} tokens<extra>baseline</extra>",
        )
    if cycles:
        xs, ys, n = [], [], 0
        for c in cycles:
            n += len(c.committed)
            xs.append(dflash_prefill + c.t)
            ys.append(n)
        fig.add_scatter(
            x=xs,
            y=ys,
            mode="lines+markers",
            line_shape="hv",
            name="DFlash",
            line=dict(color=TARGET_COLOR, width=2),
            marker=dict(size=4),
            hovertemplate="%{x:.3f} s<br>%{y} tokens<extra>DFlash</extra>",
        )
    return _layout(fig, "Tokens over time", "seconds since request", "tokens")


def time_split_chart(cycles: list) -> go.Figure:
    fig = go.Figure()
    if cycles:
        x = [c.cycle for c in cycles]
        for name, key, color in (
            ("draft", "draft_ms", ACCEPT_COLOR),
            ("verify", "verify_ms", TARGET_COLOR),
            ("rollback", "rollback_ms", ROLLBACK_COLOR),
        ):
            fig.add_bar(
                x=x,
                y=[getattr(c, key) for c in cycles],
                name=name,
                marker_color=color,
                hovertemplate=f"cycle %{{x}}<br>{name} %{{y:.1f}} ms<extra></extra>",
            )
        fig.update_layout(barmode="stack")
    return _layout(fig, "Time per cycle: draft / verify / rollback", "cycle", "ms")


def tokens_per_cycle_histogram(cycles: list) -> go.Figure:
    fig = go.Figure()
    if cycles:
        B = cycles[0].block_size
        counts = Counter(len(c.committed) for c in cycles)
        fig.add_bar(
            x=list(range(1, B + 1)),
            y=[counts.get(n, 0) for n in range(1, B + 1)],
            marker_color=TARGET_COLOR,
            hovertemplate="%{x} tokens: %{y} cycles<extra></extra>",
        )
        fig.update_xaxes(dtick=1)
    return _layout(fig, "Tokens committed per cycle", "tokens in the cycle", "cycles")


def policy_chart(cycles: list) -> go.Figure:
    """The policy's decisions per cycle: the proposals it verified (bars, left axis; plain steps
    marked at 0) and the cycle's cost in plain one-token steps, predicted when it decided and
    measured after (lines, right axis). Cycles without a decision have no cost points."""
    fig = go.Figure()
    if not cycles:
        return _layout(fig, "Policy: verified rows and cost per cycle", "cycle", "proposals verified")
    B = cycles[0].block_size
    fig.add_bar(
        x=[c.cycle for c in cycles],
        y=[c.verified for c in cycles],
        marker_color=[PLAIN_COLOR if c.plain_step else TARGET_COLOR for c in cycles],
        name="verified",
        hovertemplate="cycle %{x}<br>verified %{y}<extra></extra>",
    )
    plain = [c for c in cycles if c.plain_step]
    if plain:
        fig.add_scatter(
            x=[c.cycle for c in plain],
            y=[0] * len(plain),
            mode="markers",
            name="plain step",
            marker=dict(color=PLAIN_COLOR, symbol="x-thin-open", size=8, line=dict(width=2)),
            hovertemplate="cycle %{x}: plain step (no draft)<extra></extra>",
        )
    decided = [c for c in cycles if c.decision is not None]
    for name, steps, dash, color in (
        ("predicted cost", lambda c: c.decision.predicted_steps, "dot", ROLLBACK_COLOR),
        ("measured cost", lambda c: c.measured_steps, "solid", ACCEPT_COLOR),
    ):
        fig.add_scatter(
            x=[c.cycle for c in decided],
            y=[steps(c) for c in decided],
            mode="lines",
            name=name,
            yaxis="y2",
            line=dict(color=color, width=1.5, dash=dash),
            hovertemplate=f"cycle %{{x}}<br>{name} %{{y:.2f}} steps<extra></extra>",
        )
    fig.update_yaxes(range=[0, B - 0.5])
    fig = _layout(fig, "Policy: verified rows and cost per cycle", "cycle", "proposals verified")
    fig.update_layout(
        yaxis2=dict(
            title="cost (one-token steps)",
            overlaying="y",
            side="right",
            rangemode="tozero",
            gridcolor="rgba(0,0,0,0)",
            zerolinecolor="rgba(128,128,128,0.3)",
        ),
        margin=dict(r=50, b=84),
        height=300,  # the legend goes below: four entries would cover the title
        legend=dict(orientation="h", x=0, xanchor="left", y=-0.3, yanchor="top"),
    )
    return fig


def all_charts(baseline_events: list, baseline_summary: RunSummary, cycles: list, dflash_summary: RunSummary) -> list:
    """The six figures in display order."""
    return [
        tokens_vs_time_chart(
            baseline_events,
            cycles,
            baseline_summary.prefill_s if baseline_summary else 0.0,
            dflash_summary.prefill_s if dflash_summary else 0.0,
        ),
        accepted_length_chart(cycles),
        acceptance_by_position_chart(dflash_summary.tally if dflash_summary else CycleTally.of(cycles)),
        time_split_chart(cycles),
        tokens_per_cycle_histogram(cycles),
        policy_chart(cycles),
    ]
