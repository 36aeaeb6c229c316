"""The playground's HTML and charts from synthetic engine events (no models, no server)."""

import json
import shutil
import subprocess
from html import unescape
from html.parser import HTMLParser
from types import SimpleNamespace

import pytest

from dflash_core.engine.events import CycleEvent, CycleTally, Decision, Divergence, RunSummary, TokenEvent
from ui import assets, charts, render

# token id -> text for the synthetic events
TEXT = {
    1: "def",
    2: " f",
    3: "(x",
    4: "):",
    5: "\n",
    6: "    ",
    7: "<script>alert('x')</script>",
    8: 'say "hi"',
    9: " return",
    10: "\t",
    11: "&amp;",
}


def text(tok):
    return TEXT[tok]


def cycle(i, staged, drafted, posterior, committed=None, t=0.1, decision=None):
    """posterior has one entry per verified position: shorter than drafted + 1 means the rest
    of the proposals were not verified (the draft was unsure)."""
    verified = len(posterior) - 1
    a = 0
    while a < verified and drafted[a] == posterior[a]:
        a += 1
    return CycleEvent(
        cycle=i,
        block_size=len(drafted) + 1,
        staged_token=staged,
        drafted=drafted,
        confidence=[0.9 - 0.1 * k for k in range(len(drafted))],
        verified=verified,
        posterior=posterior,
        accepted_len=a,
        committed=committed if committed is not None else [staged] + drafted[:a],
        next_staged=posterior[a],
        kv_trimmed=verified - a,
        gdn_replayed=0,
        draft_ms=2.0,
        verify_ms=5.0,
        rollback_ms=0.5,
        t=t,
        decision=decision,
    )


def plain(
    i, staged, next_staged, block_size=5, reason="plain step: drafting has been committing 1.3 tokens for 1.6 steps"
):
    """A plain step of the adaptive policy: nothing drafted, the target checks the staged token."""
    return CycleEvent(
        cycle=i,
        block_size=block_size,
        staged_token=staged,
        drafted=[],
        confidence=[],
        verified=0,
        posterior=[next_staged],
        accepted_len=0,
        committed=[staged],
        next_staged=next_staged,
        kv_trimmed=0,
        gdn_replayed=0,
        draft_ms=0.0,
        verify_ms=4.0,
        rollback_ms=0.4,
        t=0.2,
        decision=Decision(0, True, 1.0, 1.0, 4.0, reason),
    )


class Spans(HTMLParser):
    """Collects (classes, title, text) of every span.tok, text unescaped as the browser shows it."""

    def __init__(self, markup):
        super().__init__()
        self.spans, self.depth, self.current = [], 0, None
        self.feed(markup)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if self.current is not None:
            self.depth += 1
        elif tag == "span" and "tok" in (attrs.get("class") or "").split():
            self.current = [attrs["class"].split(), attrs.get("title"), ""]
            self.depth = 0

    def handle_endtag(self, tag):
        if self.current is None:
            return
        if self.depth == 0:
            self.spans.append(tuple(self.current))
            self.current = None
        else:
            self.depth -= 1

    def handle_data(self, data):
        if self.current is not None:
            self.current[2] += data


def kinds(markup):
    return [
        next(c for c in classes if c.startswith("tok-") and c != "tok-blank") for classes, _, _ in Spans(markup).spans
    ]


def pieces_of(cycles):
    return [text(t) for c in cycles for t in c.committed]


def test_classes_follow_acceptance():
    c0 = cycle(0, 1, [2, 3, 4, 5], [2, 3, 9, 5, 6])  # accepts 2, rejects at position 3
    c1 = cycle(1, 9, [3, 4, 5, 6], [4, 4, 5, 6, 1])  # accepts none
    c2 = cycle(2, 4, [5, 6, 9, 1], [5, 6, 9, 1, 2])  # accepts all: a bonus follows
    markup = render.dflash_tokens_html([c0, c1, c2], pieces_of([c0, c1, c2]), text)
    assert kinds(markup) == [
        "tok-target",
        "tok-accepted",
        "tok-accepted",
        "tok-rejected",
        "tok-rejected",
        "tok-target",
        "tok-rejected",
        "tok-rejected",
        "tok-rejected",
        "tok-rejected",
        "tok-target",
        "tok-accepted",
        "tok-accepted",
        "tok-accepted",
        "tok-accepted",
    ]
    assert markup.count('class="cycle"') == 2 and markup.count("cycle-bonus") == 1


