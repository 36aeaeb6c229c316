"""The figures panes: each engine's stats, the speed-up, the lossless check, the race replay."""

import json

from dflash_core.engine.events import CycleTally, Divergence, RunSummary

from .text import esc


def _stat(label: str, value: str, hint: str = "") -> str:
    return f'<div class="stat" title="{esc(hint)}"><div class="v">{esc(value)}</div><div class="k">{esc(label)}</div></div>'


def stats_html(tokens: int, elapsed_s: float, tps: float, extra: list = (), status: str = "") -> str:
    """A row of figures. `extra` is [(label, value, hint)]."""
    cells = [
        _stat("tok/s", f"{tps:.1f}" if tps else "–", "decode speed: tokens after the first / time after the first"),
        _stat("tokens", str(tokens)),
        _stat("elapsed", f"{elapsed_s:.2f} s", "prefill + decode"),
    ] + [_stat(*e) for e in extra]
    badge = f'<span class="status">{esc(status)}</span>' if status else ""
    return f'<div class="stats">{"".join(cells)}{badge}</div>'


PLAIN_STEPS_HINT = "cycles where the adaptive policy drafted nothing: the target decoded one token by itself"


def dflash_extra(tally: CycleTally = None, policy: str = None) -> list:
    """tokens/cycle and acceptance rate from a finished run's tally (dashes before); under the
    adaptive policy also its plain steps."""
    plain = policy == "adaptive"
    if tally is None or not tally.cycles:
        return [("tokens/cycle", "–", ""), ("accept rate", "–", "")] + ([("plain steps", "–", "")] if plain else [])
    tau, rate = tally.tokens_per_cycle, tally.acceptance_rate
    out = [
        ("tokens/cycle", f"{tau:.2f}", "mean tokens committed per cycle (tau, counts the staged token)"),
        ("accept rate", f"{100 * rate:.0f}%", "accepted draft tokens / draft tokens the target verified"),
    ]
    if plain or tally.plain_steps:
        out.append(("plain steps", f"{tally.plain_steps} of {tally.cycles}", PLAIN_STEPS_HINT))
    return out


def policy_summary(summary: RunSummary) -> str:
    """The run's policy in words, e.g. "adaptive policy: 12 plain steps of 40 cycles" ('' for
    runs that are not DFlash's)."""
    if summary is None or summary.engine != "dflash" or not summary.policy:
        return ""
    if summary.policy == "fixed":
        return f"fixed policy (min confidence {summary.min_confidence:g})"
    n = summary.plain_steps
    return f"adaptive policy: {n} plain step{'' if n == 1 else 's'} of {summary.cycles} cycles"


def speedup_html(baseline: RunSummary = None, dflash: RunSummary = None, recorded: dict = None) -> str:
    """This run's decode speedup, and beside it the headless benchmark's median for the pair on
    this kind of device when one is recorded (recorded: benchmark.recorded_figure)."""
    reference = ""
    if recorded:
        reference = (
            f'<div class="sub">headless benchmark of this pair on {esc(recorded["device"])}: '
            f"{recorded['speedup']:.2f}× median, {recorded['tokens_per_cycle']:.2f} tokens/cycle "
            f"({recorded['prompts']} prompts × {recorded['repeat']} repeats)</div>"
        )
    if baseline is None or dflash is None or not baseline.decode_tps or not dflash.decode_tps:
        return f'<div class="speedup empty"><div class="v">–</div><div class="k">speedup</div>{reference}</div>'
    x = dflash.decode_tps / baseline.decode_tps
    e2e = (baseline.prefill_s + baseline.decode_s) / max(dflash.prefill_s + dflash.decode_s, 1e-9)
    cls = "speedup up" if x >= 1 else "speedup down"
    return (
        f'<div class="{cls}"><div class="v">{x:.2f}×</div><div class="k">decode speedup</div>'
        f'<div class="sub">{dflash.decode_tps:.1f} vs {baseline.decode_tps:.1f} tok/s · '
        f"end to end {e2e:.2f}× · this run</div>{reference}</div>"
    )


def lossless_html(verdict: str, detail: str = "") -> str:
    """verdict: 'identical' | 'diverged' | 'partial' | 'pending' | 'sampled'."""
    icon = {"identical": "✓", "diverged": "≠", "partial": "…", "pending": "·", "sampled": "≈"}[verdict]
    title = {
        "identical": "identical: DFlash produced exactly the baseline's tokens",
        "sampled": "same distribution: both sampled from the target's own distribution",
        "diverged": "diverged from the baseline",
        "partial": "stopped early",
        "pending": "lossless check runs when both engines finish",
    }[verdict]
    sub = f'<div class="sub">{esc(detail)}</div>' if detail else ""
    return f'<div class="lossless {verdict}"><span class="icon">{icon}</span><div><div class="v">{esc(title)}</div>{sub}</div></div>'


def divergence_detail(d: Divergence, token_text) -> str:
    def show(tok):
        return "(ended)" if tok is None else f"{token_text(tok)!r} (id {tok})"

    margin = "" if d.top2_margin is None else f"; the target's top-2 logit margin there is {d.top2_margin:.4g}"
    hint = (
        " (a tiny margin means float noise between batched and one-token forwards)"
        if (d.top2_margin or 1) < 1e-2
        else ""
    )
    return f"first difference at generated token {d.index}: DFlash {show(d.dflash_token)} vs baseline {show(d.baseline_token)}{margin}{hint}"


def race_html(
    baseline_pieces: list, baseline_times: list, dflash_pieces: list, dflash_times: list, speed: float = 1.0
) -> str:
    """The race lanes plus the recorded timeline as JSON in a data attribute (escaped); the page's
    script (ui/assets.py RACE_JS) replays both on one clock. Times are seconds since each request
    started (prefill included) at which each token became visible."""
    data = {
        "baseline": {"pieces": baseline_pieces, "t": [round(t, 4) for t in baseline_times]},
        "dflash": {"pieces": dflash_pieces, "t": [round(t, 4) for t in dflash_times]},
        "speed": speed,
    }
    end = max(baseline_times[-1:] + dflash_times[-1:] or [0])

    def lane(name, key):
        return (
            f'<div class="lane"><div class="lane-head"><b>{name}</b>'
            f'<span class="lane-count" data-lane="{key}">0 tokens</span></div>'
            f'<div class="bar"><div class="fill" data-lane="{key}"></div></div>'
            f'<pre class="lane-text" data-lane="{key}"></pre></div>'
        )

    return (
        f'<div class="race" data-timeline="{esc(json.dumps(data))}">'
        f'<div class="race-head" title="one clock from each request\'s start, prefill included">'
        f'<span class="clock">0.00 s</span> of {end:.2f} s'
        f"{' · replay at ' + format(speed, 'g') + '× speed' if speed != 1 else ' · real time'}</div>"
        f"{lane('Baseline', 'baseline')}{lane('DFlash', 'dflash')}</div>"
    )
