"""The playground's HTML and charts from synthetic engine events (no models, no server)."""

import json
from html.parser import HTMLParser

from dflash_core.events import CycleEvent, CycleTally, Divergence, RunSummary, TokenEvent
from ui import charts, render

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


def cycle(i, staged, drafted, posterior, committed=None, t=0.1):
    """posterior has one entry per verified position: shorter than drafted + 1 means the rest
    of the proposals were not verified (the draft was unsure)."""
    verified = len(posterior) - 1
    a = 0
    while a < verified and drafted[a] == posterior[a]:
        a += 1
    return CycleEvent(
        cycle=i,
        staged_token=staged,
        drafted=drafted,
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
    assert len(empty) == 5 and all(len(f.data) == 0 for f in empty)
