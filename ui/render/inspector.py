"""The cycle inspector: one cycle's decision, proposals, verification and outcome, explained."""

from dflash_core.engine.events import CycleEvent

from .text import esc, show_text
from .tokens import copy_words, is_bonus, plain_step_why


def inspector_html(
    ev: CycleEvent, token_text, mask_text: str = "MASK", hybrid: bool = False, policy: str = None
) -> str:
    """One cycle laid out as a table over block positions 0..B-1, then what was committed and
    rolled back, and the policy's decision. `token_text(id)` decodes one token; `policy` is the
    run's ("adaptive" | "fixed"; None: fixed, as runs before the adaptive policy)."""
    if ev.plain_step:
        return _plain_step_inspector(ev, token_text, hybrid)
    B, a, v = ev.block_size, ev.accepted_len, ev.verified
    P = len(ev.drafted)  # proposals: B - 1 from the draft, up to copy_source.MAX_COPY from a copy

    def cell(tok, cls=""):
        return f'<td class="{cls}"><code>{show_text(token_text(tok), inline=True) or "&nbsp;"}</code></td>'

    head = "".join(f"<th>{k}</th>" for k in range(max(B, P + 1)))
    if ev.draft_ran:
        block = (
            cell(ev.staged_token, "staged")
            + "".join(f'<td class="mask"><code>{esc(mask_text)}</code></td>' for _ in range(B - 1))
            + "<td></td>" * (P + 1 - B)
        )
    else:  # a copy verified alone: the target reads the staged token and the copy, no draft ran
        block = cell(ev.staged_token, "staged") + f'<td class="unverified" colspan="{P}">no draft forward</td>'
    drafted = "<td></td>" + "".join(
        cell(t, "acc" if k < a else ("rej" if k < v else "unverified")) for k, t in enumerate(ev.drafted)
    )
    # posterior[k-1] is the target's choice for block position k (computed at position k-1);
    # positions past the verified ones were not sent to the target
    unchecked = '<td class="unverified">–</td>' * (P - v)
    wanted = (
        "<td></td>"
        + "".join(cell(ev.posterior[k], "acc" if k < a else ("fix" if k == a else "")) for k in range(v))
        + unchecked
    )
    copied = ev.source == "copy"
    rows = [
        ("block into the draft" if ev.draft_ran else "staged token", block),
        ("copied from the context" if copied else "draft proposes", drafted),
    ]
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
        f"{f' ({P - v} {unsure} not verified)' if v < P else ''}</div>"
        + (f"<div><span class='k'>proposals</span> {esc(copy_words(ev))}</div>" if copied else "")
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
    kind = "bonus" if is_bonus(ev) else ("the target's pick" if ev.verified == 0 else "correction")
    committed = "".join(
        f'<span class="tok {"tok-target" if i == 0 else "tok-accepted"}">{show_text(token_text(t), inline=True)}</span>'
        for i, t in enumerate(ev.committed)
    )
    rollback = f"{ev.kv_trimmed} KV-cache entr{'y' if ev.kv_trimmed == 1 else 'ies'} trimmed per attention layer"
    if hybrid:
        rollback += (
            f"; {ev.gdn_replayed} GatedDeltaNet step{'' if ev.gdn_replayed == 1 else 's'} replayed per linear layer"
        )
    draft = f"draft {ev.draft_ms:.1f} ms" if ev.draft_ran else "no draft forward"
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
        why = plain_step_why(ev).removeprefix("plain step: ")
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
    v, P = ev.verified, len(ev.drafted)
    if v == P:
        return f"The target then read the {P + 1} tokens in one forward pass and"
    if v == 0:
        return (
            "The policy then judged that not even the first guess was worth its row in the target's "
            "forward pass, so the target read only the staged token, and"
        )
    if policy == "adaptive":
        return (
            f"The policy verified only the first {v}: past them, a guess's chance of being accepted no longer "
            f"paid for the row it adds to the target's forward pass, so the target read {v + 1} tokens, not {P + 1}. It"
        )
    return (
        f"The draft was sure of only the first {v} (each at least the confidence threshold; "
        f"the first always goes), so the target read {v + 1} tokens, not {P + 1}: on a CPU every "
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
            f"It agreed with every {'verified ' if v < len(ev.drafted) else ''}guess, so all {a} were kept, and its pick after the last one, "
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
            f"All {a} {'verified ' if v < len(ev.drafted) else ''}proposals were kept, so the next token, {q(ev.next_staged)}, "
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