def test_rejected_tokens_are_struck_drafts_and_tooltips_name_the_cycle():
    c0 = cycle(0, 1, [2, 3, 4], [2, 9, 4, 5])
    spans = Spans(render.dflash_tokens_html([c0], pieces_of([c0]), text)).spans
    rejected = [s for s in spans if "tok-rejected" in s[0]]
    assert [s[2] for s in rejected] == ["(x", "):"]  # the draft's proposals after the mismatch
    assert "cycle 0" in rejected[0][1] and "block position 2" in rejected[0][1]
    assert "accepted 1/3" in rejected[0][1] and "target wanted ' return'" in rejected[0][1]
    assert "block position 1" in spans[1][1] and "accepted draft token" in spans[1][1]


def test_cycle_cut_by_eos_shows_no_rejections_and_cap_on_rejected():
    cut = cycle(0, 1, [2, 3, 4], [2, 3, 4, 5], committed=[1, 2])  # max tokens reached inside the cycle
    assert kinds(render.dflash_tokens_html([cut], pieces_of([cut]), text)) == ["tok-target", "tok-accepted"]
    many = cycle(0, 1, [2, 3, 4, 5, 6, 9], [9, 1, 1, 1, 1, 1, 1])
    markup = render.dflash_tokens_html([many], pieces_of([many]), text, max_rejected=2)
    assert kinds(markup).count("tok-rejected") == 2 and ">+4<" in markup


def test_model_text_is_escaped_everywhere():
    c0 = cycle(0, 7, [8, 7], [8, 11, 1])
    markup = render.dflash_tokens_html([c0], pieces_of([c0]), text)
    assert "<script>" not in markup and "&lt;script&gt;" in markup
    spans = Spans(markup).spans
    assert spans[0][2] == TEXT[7] and spans[1][2] == TEXT[8]  # the browser shows the original text
    assert spans[2][2] == TEXT[7] and "target wanted '&amp;'" in spans[2][1]  # quotes kept inside the title
    inspector = render.inspector_html(c0, text)
    assert "<script>" not in inspector and "&lt;script&gt;" in inspector and 'say "hi"' not in inspector
    assert "<script>" not in render.plain_text_html(TEXT[7]) and "<script>" not in render.error_html(TEXT[7])
    race = render.race_html([TEXT[7]], [0.1], [TEXT[8]], [0.2])
    assert "<script>" not in race and 'say "hi"' not in race


def test_whitespace_is_visible_and_readable():
    c0 = cycle(0, 9, [5, 6, 10], [5, 6, 1, 2])
    markup = render.dflash_tokens_html([c0], pieces_of([c0]), text)
    spans = Spans(markup).spans
    assert spans[1][2] == "↵\n"  # a committed newline breaks the line and shows a mark
    assert "tok-blank" in spans[2][0] and spans[2][2] == "    "  # spaces-only token stays visible
    assert spans[3][2] == "⇥" and "tok-rejected" in spans[3][0]  # a rejected tab: mark only, inline
    assert render.show_text("a\nb", inline=True).count("\n") == 0
    assert render.show_text(" x", inline=True) == '<span class="ws">␣</span>x'  # a proposal's space shows


def test_pieces_join_to_the_decoded_text_across_split_characters():
    def decode(ids):
        return bytes(ids).decode("utf-8", errors="replace")

    ids = list("aé€b".encode())
    pieces = render.Pieces(decode).add(ids)
    assert "".join(pieces) == "aé€b" and pieces[:3] == ["a", "", "é"]
    inc = render.Pieces(decode)
    assert inc.add(ids[:2]) + inc.add(ids[2:]) == pieces  # streaming gives the same pieces


def test_pieces_keep_sentencepiece_word_spaces():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    text = "the quick brown fox jumps over the lazy dog"
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer, tok.decoder = pre_tokenizers.Metaspace(), decoders.Metaspace()
    tok.train_from_iterator([text], trainers.BpeTrainer(vocab_size=60, show_progress=False))
    ids = tok.encode(text).ids
    assert tok.decode(ids[1:2]) == tok.decode(ids[1:2]).lstrip()  # a lone token loses its space
    pieces = render.Pieces(tok.decode).add(ids)
    assert "".join(pieces) == tok.decode(ids) == text


