"""HTML for the playground's panes, from the engine's events. Pure functions: no Gradio, no MLX.

gr.HTML sets innerHTML unsanitised, so every piece of model or user text goes through `esc`
(html.escape with quotes) before it is placed in markup or in an attribute.
"""

import html
import json

from dflash_core.engine.events import CycleEvent, CycleTally, Divergence, RunSummary

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
    if ev.plain_step:
        return _plain_step_spans(ev, pieces)
    a, v = ev.accepted_len, ev.verified
    bonus = _bonus(ev)
    head = f"cycle {ev.cycle}"
    tail = f"accepted {a}/{v}" + (" (all: bonus token next)" if bonus else "")
    # proposals copied from the context rather than drafted: their own colour and words
    copied, kind_of = (" tok-copied", "copied") if ev.source == "copy" else ("", "draft")
    if copied:
        tail += f" · {_copy_words(ev)}"
    if v < len(ev.drafted):
        # fewer than the policy chose: the run's token budget ends inside this block
        why = "proposals past the token budget" if ev.decision and v < ev.decision.verified else "unsure proposals"
        tail += f" · {len(ev.drafted) - v} {why} not verified"
    out = []
    for k, text in enumerate(pieces):
        if k == 0:
            tip = f"{head} · block position 0 · staged token (target's own choice) · {tail}"
            out.append(_token_span(text, "tok-target", tip))
        else:
            tip = f"{head} · block position {k} · accepted {kind_of} token{_draw_tip(ev, k - 1)} · {tail}"
            out.append(_token_span(text, "tok-accepted" + copied, tip))
    if len(pieces) == a + 1:  # not cut short by EOS / max tokens
        rejected = ev.drafted[a:]
        shown = rejected if max_rejected is None else rejected[:max_rejected]
        for j, tok in enumerate(shown):
            k = a + 1 + j
            if k > v:
                kind = "unverified"
                if ev.decision and v < ev.decision.verified:
                    why = "not verified: past the run's token budget"
                else:
                    why = f"not verified: {_reason(ev)}" if _reason(ev) else "not verified: the draft was unsure"
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
            tip = f"{head} · block position {k} · {kind} {kind_of} token ({why}) · {tail}"
            out.append(_token_span(draft_text(tok), f"tok-{kind}{copied}", tip, inline=True))
        if len(shown) < len(rejected):
            more = len(rejected) - len(shown)
            out.append(
                f'<span class="tok-more" title="{more} more draft tokens of cycle {ev.cycle} not committed (rejected or unverified)">+{more}</span>'
            )
    cls = "cycle cycle-bonus" if bonus else "cycle"
    return f'<span class="{cls}" data-cycle="{ev.cycle}">{"".join(out)}</span>'


def _copy_words(ev: CycleEvent) -> str:
    """Where a copied cycle's proposals came from."""
    return (
        f"copied from context position {ev.copied_from} (prompt + output), where the last "
        f"{ev.copy_match} tokens occurred before"
    )


def _bonus(ev: CycleEvent) -> bool:
    """All verified proposals accepted, and there was at least one (a drafted cycle that verified
    none has nothing to be a bonus after)."""
    return ev.is_bonus and ev.verified > 0


def _reason(ev: CycleEvent) -> str:
    """The policy's one line for the cycle ('' for events without a decision)."""
    return ev.decision.reason if ev.decision is not None else ""


PLAIN_STEP_WORDS = "no draft forward; the target checked only the staged token: one plain decoding step"


def _plain_step_why(ev: CycleEvent) -> str:
    """ "plain step: <the policy's reason>" (its reason mostly says "plain step: " already)."""
    reason = _reason(ev) or "the policy decoded plainly"
    return reason if reason.startswith("plain step") else f"plain step: {reason}"


def _plain_step_spans(ev: CycleEvent, pieces: list) -> str:
    """A plain step: its one committed token (the staged one), muted and outlined, its tooltip
    the policy's reason."""
    why = _plain_step_why(ev)
    tip = f"cycle {ev.cycle} · {why} · {PLAIN_STEP_WORDS}"
    spans = "".join(_token_span(text, "tok-target tok-plain", tip) for text in pieces)
    return f'<span class="cycle plain-step" data-cycle="{ev.cycle}" title="{esc(why)}">{spans}</span>'


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
    '<span class="tok tok-rejected">rejected</span> draft tokens after the first disagreement'
    '<span class="tok tok-accepted tok-copied">copied</span> proposals copied from the context (--copy)'
    '<span class="cycle plain-step"><span class="tok tok-target tok-plain">plain step</span></span> '
    "the policy skipped the draft: the target decoded one token by itself</div>"
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


