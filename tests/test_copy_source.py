"""The copy source (prompt lookup): its n-gram index, and lossless runs whose proposals it copies."""

import dataclasses

import pytest
from code_prompts import PROMPTS

from dflash_core.engine.copy_source import MAX_COPY, MAX_MATCH, PRIOR_TRIALS, Copy, CopySource
from dflash_core.engine.events import CycleEvent, RunSummary
from dflash_core.engine.policy import AcceptancePredictor, CostModel, CostProfile, Policy


def run(gen):
    events = list(gen)
    assert isinstance(events[-1], RunSummary)
    return events[:-1], events[-1]


def test_copy_follows_the_latest_occurrence_of_the_longest_match():
    #          0  1  2  3  4  5  6  7  8  9
    context = [1, 2, 3, 4, 5, 9, 3, 4, 7, 8]
    src = CopySource(context)
    # the last tokens [.., 8] + staged 3: "8 3" never occurred; "3" alone is below the minimum match
    assert src.propose(3, 4) is None
    src.extend([3])  # now context ends "... 7 8 3", staged 4: "3 4" occurred at 2 and at 6
    copy = src.propose(4, 3)
    assert (copy.start, copy.match, copy.tokens) == (8, 2, [7, 8, 3])  # the latest one, at 6-7
    # a longer match wins over a more recent shorter one: "1 2 3 4" (at 0) is followed by 5
    src = CopySource([1, 2, 3, 4, 5, 6, 0, 3, 4, 8, 0, 1, 2, 3])
    copy = src.propose(4, 2)
    assert (copy.start, copy.match, copy.tokens) == (4, 4, [5, 6])


def test_matches_are_capped_at_the_longest_n_gram():
    src = CopySource(list(range(20)) + list(range(10)))
    copy = src.propose(10, 3)
    assert (copy.start, copy.match, copy.tokens) == (11, MAX_MATCH, [11, 12, 13])


def test_a_copy_reaching_the_present_repeats_its_own_tokens():
    src = CopySource([5, 6, 7, 5, 6])  # staged 7: "5 6 7" seen at 0, followed by 5 6 (then the present)
    copy = src.propose(7, 7)
    assert copy.start == 3 and copy.tokens == [5, 6, 7, 5, 6, 7, 5]


def test_the_index_grows_as_tokens_commit():
    src = CopySource([1, 2])
    assert src.propose(3, 2) is None
    src.extend([3, 4, 1, 2])
    copy = src.propose(3, 2)
    assert (copy.start, copy.tokens) == (3, [4, 1])
    # each n-gram followed by a committed token is indexed once (its latest occurrence)
    assert len(src.index[2]) == len({tuple(src.context[i : i + 2]) for i in range(len(src.context) - 2)})


def _copied_cycle(copy, accepted: int) -> CycleEvent:
    fields = dict(staged_token=0, confidence=[], posterior=[], committed=[0], next_staged=0, kv_trimmed=0)
    fields |= dict(gdn_replayed=0, draft_ms=0.0, verify_ms=0.0, rollback_ms=0.0, t=0.0)
    return CycleEvent(
        cycle=0,
        block_size=len(copy.tokens) + 1,
        drafted=copy.tokens,
        verified=len(copy.tokens),
        accepted_len=accepted,
        copied_from=copy.start,
        copy_match=copy.match,
        **fields,
    )


def test_acceptance_per_match_length():
    """Two rates per match length: copies' first tokens, and the tokens after an accepted one."""
    src = CopySource([1, 2, 3, 4, 9, 1, 2, 3])
    copy = src.propose(4, 7)
    assert copy.match == 4
    first, later = src.p_accept(copy)
    assert first > src.p_accept(Copy([9], 0, 2))[0]  # a 4-token match starts more trusted than a bigram
    for _ in range(10):  # copies after 4-token matches keep failing at once
        src.observe(_copied_cycle(copy, accepted=0))
    assert src.p_accept(copy)[0] < first / 2 and src.p_accept(copy)[1] == later  # nothing told of later tokens
    for _ in range(10):  # ... and then start right, and fail at the third token
        src.observe(_copied_cycle(copy, accepted=2))
    now_first, now_later = src.p_accept(copy)
    assert now_first > first / 2 and now_later < later
    assert now_later == pytest.approx(
        (later * PRIOR_TRIALS + 10) / (PRIOR_TRIALS + 20)
    )  # 2 trials a copy past the first, 1 hit
    assert src.p_tokens(copy) == [now_first] + [now_later] * (len(copy.tokens) - 1)