def test_inspector_rows():
    c0 = cycle(3, 1, [2, 3, 4, 5], [2, 3, 9, 5, 6])
    markup = render.inspector_html(c0, text, hybrid=True)
    assert "Cycle 3" in markup and markup.count('class="mask"><code>MASK') == 4

    def row(name):
        cells = markup.split(name)[1].split("</tr>")[0]
        return [x.split("<")[0] for x in cells.split('">')[1:]]

    assert row("match") == ["✓", "✓", "✗", "✓"]
    assert row("cumulative product") == ["1", "1", "0", "0"]  # the later match is not accepted
    assert "<b>2</b> of 4" in markup and "correction" in markup
    assert "2 KV-cache entries trimmed" in markup and "0 GatedDeltaNet steps replayed" in markup
    bonus = render.inspector_html(cycle(0, 1, [2, 3], [2, 3, 4]), text)
    assert "bonus" in bonus and "GatedDeltaNet" not in bonus


def test_unverified_proposals_are_shown_apart_from_rejected_ones():
    """Under --min-confidence the target checks only the first proposals: the rest are neither
    accepted nor rejected, and the inspector has no target choice for them."""
    part = cycle(0, 1, [2, 3, 4, 5], [2, 9, 6])  # 2 of 4 verified: accepts 1, rejects at 2
    spans = Spans(render.dflash_tokens_html([part], pieces_of([part]), text)).spans
    assert kinds(render.dflash_tokens_html([part], pieces_of([part]), text)) == [
        "tok-target",
        "tok-accepted",
        "tok-rejected",
        "tok-unverified",
        "tok-unverified",
    ]
    assert "accepted 1/2 · 2 unsure proposals not verified" in spans[2][1]
    assert "not verified" in spans[3][1] and "target wanted" not in spans[3][1]
    bonus = cycle(1, 1, [2, 3, 4, 5], [2, 3, 7])  # both verified ones accepted: a bonus
    assert kinds(render.dflash_tokens_html([bonus], pieces_of([bonus]), text))[-2:] == ["tok-unverified"] * 2
    markup = render.inspector_html(part, text)

    def row(name):
        cells = markup.split(name)[1].split("</tr>")[0]
        return [x.split("<")[0] for x in cells.split('">')[1:]]

    assert row("match") == ["✓", "✗", "–", "–"]
    assert row("cumulative product") == ["1", "0", "–", "–"]
    assert "<b>1</b> of 2 verified (2 unsure proposals not verified)" in markup
    # the policy chose all 4, the token budget left room for 2: said so, not "unsure"
    budget = cycle(2, 1, [2, 3, 4, 5], [2, 9, 6], decision=Decision(4, False, 2.0, 1.5, 10.0, "verify 4 of 4"))
    spans = Spans(render.dflash_tokens_html([budget], pieces_of([budget]), text)).spans
    assert "2 proposals past the token budget not verified" in spans[2][1]
    assert "past the run's token budget" in spans[3][1]
    assert "(2 proposals past the token budget not verified)" in render.inspector_html(budget, text)
    assert "target read 3 tokens, not 5" in markup
    assert render.dflash_extra(CycleTally.of([part, bonus]))[1][1] == "75%"  # 3 accepted of 4 verified


def test_verdicts_and_speedup():
    d = Divergence(index=5, dflash_token=3, baseline_token=4, top2_margin=0.0012)
    detail = render.divergence_detail(d, text)
    assert "token 5" in detail and "'(x'" in detail and "'):'" in detail and "0.0012" in detail
    assert "identical" in render.lossless_html("identical")
    assert "&lt;" in render.lossless_html("diverged", "<b>")
    base = RunSummary("baseline", 3, [1] * 11, 0.1, 1.0, "max_tokens", 1.0)  # 10 tok/s
    fast = RunSummary("dflash", 3, [1] * 11, 0.1, 0.4, "max_tokens", 1.0)  # 25 tok/s
    assert "2.50×" in render.speedup_html(base, fast)
    assert "–" in render.speedup_html(base, None)


def test_race_timeline_roundtrips():
    class Race(HTMLParser):
        def handle_starttag(self, tag, attrs):
            if "data-timeline" in dict(attrs):
                self.data = json.loads(dict(attrs)["data-timeline"])

    p = Race()
    p.feed(render.race_html(["a", "<b>"], [0.1, 0.2], ['"q"'], [0.15], speed=0.5))
    assert p.data["baseline"] == {"pieces": ["a", "<b>"], "t": [0.1, 0.2]}
    assert p.data["dflash"]["pieces"] == ['"q"'] and p.data["speed"] == 0.5


