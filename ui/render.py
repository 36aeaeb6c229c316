"""HTML for the playground's panes, from the engine's events. Pure functions: no Gradio, no MLX.

gr.HTML sets innerHTML unsanitised, so every piece of model or user text goes through `esc`
(html.escape with quotes) before it is placed in markup or in an attribute.
"""

import html
import json

from dflash_core.events import CycleEvent, CycleTally, Divergence, RunSummary

REPLACEMENT = "\ufffd"


def esc(text) -> str:
    return html.escape(str(text), quote=True)


class Pieces:
    """Incremental per-token text: `add(ids)` returns the text each new token adds, so that the
    pieces join to decode(all ids). A token that ends inside a multi-byte character adds "" and
    the token completing it adds the whole character. Each token is decoded after the previous
    one and the previous one's text is cut off, because SentencePiece-style decoders drop a
    word-initial space at the start of a decode."""

    def __init__(self, decode):
        self.decode = decode
        self.pending = []  # tokens whose bytes do not yet form whole characters
        self.previous = []  # the last complete token, as left context

    def add(self, ids: list) -> list:
        out = []
        for tok in ids:
            self.pending.append(tok)
            text = self.decode(self.previous + self.pending)
            if text.endswith(REPLACEMENT) and len(self.pending) < 4:
                out.append("")  # incomplete UTF-8 (at most 4 bytes): wait for the next token
                continue
            head = self.decode(self.previous) if self.previous else ""
            out.append(text[len(head) :] if text.startswith(head) else self.decode(self.pending))
            self.previous, self.pending = self.pending[-1:], []
        return out


def show_text(text: str, inline: bool = False) -> str:
    """Escaped text with whitespace made visible: a newline shows a faint return mark (and breaks
    the line unless `inline`), a tab an arrow. Spaces stay spaces in running text (the panes use
    pre-wrap); `inline` text (a rejected draft, a table cell) shows them as ␣."""
    out = []
    for ch in text:
        if ch == " " and inline:
            out.append('<span class="ws">␣</span>')
        elif ch == "\n":
            out.append('<span class="ws">↵</span>' + ("" if inline else "\n"))
        elif ch == "\t":
            out.append('<span class="ws">⇥</span>' + ("" if inline else "\t"))
        elif ch == "\r":
            continue
        else:
            out.append(esc(ch))
    return "".join(out)


def _token_span(text: str, cls: str, tip: str, inline: bool = False) -> str:
    shown = show_text(text, inline) if text else '<span class="ws">∅</span>'
    if text and not text.strip():
        cls += " tok-blank"  # whitespace-only token: the background shows where it is
    return f'<span class="tok {cls}" title="{esc(tip)}">{shown}</span>'


def cycle_spans(ev: CycleEvent, pieces: list, draft_text, max_rejected=None) -> str:
    """One cycle: the staged (target-chosen) token, the accepted drafts, then the rejected drafts
    struck through (and those the target did not verify, under a confidence threshold). `pieces`
    are the texts of `ev.committed`; `draft_text(id)` decodes one proposal on its own. At most
    `max_rejected` rejected drafts are shown (None = all)."""
    a, v = ev.accepted_len, ev.verified
    head = f"cycle {ev.cycle}"
    tail = f"accepted {a}/{v}" + (" (all: bonus token next)" if ev.is_bonus else "")
    if v < len(ev.drafted):
        tail += f" · {len(ev.drafted) - v} unsure proposals not verified"
    out = []
    for k, text in enumerate(pieces):
        if k == 0:
            tip = f"{head} · block position 0 · staged token (target's own choice) · {tail}"
            out.append(_token_span(text, "tok-target", tip))
        else:
            tip = f"{head} · block position {k} · accepted draft token{_draw_tip(ev, k - 1)} · {tail}"
            out.append(_token_span(text, "tok-accepted", tip))
    if len(pieces) == a + 1:  # not cut short by EOS / max tokens
        rejected = ev.drafted[a:]
        shown = rejected if max_rejected is None else rejected[:max_rejected]
        for j, tok in enumerate(shown):
            k = a + 1 + j
            if k > v:
                kind, why = "unverified", "not verified: the draft was unsure"
            else:
                kind = "rejected"
                if j > 0:
                    why = "after the rejection point"
                elif ev.draws:
                    why = (
                        f"{_draw_tip(ev, a).lstrip(' ·')}; resampled {draft_text(ev.next_staged)!r} from max(0, p - q)"
                    )
                else:
                    why = f"target wanted {draft_text(ev.posterior[a])!r}"
            tip = f"{head} · block position {k} · {kind} draft token ({why}) · {tail}"
            out.append(_token_span(draft_text(tok), f"tok-{kind}", tip, inline=True))
        if len(shown) < len(rejected):
            more = len(rejected) - len(shown)
            out.append(
                f'<span class="tok-more" title="{more} more draft tokens of cycle {ev.cycle} not committed (rejected or unverified)">+{more}</span>'
            )
    cls = "cycle cycle-bonus" if ev.is_bonus else "cycle"
    return f'<span class="{cls}" data-cycle="{ev.cycle}">{"".join(out)}</span>'