def test_the_drafts_block_tempers_a_copys_chances():
    """Where copy and draft agree, the better of the two chances; at the first token where they
    differ, at most the chance that the draft is wrong there; past it, the copy's own rate."""
    src = CopySource([5, 6, 7, 8, 1, 2, 3, 4])
    copy = Copy([5, 6, 7, 8], 0, 4)
    first, later = src.p_accept(copy)
    assert (first, later) == pytest.approx((0.7, 0.85))
    p = src.p_tokens(copy, drafted=[5, 6, 9, 8], p_drafted=[0.95, 0.3, 0.9, 0.5])
    assert p == pytest.approx([0.95, later, 0.1, later])
    assert src.p_tokens(copy, drafted=[4], p_drafted=[0.6]) == pytest.approx([0.4, later, later, later])


def _policy(row_cost: float) -> Policy:
    """A plain step 0.1 s, each further row `row_cost` of one; a draft forward a tenth of a step."""
    verify_s = [0.1 * (1 + row_cost * r) for r in range(MAX_COPY + 1)]
    return Policy(8, CostModel(CostProfile(0.01, verify_s)), AcceptancePredictor(8))


def test_a_copy_verifies_as_many_tokens_as_pay_for_their_rows():
    """A copy may hold more tokens than the draft's block; the policy verifies those whose chance
    of acceptance earns more than plain decoding would in their rows' time."""
    assert MAX_COPY > 7
    assert _policy(0.1).copy_length([0.9] * MAX_COPY) == MAX_COPY  # 0.9 ** 15 > 0.1: past the block of 8
    assert _policy(0.1).copy_length([0.7] * MAX_COPY) == 6  # 0.7 ** 6 > 0.1 > 0.7 ** 7
    assert _policy(0.1).copy_length([0.9] * 4) == 4  # no more than the copy holds
    assert _policy(1.0).copy_length([0.9] * MAX_COPY) == 1  # a row as dear as a step: only the first
    assert _policy(0.1).copy_length([0.9, 0.05, 0.9, 0.9]) == 1  # a likely miss ends it


def test_a_copy_goes_alone_where_it_promises_more_than_drafting():
    rule = _policy(0.1)
    for _ in range(20):  # drafted cycles lately: 4 tokens for 1.8 steps each
        rule.rate.add(4, 0.18)
    sure, doubtful = [0.9] * MAX_COPY, [0.5] * MAX_COPY
    alone = rule.copy_alone(sure, "copy")
    assert alone.verified == MAX_COPY and not alone.plain_step
    assert alone.expected_tokens == pytest.approx(1 + sum(0.9**i for i in range(1, MAX_COPY + 1)))
    assert alone.predicted_steps == pytest.approx(1 + 0.1 * MAX_COPY)
    assert "no draft forward" in alone.reason and not alone.draft_forward
    assert rule.copy_alone(doubtful, "copy") is None  # 1.9 tokens for 1.3 steps: drafting does better
    # where drafting does not pay, the same copy beats plain steps' one token a step
    slow = _policy(0.1)
    for _ in range(20):
        slow.rate.add(1, 0.18)
    short = slow.copy_alone(doubtful, "copy")
    assert short.verified == 3 and "copy, the first 3 verified: expected" in short.reason
    assert ", the first" not in alone.reason  # the whole copy pays its rows


def test_a_copy_replaces_the_drafts_block_only_where_it_is_worth_more():
    rule = _policy(0.1)
    block = rule.after_draft([0.9] * 7)  # a confident block: about 3.8 tokens at v = 7 in the prior's bins
    src = CopySource([5, 6, 7, 8, 1, 2, 3, 4])
    copy = Copy([5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19], 0, 6)
    p_agree = src.p_tokens(copy, [5, 6, 7, 8, 9, 10, 11], rule.acceptance.p([0.9] * 7))
    instead = rule.copy_instead(p_agree, "copy", block)
    assert instead is not None and instead.verified > 7  # agrees with the block, and goes on past it
    assert instead.draft_forward  # the draft's forward was paid before the copy replaced its block
    assert instead.expected_tokens > block.expected_tokens
    p_differ = src.p_tokens(copy, [4, 6, 7, 8, 9, 10, 11], rule.acceptance.p([0.99] * 7))
    assert rule.copy_instead(p_differ, "copy", block) is None  # the draft is sure its first token is another


ATTENTION, GATED_DELTA_NET = "qwen3", "qwen3_5"


def repeating_prompts(pair) -> list:
    """Prompts that repeat themselves: an opening, the target's own continuation of it, and the
    opening again, so that the last tokens have occurred before and copies are proposed."""
    out = []
    for prompt in PROMPTS[:2]:
        opening = pair.encode(prompt, chat_template=False)
        _, base = run(pair.baseline(opening, 30))
        out.append(opening + base.tokens + opening)
    return out