def test_charts_from_events():
    cycles = [
        cycle(0, 1, [2, 3, 4], [2, 3, 9, 5], t=0.1),
        cycle(1, 9, [3, 4, 5], [1, 1, 1, 1], t=0.2),
        cycle(2, 1, [2, 3, 4], [2, 3, 4, 5], t=0.3),
    ]
    fig = charts.accepted_length_chart(cycles)
    assert list(fig.data[0].y) == [2, 0, 3]
    fig = charts.acceptance_by_position_chart(CycleTally.of(cycles))
    assert [round(v, 3) for v in fig.data[0].y] == [0.667, 0.667, 0.333]
    summary = RunSummary(
        "dflash",
        3,
        [1] * 8,
        0.05,
        0.3,
        "max_tokens",
        1.0,
        block_size=4,
        cycles=3,
        drafted_tokens=9,
        accepted_tokens=5,
        accepted_per_position=[2, 2, 1],
    )
    assert list(charts.acceptance_by_position_chart(summary.tally).data[0].y) == list(summary.acceptance_by_position)
    base = [TokenEvent(i, 1, 0.05 * i) for i in range(8)]
    fig = charts.tokens_vs_time_chart(base, cycles, 0.5, 1.0)
    assert list(fig.data[0].y) == list(range(1, 9)) and fig.data[0].x[0] == 0.5
    assert list(fig.data[1].y) == [3, 4, 8] and list(fig.data[1].x) == [1.1, 1.2, 1.3]
    fig = charts.time_split_chart(cycles)
    assert [t.name for t in fig.data] == ["draft", "verify", "rollback"] and fig.layout.barmode == "stack"
    fig = charts.tokens_per_cycle_histogram(cycles)
    assert list(fig.data[0].y) == [1, 0, 1, 1]  # one cycle each of 1, 3 and 4 tokens
    empty = charts.all_charts([], None, [], None)
    assert len(empty) == 6 and all(len(f.data) == 0 for f in empty)


# --- the verification policy ---------------------------------------------------------------------

NASTY_REASON = 'plain step: <b>"drafting"</b> & friends committed 1.3 tokens for 1.6 steps'


class CycleSpans(HTMLParser):
    """(classes, title) of every span.cycle."""

    def __init__(self, markup):
        super().__init__()
        self.cycles = []
        self.feed(markup)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "span" and "cycle" in (attrs.get("class") or "").split():
            self.cycles.append((attrs["class"].split(), attrs.get("title")))


def test_a_plain_step_is_drawn_apart_with_its_escaped_reason():
    drafted = cycle(0, 1, [2, 3, 4, 5], [2, 3, 9, 5, 6])
    step = plain(1, 9, 4, reason=NASTY_REASON)
    after = cycle(2, 4, [5, 6, 9, 1], [5, 6, 9, 1, 2])
    markup = render.dflash_tokens_html([drafted, step, after], pieces_of([drafted, step, after]), text)
    assert "<b>" not in markup and "&lt;b&gt;" in markup  # the reason is escaped, in the attribute too
    cycles = CycleSpans(markup).cycles
    assert ["plain-step" in classes for classes, _ in cycles] == [False, True, False]
    assert unescape(cycles[1][1]) == NASTY_REASON  # the browser's tooltip: "plain step: <reason>", as written
    other = plain(3, 9, 4, reason="probe wait 4")  # a reason not saying so itself gets the prefix
    assert unescape(CycleSpans(render.cycle_spans(other, [TEXT[9]], text)).cycles[0][1]) == "plain step: probe wait 4"
    spans = Spans(markup).spans
    plain_spans = [sp for sp in spans if "tok-plain" in sp[0]]
    assert len(plain_spans) == 1  # the one token a plain step commits: the staged one
    classes, tip, shown = plain_spans[0]
    assert "tok-target" in classes and shown == TEXT[9]
    assert NASTY_REASON in tip and "no draft forward" in tip and "cycle 1" in tip
    # nothing drafted, so no rejected or unverified proposals in that cycle
    assert kinds(render.dflash_tokens_html([step], pieces_of([step]), text)) == ["tok-target"]
    assert "plain-step" in render.LEGEND and "plain step" in render.LEGEND