def _draw_tip(ev: CycleEvent, k: int) -> str:
    """Sampling: why proposal k was kept or not (p, q, their ratio, the uniform draw)."""
    if not ev.draws or k >= len(ev.draws.u):
        return ""
    p, q, u = ev.draws.p[k], ev.draws.q[k], ev.draws.u[k]
    return f" · p={p:.3f} q={q:.3f} p/q={p / q if q else float('inf'):.2f} draw u={u:.3f}"


def dflash_tokens_html(cycles: list, pieces: list, draft_text, max_rejected=None) -> str:
    """The DFlash output grouped by cycle. `pieces` are the texts of all committed tokens in order."""
    if not cycles:
        return '<div class="out empty">DFlash output appears here, colored by cycle.</div>'
    parts, i = [], 0
    for ev in cycles:
        n = len(ev.committed)
        parts.append(cycle_spans(ev, pieces[i : i + n], draft_text, max_rejected))
        i += n
    return f'<div class="out tokens">{"".join(parts)}</div>'


LEGEND = (
    '<div class="legend"><div>'
    '<span class="tok tok-target">staged</span> the target\'s own token, one per cycle'
    '<span class="tok tok-accepted">accepted</span> draft tokens the target agreed with'
    '<span class="tok tok-rejected">rejected</span> draft tokens after the first disagreement</div>'
    '<div class="muted"><span class="ws">↵</span> newline · <span class="ws">␣</span> space in a draft · '
    "a thin bar ends each cycle · hover a token for its cycle, block position and accepted length</div>"
    "</div>"
)


def plain_text_html(text: str, placeholder="") -> str:
    if not text:
        return f'<div class="out empty">{esc(placeholder)}</div>'
    return f'<div class="out">{show_text(text)}</div>'


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


def dflash_extra(tally: CycleTally = None) -> list:
    """tokens/cycle and acceptance rate from a finished run's tally (dashes before)."""
    if tally is None or not tally.cycles:
        return [("tokens/cycle", "–", ""), ("accept rate", "–", "")]
    tau, rate = tally.tokens_per_cycle, tally.acceptance_rate
    return [
        ("tokens/cycle", f"{tau:.2f}", "mean tokens committed per cycle (tau, counts the staged token)"),
        ("accept rate", f"{100 * rate:.0f}%", "accepted draft tokens / draft tokens the target verified"),
    ]


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


def error_html(message: str) -> str:
    return f'<div class="error-panel"><b>Something went wrong</b><div>{esc(message)}</div></div>'


def info_html(message: str) -> str:
    return f'<div class="info-panel">{esc(message)}</div>'


def warning_html(message: str) -> str:
    return f'<div class="warning-panel"><b>Warning:</b> {esc(message)}</div>'


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


