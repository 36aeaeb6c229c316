"""The DFlash pane: each cycle's staged, accepted and rejected tokens, with their tooltips; the legend."""

from dflash_core.engine.events import CycleEvent

from .text import esc, token_span


def cycle_spans(ev: CycleEvent, pieces: list, draft_text, max_rejected=None) -> str:
    """One cycle: the staged (target-chosen) token, the accepted drafts, then the rejected drafts
    struck through (and those the target did not verify, under a confidence threshold). `pieces`
    are the texts of `ev.committed`; `draft_text(id)` decodes one proposal on its own. At most
    `max_rejected` rejected drafts are shown (None = all)."""
    if ev.plain_step:
        return _plain_step_spans(ev, pieces)
    a, v = ev.accepted_len, ev.verified
    bonus = is_bonus(ev)
    head = f"cycle {ev.cycle}"
    tail = f"accepted {a}/{v}" + (" (all: bonus token next)" if bonus else "")
    # proposals copied from the context rather than drafted: their own colour and words
    copied, kind_of = (" tok-copied", "copied") if ev.source == "copy" else ("", "draft")
    if copied:
        tail += f" · {copy_words(ev)}"
    if v < len(ev.drafted):
        # fewer than the policy chose: the run's token budget ends inside this block
        why = "proposals past the token budget" if ev.decision and v < ev.decision.verified else "unsure proposals"
        tail += f" · {len(ev.drafted) - v} {why} not verified"
    out = []
    for k, text in enumerate(pieces):
        if k == 0:
            tip = f"{head} · block position 0 · staged token (target's own choice) · {tail}"
            out.append(token_span(text, "tok-target", tip))
        else:
            tip = f"{head} · block position {k} · accepted {kind_of} token{_draw_tip(ev, k - 1)} · {tail}"
            out.append(token_span(text, "tok-accepted" + copied, tip))
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
            out.append(token_span(draft_text(tok), f"tok-{kind}{copied}", tip, inline=True))
        if len(shown) < len(rejected):
            more = len(rejected) - len(shown)
            out.append(
                f'<span class="tok-more" title="{more} more draft tokens of cycle {ev.cycle} not committed (rejected or unverified)">+{more}</span>'
            )
    cls = "cycle cycle-bonus" if bonus else "cycle"
    return f'<span class="{cls}" data-cycle="{ev.cycle}">{"".join(out)}</span>'


def copy_words(ev: CycleEvent) -> str:
    """Where a copied cycle's proposals came from."""
    return (
        f"copied from context position {ev.copied_from} (prompt + output), where the last "
        f"{ev.copy_match} tokens occurred before"
    )


def is_bonus(ev: CycleEvent) -> bool:
    """All verified proposals accepted, and there was at least one (a drafted cycle that verified
    none has nothing to be a bonus after)."""
    return ev.is_bonus and ev.verified > 0


def _reason(ev: CycleEvent) -> str:
    """The policy's one line for the cycle ('' for events without a decision)."""
    return ev.decision.reason if ev.decision is not None else ""


PLAIN_STEP_WORDS = "no draft forward; the target checked only the staged token: one plain decoding step"


def plain_step_why(ev: CycleEvent) -> str:
    """ "plain step: <the policy's reason>" (its reason mostly says "plain step: " already)."""
    reason = _reason(ev) or "the policy decoded plainly"
    return reason if reason.startswith("plain step") else f"plain step: {reason}"


def _plain_step_spans(ev: CycleEvent, pieces: list) -> str:
    """A plain step: its one committed token (the staged one), muted and outlined, its tooltip
    the policy's reason."""
    why = plain_step_why(ev)
    tip = f"cycle {ev.cycle} · {why} · {PLAIN_STEP_WORDS}"
    spans = "".join(token_span(text, "tok-target tok-plain", tip) for text in pieces)
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