def inspector_html(
    ev: CycleEvent, token_text, mask_text: str = "MASK", hybrid: bool = False, policy: str = None
) -> str:
    """One cycle laid out as a table over block positions 0..B-1, then what was committed and
    rolled back, and the policy's decision. `token_text(id)` decodes one token; `policy` is the
    run's ("adaptive" | "fixed"; None: fixed, as runs before the adaptive policy)."""
    if ev.plain_step:
        return _plain_step_inspector(ev, token_text, hybrid)
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
    copied = ev.source == "copy"
    rows = [("block into the draft", block), ("copied from the context" if copied else "draft proposes", drafted)]
    if ev.confidence:
        label = "copies accepted (rate)" if copied else "draft confidence"
        rows.append((label, "<td></td>" + "".join(f"<td>{c:.2f}</td>" for c in ev.confidence)))
    rows += _sampling_rows(ev, unchecked) if ev.draws else _greedy_rows(ev, wanted, unchecked)
    table = "".join(f"<tr><th class='rowh'>{esc(n)}</th>{r}</tr>" for n, r in rows)
    unsure = "unsure proposals" if policy != "adaptive" else "proposals"
    if ev.decision and v < ev.decision.verified:  # the run's token budget ends inside this block
        unsure = "proposals past the token budget"
    facts = (
        f"<div><span class='k'>accepted length</span> <b>{a}</b> of {v} verified"
        f"{f' ({B - 1 - v} {unsure} not verified)' if v < B - 1 else ''}</div>"
        + (f"<div><span class='k'>proposals</span> {esc(_copy_words(ev))}</div>" if copied else "")
        + _outcome_facts(ev, token_text, hybrid)
        + _decision_facts(ev)
    )
    return (
        f"<div class='inspector'><div class='insp-title'>Cycle {ev.cycle}</div>"
        f"<div class='table-wrap'><table><tr><th class='rowh'>block position</th>{head}</tr>{table}</table></div>"
        f"<div class='facts'>{facts}</div><div class='explain'>{explain(ev, token_text, policy)}</div></div>"
    )


def _outcome_facts(ev: CycleEvent, token_text, hybrid: bool) -> str:
    """What the cycle committed, staged next, rolled back, and its time."""
    nxt = token_text(ev.next_staged)
    kind = "bonus" if _bonus(ev) else ("the target's pick" if ev.verified == 0 else "correction")
    committed = "".join(
        f'<span class="tok {"tok-target" if i == 0 else "tok-accepted"}">{show_text(token_text(t), inline=True)}</span>'
        for i, t in enumerate(ev.committed)
    )
    rollback = f"{ev.kv_trimmed} KV-cache entr{'y' if ev.kv_trimmed == 1 else 'ies'} trimmed per attention layer"
    if hybrid:
        rollback += (
            f"; {ev.gdn_replayed} GatedDeltaNet step{'' if ev.gdn_replayed == 1 else 's'} replayed per linear layer"
        )
    draft = "no draft" if ev.plain_step else f"draft {ev.draft_ms:.1f} ms"
    n = len(ev.committed)
    return (
        f"<div><span class='k'>committed</span> {committed} <span class='muted'>({n} token{'' if n == 1 else 's'})</span></div>"
        f"<div><span class='k'>next staged ({kind})</span> <span class='tok tok-target'>{show_text(nxt, inline=True)}</span></div>"
        f"<div><span class='k'>rollback</span> {esc(rollback)}</div>"
        f"<div><span class='k'>time</span> {draft} · verify {ev.verify_ms:.1f} ms · "
        f"rollback {ev.rollback_ms:.1f} ms · committed at {ev.t:.3f} s</div>"
    )


def _decision_facts(ev: CycleEvent) -> str:
    """The policy's decision: its reason, the tokens it expected, and the cost it predicted
    against the cost measured, both in plain one-token steps."""
    d = ev.decision
    if d is None:
        return ""
    measured = ev.measured_steps
    return (
        f"<div class='decision'><span class='k'>policy's decision</span> {esc(d.reason)}</div>"
        f"<div><span class='k'>expected</span> {d.expected_tokens:.2f} tokens · "
        f"committed {len(ev.committed)}</div>"
        f"<div><span class='k'>cost (one-token steps)</span> predicted {d.predicted_steps:.2f} · "
        f"measured {measured:.2f} <span class='muted'>({ev.cycle_ms:.1f} ms; a plain step was "
        f"{d.step_ms:.1f} ms by the cost model)</span></div>"
    )