def test_the_inspector_of_a_plain_step_says_no_draft_ran():
    step = plain(7, 7, 8, reason=NASTY_REASON)
    markup = render.inspector_html(step, text, policy="adaptive")
    assert "Cycle 7 · plain step" in markup
    assert "no draft forward was run" in markup and "checked only the staged token" in markup
    assert "MASK" not in markup and "draft proposes" not in markup  # no block went into a draft
    assert "<script>" not in markup and "&lt;script&gt;" in markup  # the staged token's text
    assert "<b>" not in markup and "&lt;b&gt;&quot;drafting&quot;&lt;/b&gt; &amp; friends" in markup
    assert "no draft forward · verify 4.0 ms" in markup
    # expected 1 token for 1 predicted step; measured (4.0 + 0.4) / 4.0 = 1.10 steps
    assert "expected</span> 1.00 tokens" in markup and "predicted 1.00 · measured 1.10" in markup
    assert "exactly one step of plain decoding" in render.explain(step, text)
    assert "Why: &lt;b&gt;" in markup and "plain step: plain step" not in markup  # the reason once, in words


def test_the_inspector_shows_a_drafted_cycles_decision():
    reason = "verify 2 of 4: expected 2.1 tokens for 1.6 steps; proposal 3 would be accepted with chance 12%"
    decided = cycle(4, 1, [2, 3, 4, 5], [2, 3, 9], decision=Decision(2, False, 2.1, 1.6, 5.0, reason))
    markup = render.inspector_html(decided, text, policy="adaptive")
    assert "policy's decision</span> " + render.esc(reason) in markup
    assert "expected</span> 2.10 tokens · committed 3" in markup
    assert "predicted 1.60 · measured 1.50" in markup  # (2 + 5 + 0.5) ms over a 5 ms plain step
    assert "The policy verified only the first 2" in markup and "target read 3 tokens, not 5" in markup
    assert "draft confidence" in markup and "<td>0.90</td>" in markup
    spans = Spans(render.dflash_tokens_html([decided], pieces_of([decided]), text)).spans
    assert [sp[1] for sp in spans if "tok-unverified" in sp[0]] and all(
        f"not verified: {reason}" in sp[1] for sp in spans if "tok-unverified" in sp[0]
    )
    # the fixed policy's wording stays that of the confidence threshold
    assert "confidence threshold" in render.inspector_html(decided, text, policy="fixed")


def test_a_drafted_cycle_that_verifies_nothing_is_no_bonus():
    """The adaptive policy may pay for a draft and then verify none of it (v = 0)."""
    none = cycle(0, 1, [2, 3, 4], [9], decision=Decision(0, False, 1.0, 1.3, 5.0, "verify 0 of 3: ..."))
    markup = render.dflash_tokens_html([none], pieces_of([none]), text)
    assert "cycle-bonus" not in markup and "plain-step" not in markup
    assert kinds(markup) == ["tok-target", "tok-unverified", "tok-unverified", "tok-unverified"]
    inspector = render.inspector_html(none, text, policy="adaptive")
    assert "bonus" not in inspector and "No guess was checked" in inspector


def test_policy_chart_has_a_point_per_cycle():
    def decided(c, predicted):
        c.decision = Decision(c.verified, False, 2.0, predicted, 5.0, "verify")
        return c

    cycles = [
        decided(cycle(0, 1, [2, 3, 4, 5], [2, 3, 9, 5, 6]), 1.8),
        plain(1, 9, 4),
        plain(2, 4, 5),
        decided(cycle(3, 5, [6, 9, 1, 2], [6, 9, 1]), 1.5),
        cycle(4, 1, [2, 3, 4, 5], [2, 9]),  # no decision (an event from before the policy)
    ]
    fig = charts.policy_chart(cycles)
    by_name = {t.name: t for t in fig.data}
    assert list(by_name["verified"].x) == [0, 1, 2, 3, 4] and list(by_name["verified"].y) == [4, 0, 0, 2, 1]
    assert list(by_name["plain step"].x) == [1, 2] and list(by_name["plain step"].y) == [0, 0]
    assert list(by_name["predicted cost"].x) == [0, 1, 2, 3]  # cycles with a decision
    assert list(by_name["predicted cost"].y) == [1.8, 1.0, 1.0, 1.5]
    assert [round(y, 3) for y in by_name["measured cost"].y] == [1.5, 1.1, 1.1, 1.5]
    assert by_name["measured cost"].yaxis == "y2" and fig.layout.yaxis2.overlaying == "y"
    assert charts.all_charts([], None, cycles, None)[-1].to_dict() == fig.to_dict()
    # plain steps show muted in the accepted-length chart too
    colors = charts.accepted_length_chart(cycles).data[0].marker.color
    assert colors[1] == colors[2] == charts.PLAIN_COLOR != colors[0]


