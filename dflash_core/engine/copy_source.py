"""Proposals copied from the context (prompt lookup): where the last few tokens occurred before in
prompt + output, the tokens that followed them there are proposed, at no model cost.

An index of the n-grams (n = MIN_MATCH .. MAX_MATCH) of prompt + committed tokens maps each to the
position after its latest occurrence; it grows as tokens commit, so a lookup is MAX_MATCH - MIN_MATCH
+ 1 dictionary reads whatever the context length. The longest n whose last n tokens (the staged
token included) occurred before wins. Each match length keeps its own acceptance statistics: a
copy goes to the target instead of the draft's block where it is expected to be accepted for at
least as many tokens (dflash_core.engine)."""

from dataclasses import dataclass

from .events import CycleEvent, Decision

MIN_MATCH, MAX_MATCH = 2, 6
# the most tokens one copy proposes, past the draft's block where it is shorter: a copy that is
# right is often right for a whole line, and the cost model decides how many of them to verify
MAX_COPY = 15
# a copy this many accepted tokens long (expected) is verified without a draft forward
LONG_COPY = 2.0
PRIOR_TRIALS = 8  # the prior acceptance weighs as this many copied tokens: a run soon outweighs it


def _prior_rate(n: int) -> float:
    """The chance, before any is observed, that a copied token after an n-token match is accepted
    given those before it were: a bigram often recurs by chance, six tokens rarely do."""
    return 0.5 if n == MIN_MATCH else 0.7 if n == 3 else 0.8


@dataclass
class Copy:
    """A copy's proposals: `tokens[i]` is the token at context position `start + i` (the context
    being prompt + output), which followed an earlier occurrence of the last `match` tokens."""

    tokens: list
    start: int
    match: int

    def first(self, n: int) -> "Copy":
        return Copy(self.tokens[:n], self.start, self.match)


class CopySource:
    """The n-gram index over one run's prompt + committed tokens, and the copies' acceptance."""

    def __init__(self, context: list):
        self.context: list = []
        self.index = {n: {} for n in range(MIN_MATCH, MAX_MATCH + 1)}  # n-gram -> position after it
        self.acceptance = {n: [_prior_rate(n) * PRIOR_TRIALS, float(PRIOR_TRIALS)] for n in self.index}
        self.extend(context)

    def extend(self, tokens: list):
        """Committed tokens: each indexes the n-grams it follows."""
        for tok in tokens:
            end = len(self.context)  # the new token's position: the n-grams ending before it point here
            for n, grams in self.index.items():
                if end >= n:
                    grams[tuple(self.context[end - n : end])] = end
            self.context.append(tok)

    def propose(self, staged: int, k: int) -> Copy | None:
        """Up to `k` tokens copied after the latest earlier occurrence of the longest suffix of
        context + [staged] found, or None. A copy that reaches the present continues with its own
        tokens (a repeating span repeats on), so it holds k tokens."""
        for n in range(MAX_MATCH, MIN_MATCH - 1, -1):
            if len(self.context) < n - 1:
                continue
            start = self.index[n].get((*self.context[len(self.context) - (n - 1) :], staged))
            if start is not None:
                seen = self.context + [staged]
                out = []
                for j in range(start, start + k):
                    out.append(seen[j] if j < len(seen) else out[j - len(seen)])
                return Copy(out, start, n)
        return None

    def p_accept(self, copy: Copy) -> float:
        hits, trials = self.acceptance[copy.match]
        return hits / trials

    def expected_accepted(self, copy: Copy, verified: int) -> float:
        """Copied tokens expected to be accepted when the first `verified` are checked."""
        p = self.p_accept(copy)
        return sum(p**i for i in range(1, verified + 1))

    def is_long(self, copy: Copy) -> bool:
        """Worth verifying without a draft forward: expected accepted for LONG_COPY tokens or more."""
        return self.expected_accepted(copy, len(copy.tokens)) >= LONG_COPY

    def replaces(self, copy: Copy, draft_decision: Decision | None) -> tuple | None:
        """(expected committed tokens, the reason) where the copy goes to the target instead of
        the draft's block: a long copy (`draft_decision` None: no draft forward was run), or one
        expected to commit at least as many tokens as the draft's block; else None."""
        v = len(copy.tokens)
        expected = 1 + self.expected_accepted(copy, v)
        why = (
            f"copy {v} tokens from context position {copy.start} (after a {copy.match}-token match, "
            f"{self.p_accept(copy):.0%} of such copied tokens accepted): expected {expected:.1f} tokens"
        )
        if draft_decision is None:
            return expected, f"{why}, no draft forward"
        if expected < draft_decision.expected_tokens:
            return None
        return expected, f"{why}, the draft's block {draft_decision.expected_tokens:.1f}"

    def observe(self, ev: CycleEvent):
        """A cycle that verified a copy: each copied token up to and including the first rejection
        is one trial of its match length."""
        row = self.acceptance[ev.copy_match]
        row[0] += ev.accepted_len
        row[1] += min(ev.accepted_len + 1, ev.verified)