def inspector_html(ev: CycleEvent, token_text, mask_text: str = "MASK", hybrid: bool = False) -> str:
    """One cycle laid out as a table over block positions 0..B-1, then what was committed and
    rolled back. `token_text(id)` decodes one token."""
    B, a, v = ev.block_size, ev.accepted_len, ev.verified

    def cell(tok, cls=""):
        return f'<td class="{cls}"><code>{show_text(token_text(tok), inline=True) or "&nbsp;"}</code></td>'

    head = "".join(f"<th>{k}</th>" for k in range(B))
    block = cell(ev.staged_token, "staged") + "".join(
        f'<td class="mask"><code>{esc(mask_text)}</code></td>' for _ in range(B - 1)
    )
    drafted = "<td></td>" + "".join(
        cell(t, "acc" if k < a else ("rej" if k < v else "unverified")) for k, t in enumerate(ev.drafted)
    )
    # posterior[k-1] is the target's choice for block position k (computed at position k-1);
    # positions past the verified ones were not sent to the target
    unchecked = '<td class="unverified">–</td>' * (B - 1 - v)
    wanted = (
        "<td></td>"
        + "".join(cell(ev.posterior[k], "acc" if k < a else ("fix" if k == a else "")) for k in range(v))
        + unchecked
    )
    rows = [("block into the draft", block), ("draft proposes", drafted)]
    rows += _sampling_rows(ev, unchecked) if ev.draws else _greedy_rows(ev, wanted, unchecked)
    table = "".join(f"<tr><th class='rowh'>{esc(n)}</th>{r}</tr>" for n, r in rows)
    nxt = token_text(ev.next_staged)
    kind = "bonus" if ev.is_bonus else "correction"
    committed = "".join(
        f'<span class="tok {"tok-target" if i == 0 else "tok-accepted"}">{show_text(token_text(t), inline=True)}</span>'
        for i, t in enumerate(ev.committed)
    )
    rollback = f"{ev.kv_trimmed} KV-cache entr{'y' if ev.kv_trimmed == 1 else 'ies'} trimmed per attention layer"
    if hybrid:
        rollback += (
            f"; {ev.gdn_replayed} GatedDeltaNet step{'' if ev.gdn_replayed == 1 else 's'} replayed per linear layer"
        )
    facts = (
        f"<div class='facts'>"
        f"<div><span class='k'>accepted length</span> <b>{a}</b> of {v} verified"
        f"{f' ({B - 1 - v} unsure proposals not verified)' if v < B - 1 else ''}</div>"
        f"<div><span class='k'>committed</span> {committed} <span class='muted'>({len(ev.committed)} tokens)</span></div>"
        f"<div><span class='k'>next staged ({kind})</span> <span class='tok tok-target'>{show_text(nxt, inline=True)}</span></div>"
        f"<div><span class='k'>rollback</span> {esc(rollback)}</div>"
        f"<div><span class='k'>time</span> draft {ev.draft_ms:.1f} ms · verify {ev.verify_ms:.1f} ms · "
        f"rollback {ev.rollback_ms:.1f} ms · committed at {ev.t:.3f} s</div></div>"
    )
    return (
        f"<div class='inspector'><div class='insp-title'>Cycle {ev.cycle}</div>"
        f"<div class='table-wrap'><table><tr><th class='rowh'>block position</th>{head}</tr>{table}</table></div>"
        f"{facts}<div class='explain'>{explain(ev, token_text)}</div></div>"
    )


def _greedy_rows(ev: CycleEvent, wanted: str, unchecked: str) -> list:
    match, cum, run = ["<td></td>"], ["<td></td>"], 1
    for k in range(ev.verified):
        m = int(ev.drafted[k] == ev.posterior[k])
        run *= m
        match.append(f'<td class="{"yes" if m else "no"}">{"✓" if m else "✗"}</td>')
        cum.append(f'<td class="{"yes" if run else "no"}">{run}</td>')
    return [
        ("target's choice", wanted),
        ("match", "".join(match + [unchecked])),
        ("cumulative product", "".join(cum + [unchecked])),
    ]


def _sampling_rows(ev: CycleEvent, unchecked: str) -> list:
    """Speculative sampling: per examined proposal the target's and the draft's probability of
    it, their ratio (the chance to keep it), the uniform draw, and the outcome."""
    d, n = ev.draws, len(ev.draws.u)
    rest = '<td class="muted">·</td>' * (ev.verified - n) + unchecked  # not examined after the rejection

    def row(values):
        return "<td></td>" + "".join(values) + rest

    kept = [k < ev.accepted_len for k in range(n)]
    return [
        ("target p(d)", row(f"<td>{p:.3f}</td>" for p in d.p)),
        ("draft q(d)", row(f"<td>{q:.3f}</td>" for q in d.q)),
        ("keep chance min(1, p/q)", row(f"<td>{min(1.0, p / q) if q else 1.0:.2f}</td>" for p, q in zip(d.p, d.q))),
        ("draw u", row(f"<td>{u:.3f}</td>" for u in d.u)),
        ("kept (u < p/q)", row(f'<td class="{"yes" if k else "no"}">{"✓" if k else "✗"}</td>' for k in kept)),
    ]


