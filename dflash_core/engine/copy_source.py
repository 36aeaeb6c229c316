"""Proposals copied from the context (prompt lookup): where the last few tokens occurred before in
prompt + output, the tokens that followed them there are proposed, at no model cost.

An index of the n-grams (n = MIN_MATCH .. MAX_MATCH) of prompt + committed tokens maps each to the
position after its latest occurrence; it grows as tokens commit, so a lookup is MAX_MATCH - MIN_MATCH
+ 1 dictionary reads whatever the context length. The longest n whose last n tokens (the staged
token included) occurred before wins. Each match length keeps its own acceptance statistics; where
the draft's block has been read, the draft's own proposals and their chances temper a copy's (the
two agree where both are likely right, and where they differ at most one is). The policy decides
whether a copy goes to the target instead of the draft's block, or alone without a draft forward
(dflash_core.engine.policy)."""

from dataclasses import dataclass

from .events import CycleEvent

MIN_MATCH, MAX_MATCH = 2, 6
# the most tokens one copy proposes, past the draft's block where it is shorter: a copy that is
# right is often right for a whole line, and the cost model decides how many of them to verify
MAX_COPY = 15
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

    def p_tokens(self, copy: Copy, drafted: list | None = None, p_drafted: list | None = None) -> list:
        """Each copied token's chance of acceptance given those before it were: its match length's
        rate, and where the draft's proposals and their chances are known, theirs too up to the
        first position where copy and draft differ: a token both propose is accepted at least as
        often as either says, and where they differ the copy is right only where the draft is
        wrong. (Past that position the draft's later proposals follow its own, rejected, tokens.)
        A copy whose first token the draft is sure it knows otherwise is then not worth a row."""
        rate = self.p_accept(copy)
        p = [rate] * len(copy.tokens)
        for i, (mine, theirs, p_theirs) in enumerate(zip(copy.tokens, drafted or [], p_drafted or [])):
            if mine != theirs:
                p[i] = min(rate, 1 - p_theirs)
                break
            p[i] = max(rate, p_theirs)
        return p

    def reason(self, copy: Copy) -> str:
        return (
            f"copy {len(copy.tokens)} tokens from context position {copy.start} (after a {copy.match}-token "
            f"match, {self.p_accept(copy):.0%} of such copied tokens accepted)"
        )

    def observe(self, ev: CycleEvent):
        """A cycle that verified a copy: each copied token up to and including the first rejection
        is one trial of its match length."""
        row = self.acceptance[ev.copy_match]
        row[0] += ev.accepted_len
        row[1] += min(ev.accepted_len + 1, ev.verified)