def _plain_step_inspector(ev: CycleEvent, token_text, hybrid: bool) -> str:
    """A plain step: the target's one-token forward over the staged token, and why the policy took it."""

    def cell(tok, cls=""):
        return f'<td class="{cls}"><code>{show_text(token_text(tok), inline=True) or "&nbsp;"}</code></td>'

    rows = [
        ("target reads", cell(ev.staged_token, "staged")),
        ("target's pick after it", cell(ev.next_staged, "fix")),
    ]
    table = "".join(f"<tr><th class='rowh'>{esc(n)}</th>{r}</tr>" for n, r in rows)
    facts = (
        "<div><span class='k'>plain step</span> no draft forward: the target checked only the staged token</div>"
        + _outcome_facts(ev, token_text, hybrid)
        + _decision_facts(ev)
    )
    return (
        f"<div class='inspector plain-step'><div class='insp-title'>Cycle {ev.cycle} · plain step</div>"
        f"<div class='table-wrap'><table><tr><th class='rowh'>block position</th><th>0</th></tr>{table}</table></div>"
        f"<div class='facts'>{facts}</div><div class='explain'>{_explain_plain_step(ev, token_text)}</div></div>"
    )


def _explain_plain_step(ev: CycleEvent, token_text) -> str:
    def q(tok):
        return f"<code>{show_text(token_text(tok), inline=True)}</code>"

    chose = "drew" if ev.draws else "chose"
    s = [
        f"The policy took a plain step: no draft forward was run, so none was paid for, and the target "
        f"checked only the staged token {q(ev.staged_token)} in a one-token forward pass: exactly one step of "
        f"plain decoding. It committed {q(ev.staged_token)} and {chose} {q(ev.next_staged)} after it, staged "
        "for the next cycle.",
    ]
    if ev.decision is not None:
        why = _plain_step_why(ev).removeprefix("plain step: ")
        s.append(f"Why: {esc(why[:1].upper() + why[1:])}.")
    s.append(
        "Drafting pays only while the target accepts enough of the draft's guesses to cover the draft's "
        "forward and the extra rows it verifies; while it does not, plain steps keep DFlash as fast as plain "
        "decoding. Every so often the policy drafts again (a probe), to notice text that has become predictable."
    )
    return "<p>" + "</p><p>".join(s) + "</p>"


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


def _read_words(ev: CycleEvent, policy: str = None) -> str:
    """How much of the block the target read, and why (the start of a sentence)."""
    B, v = ev.block_size, ev.verified
    if v == B - 1:
        return f"The target then read the {B} tokens in one forward pass and"
    if v == 0:
        return (
            "The policy then judged that not even the first guess was worth its row in the target's "
            "forward pass, so the target read only the staged token, and"
        )
    if policy == "adaptive":
        return (
            f"The policy verified only the first {v}: past them, a guess's chance of being accepted no longer "
            f"paid for the row it adds to the target's forward pass, so the target read {v + 1} tokens, not {B}. It"
        )
    return (
        f"The draft was sure of only the first {v} (each at least the confidence threshold; "
        f"the first always goes), so the target read {v + 1} tokens, not {B}: on a CPU every "
        "verified position costs time, and unsure guesses are rarely accepted. It"
    )


def explain(ev: CycleEvent, token_text, policy: str = None) -> str:
    """The cycle in plain words (escaped HTML)."""
    if ev.plain_step:
        return _explain_plain_step(ev, token_text)
    B, a, v = ev.block_size, ev.accepted_len, ev.verified

    def q(tok):
        return f"<code>{show_text(token_text(tok), inline=True)}</code>"

    read = _read_words(ev, policy)
    if ev.draws:
        return _explain_sampled(ev, q, read)
    proposed = (
        f"Its last {ev.copy_match} tokens had occurred before in the prompt or output, so the "
        f"{len(ev.drafted)} tokens that followed them there (from position {ev.copied_from}) were copied as the guesses."
        if ev.source == "copy"
        else f"The draft saw it followed by {B - 1} MASK slots and filled all {B - 1} in one forward pass."
    )
    s = [
        f"The target had already chosen {q(ev.staged_token)} (the staged token). {proposed}",
        f"{read} said, at every position, which token it would pick itself."
        if v
        else f"{read} said which token it would pick next.",
    ]
    if v == 0:
        s.append(
            f"No guess was checked, so only the staged token was committed; the target's pick "
            f"{q(ev.next_staged)} is staged for the next cycle."
        )
    elif ev.is_bonus:
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
    if v == 0:
        s.append(
            f"No proposal was examined, so the next token, {q(ev.next_staged)}, was drawn from the target's p "
            "after the staged one, as plain sampling would draw it."
        )
    elif ev.is_bonus:
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