def explain(ev: CycleEvent, token_text) -> str:
    """The cycle in plain words (escaped HTML)."""
    B, a, v = ev.block_size, ev.accepted_len, ev.verified

    def q(tok):
        return f"<code>{show_text(token_text(tok), inline=True)}</code>"

    read = (
        f"The target then read the {B} tokens in one forward pass and"
        if v == B - 1
        else f"The draft was sure of only the first {v} (each at least the confidence threshold; "
        f"the first always goes), so the target read {v + 1} tokens, not {B}: on a CPU every "
        "verified position costs time, and unsure guesses are rarely accepted. It"
    )
    if ev.draws:
        return _explain_sampled(ev, q, read)
    s = [
        f"The target had already chosen {q(ev.staged_token)} (the staged token). "
        f"The draft saw it followed by {B - 1} MASK slots and filled all {B - 1} in one forward pass.",
        f"{read} said, at every position, which token it would pick itself.",
    ]
    if ev.is_bonus:
        s.append(
            f"It agreed with every {'verified ' if v < B - 1 else ''}guess, so all {a} were kept, and its pick after the last one, "
            f"{q(ev.next_staged)}, comes free: a bonus token, staged for the next cycle."
        )
    elif a == 0:
        s.append(
            f"It disagreed at the first guess (the draft said {q(ev.drafted[0])}, the target wanted "
            f"{q(ev.posterior[0])}), so only the staged token was committed; the target's pick "
            "becomes the next staged token (a correction)."
        )
    else:
        guesses = "guess" if a == 1 else f"{a} guesses"
        s.append(
            f"It agreed with the first {guesses} and disagreed at position {a + 1} (the draft said "
            f"{q(ev.drafted[a])}, the target wanted {q(ev.posterior[a])}). Everything after a "
            f"disagreement is thrown away, even if later guesses happen to match. {a + 1} tokens were "
            "committed and the target's pick is the next staged token (a correction)."
        )
    s.append(
        "Every committed token is the target's own greedy choice, which is why the output is "
        "identical to plain decoding. The caches are rolled back to hold exactly the committed tokens."
    )
    return "<p>" + "</p><p>".join(s) + "</p>"


def _explain_sampled(ev: CycleEvent, q, read: str) -> str:
    B, a, v = ev.block_size, ev.accepted_len, ev.verified
    s = [
        f"The target had already drawn {q(ev.staged_token)} (the staged token). The draft saw it followed by "
        f"{B - 1} MASK slots and, in one forward pass, gave a distribution q for every slot and drew one "
        "proposal d from each.",
        f"{read} gave its own distribution p at every position. Going left to right, each proposal is "
        "kept with probability min(1, p(d) / q(d)): a uniform draw u keeps it when u < p(d) / q(d).",
    ]
    if ev.is_bonus:
        s.append(
            f"All {a} {'verified ' if v < B - 1 else ''}proposals were kept, so the next token, {q(ev.next_staged)}, "
            "was drawn from the target's p after the last one: a bonus token, staged for the next cycle."
        )
    else:
        d = ev.draws
        s.append(
            f"Proposal {a + 1}, {q(ev.drafted[a])}, had p = {d.p[a]:.3f} against q = {d.q[a]:.3f} and the draw "
            f"u = {d.u[a]:.3f} was too high, so it and everything after it were dropped. The replacement "
            f"{q(ev.next_staged)} was drawn from max(0, p - q), normalized: the mass the target has and the "
            "draft did not give, which is exactly what keeps the output distributed as the target's."
        )
    s.append(
        "So every token follows the target's own sampling distribution (the same as plain sampling), "
        "though not the same tokens as a plain run with the same seed. The caches are rolled back to "
        "hold exactly the committed tokens."
    )
    return "<p>" + "</p><p>".join(s) + "</p>"