def test_stats_name_the_plain_steps():
    cycles = [cycle(0, 1, [2, 3, 4, 5], [2, 3, 9, 5, 6]), plain(1, 9, 4), plain(2, 4, 5)]
    tally = CycleTally.of(cycles)
    assert ("plain steps", "2 of 3") == render.dflash_extra(tally, "adaptive")[2][:2]
    assert len(render.dflash_extra(CycleTally.of(cycles[:1]), "fixed")) == 2  # the fixed policy takes none
    assert render.dflash_extra(None, "adaptive")[2][:2] == ("plain steps", "–")
    summary = RunSummary(
        "dflash", 3, [1] * 5, 0.1, 0.5, "max_tokens", 1.0, block_size=5, cycles=3, policy="adaptive", plain_steps=2
    )
    assert render.policy_summary(summary) == "adaptive policy: 2 plain steps of 3 cycles"
    fixed = RunSummary("dflash", 3, [1] * 5, 0.1, 0.5, "max_tokens", 1.0, min_confidence=0.2, policy="fixed")
    assert render.policy_summary(fixed) == "fixed policy (min confidence 0.2)"
    assert render.stats_html(5, 0.6, 8.0, render.dflash_extra(tally, "adaptive")).count("plain steps") == 1


def copied_link(*settings) -> str:
    """The page's Copy link script (assets.COPY_LINK_JS), run in node on a page at http://host/."""
    script = (
        "globalThis.window = {location: {href: 'http://host/'}}; globalThis.navigator = {};"
        f"const copy = eval({json.dumps(assets.COPY_LINK_JS)});"
        f"process.stdout.write(copy(...{json.dumps(list(settings))}));"
    )
    return subprocess.run(["node", "-e", script], capture_output=True, text=True, check=True, timeout=30).stdout


def prefilled(url: str) -> dict:
    """What the page's form opens with for a link: Playground.prefill on its query."""
    from urllib.parse import parse_qsl, urlsplit

    from ui.handlers import Playground

    catalogue = SimpleNamespace(is_chat=lambda key: False)  # no pair: the form's own defaults
    play = Playground(catalogue, worker=None, max_tokens_cap=256)
    request = SimpleNamespace(query_params=dict(parse_qsl(urlsplit(url).query)))
    names = ["prompt", "max_tokens", "block_size", "chat", "policy", "min_confidence", "temperature", "top_p", "seed"]
    names += ["model_info", "thinking", "copy"]
    return dict(zip(names, play.prefill(None, request)))


@pytest.mark.skipif(shutil.which("node") is None, reason="needs node to run the page's script")
def test_the_policy_round_trips_through_the_share_link():
    fixed = copied_link("def f(x):\n", 40, 5, False, "fixed", 0.35, 0, 1, 0, False, False)
    assert "policy=fixed" in fixed and "min_confidence=0.35" in fixed
    form = prefilled(fixed)
    assert form["policy"] == "fixed" and form["prompt"] == "def f(x):\n"
    assert form["min_confidence"].value == 0.35 and form["min_confidence"].interactive is True
    adaptive = copied_link("hi", 40, 5, True, "adaptive", 0.35, 0, 1, 0, False, False)
    assert "policy=adaptive" in adaptive and "min_confidence" not in adaptive  # the threshold is the fixed policy's
    form = prefilled(adaptive)
    assert form["policy"] == "adaptive" and form["min_confidence"].interactive is False
    # a link from before the policy always set min_confidence: it meant the fixed policy
    assert prefilled("http://host/?prompt=x&min_confidence=0.4")["policy"] == "fixed"
    assert prefilled("http://host/?prompt=x")["policy"] == "adaptive"
    assert prefilled("http://host/?prompt=x&policy=bogus")["policy"] == "adaptive"


@pytest.mark.skipif(shutil.which("node") is None, reason="needs node to run the page's script")
def test_the_copy_switch_round_trips_through_the_share_link():
    on = copied_link("hi", 40, 5, True, "adaptive", 0.2, 0, 1, 0, False, True)
    assert "copy=1" in on and prefilled(on)["copy"] is True
    off = copied_link("hi", 40, 5, True, "adaptive", 0.2, 0, 1, 0, False, False)
    assert "copy" not in off.split("?", 1)[1] and prefilled(off)["copy"] is False