@pytest.mark.parametrize("family", [ATTENTION, GATED_DELTA_NET])
@pytest.mark.parametrize("policy", ["adaptive", "fixed"])
def test_copied_proposals_are_lossless(random_pairs, family, policy):
    pair = random_pairs[family]
    copied = 0
    for ids in repeating_prompts(pair):
        _, base = run(pair.baseline(ids, 60))
        cycles, summary = run(pair.dflash(ids, 60, 8, policy=policy, min_confidence=0.0, copy=True))
        assert summary.tokens == base.tokens
        assert [t for ev in cycles for t in ev.committed] == summary.tokens
        done = len(ids)  # context tokens before the cycle's staged one
        for ev in cycles:
            assert ev.source in ("draft", "copy", "plain")
            if ev.source == "copy":
                copied += 1
                # the proposals are the context's tokens from the copy's start (repeating past the present)
                seen = (ids + summary.tokens)[:done] + [ev.staged_token]
                expect = []
                for j in range(ev.copied_from, ev.copied_from + len(ev.drafted)):
                    expect.append(seen[j] if j < len(seen) else expect[j - len(seen)])
                assert ev.drafted == expect and ev.copy_match >= 2
                assert ev.decision.reason.startswith("copy ")
            else:
                assert ev.copied_from is None and ev.copy_match == 0
            done += len(ev.committed)
        assert summary.copied_cycles == sum(ev.source == "copy" for ev in cycles)
        assert summary.tally.drafted_cycles + summary.copied_cycles + summary.plain_steps == summary.cycles
        stats = summary.stats()
        assert stats["copy"] is True and stats["copied_cycles"] == summary.copied_cycles
    assert copied > 0  # the copy source proposed in some cycles


@pytest.mark.parametrize("family", [ATTENTION, GATED_DELTA_NET])
def test_copies_longer_than_the_block_are_lossless(random_pairs, family, monkeypatch):
    """Every copy as long as it may be (the policy's choice forced to the longest): copies of up
    to MAX_COPY tokens after a block of 8, rolled back where they fail, output identical."""
    monkeypatch.setattr(Policy, "copy_length", lambda self, p: len(p))
    pair = random_pairs[family]
    copies = []
    for ids in repeating_prompts(pair):
        _, base = run(pair.baseline(ids, 60))
        cycles, summary = run(pair.dflash(ids, 60, 8, policy="adaptive", copy=True))
        assert summary.tokens == base.tokens
        copies += [ev for ev in cycles if ev.source == "copy"]
    longest = max(copies, key=lambda ev: ev.verified)
    assert longest.verified > 7
    # the inspector lays the long copy out over as many block positions as it has proposals
    from ui.render import inspector_html

    html = inspector_html(longest, lambda tok: f"t{tok}")
    assert all(f"<th>{k}</th>" in html for k in range(len(longest.drafted) + 1))


def test_without_copy_no_cycle_is_copied(random_pairs):
    pair = random_pairs[ATTENTION]
    ids = repeating_prompts(pair)[0]
    cycles, summary = run(pair.dflash(ids, 30, 8, policy="fixed", min_confidence=0.0))
    assert all(ev.copied_from is None for ev in cycles) and summary.copied_cycles == 0
    assert "copied_cycles" not in summary.stats()


def test_the_pane_colours_copied_proposals_and_the_inspector_says_where_from(random_pairs):
    from ui.render import cycle_spans, inspector_html

    pair = random_pairs[ATTENTION]
    ids = repeating_prompts(pair)[0]
    cycles, _ = run(pair.dflash(ids, 30, 8, policy="fixed", min_confidence=0.0, copy=True))
    copied = next(ev for ev in cycles if ev.source == "copy")
    drafted = next(ev for ev in cycles if ev.source == "draft")
    text = lambda tok: f"<{tok}>"  # noqa: E731  (escaped like any model text)
    html = cycle_spans(copied, [text(t) for t in copied.committed], text)
    assert "tok-copied" in html and "<" not in html.replace("<span", "").replace("</span", "")
    assert f"copied from context position {copied.copied_from}" in html
    assert "tok-copied" not in cycle_spans(drafted, [text(t) for t in drafted.committed], text)
    inspector = inspector_html(copied, text)
    assert "copied from the context" in inspector and f"position {copied.copied_from}" in inspector
    # a copy verified alone says that no draft ran (no MASK block); one that replaced the draft's
    # block shows the block the draft read
    alone = dataclasses.replace(copied, decision=dataclasses.replace(copied.decision, draft_forward=False))
    instead = dataclasses.replace(copied, decision=dataclasses.replace(copied.decision, draft_forward=True))
    assert "no draft forward</td>" in inspector_html(alone, text) and "MASK" not in inspector_html(alone, text)
    assert "MASK" in inspector_html(instead, text) and "no draft forward</td>" not in inspector_html(instead, text)
