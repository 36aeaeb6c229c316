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
PRIOR_TRIALS = 4  # a prior rate weighs as this many copies (or later tokens): a run soon outweighs it
# A copy is right at once or wrong at once more often than one chance per token says: in chat
# replies most copies fail at their first token while those that start right run on (on the chat
# benchmark, 63-80% per token pooled, yet a copy verified alone committed 1.4-1.7 tokens on the
# requests it slowed). So each match length keeps two rates: its copies' first tokens, and the
# tokens after an accepted one.
PRIOR_NEXT = 0.85


def _prior_first(n: int) -> float:
    """The chance, before any is observed, that the first token copied after an n-token match is
    accepted: a bigram often recurs by chance, six tokens rarely do. Measured over every output
    position of the default pair's greedy replies to the chat benchmark (first token; after an
    accepted one) and the context-reuse set: n = 2: 0.49, 0.43 (0.71, 0.87); 3: 0.55, 0.76 (0.76,
    0.88); 4: 0.57, 0.96 (0.84, 0.86); 5: 0.78, 0.65 (0.88, 0.91); 6: 0.92, 0.90 (0.96, 0.93)."""
    return {2: 0.45, 3: 0.6, 4: 0.7, 5: 0.7}.get(n, 0.9)


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
        # per match length: [hits, trials] of copies' first tokens, and of the tokens after an accepted one
        self.acceptance = {
            n: ([_prior_first(n) * PRIOR_TRIALS, PRIOR_TRIALS], [PRIOR_NEXT * PRIOR_TRIALS, PRIOR_TRIALS])
            for n in self.index
        }
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

    def p_accept(self, copy: Copy) -> tuple:
        """(first token's chance, a later token's chance given the one before it was accepted)."""
        return tuple(hits / trials for hits, trials in self.acceptance[copy.match])

    def p_tokens(self, copy: Copy, drafted: list | None = None, p_drafted: list | None = None) -> list:
        """Each copied token's chance of acceptance given those before it were: its match length's
        rates, and where the draft's proposals and their chances are known, theirs too up to the
        first position where copy and draft differ: a token both propose is accepted at least as
        often as either says, and where they differ the copy is right only where the draft is
        wrong. (Past that position the draft's later proposals follow its own, rejected, tokens.)
        A copy whose first token the draft is sure it knows otherwise is then not worth a row."""
        first, later = self.p_accept(copy)
        p = [first] + [later] * (len(copy.tokens) - 1)
        for i, (mine, theirs, p_theirs) in enumerate(zip(copy.tokens, drafted or [], p_drafted or [])):
            if mine != theirs:
                p[i] = min(p[i], 1 - p_theirs)
                break
            p[i] = max(p[i], p_theirs)
        return p

    def reason(self, copy: Copy) -> str:
        first, later = self.p_accept(copy)
        return (
            f"copy {len(copy.tokens)} tokens from context position {copy.start} (after a {copy.match}-token "
            f"match: {first:.0%} of such copies' first tokens accepted, {later:.0%} of the tokens after)"
        )

    def observe(self, ev: CycleEvent):
        """A cycle that verified a copy: its first token is one trial of its match length's first
        rate; each later token checked (up to and including the first rejection) one of its later rate."""
        first, later = self.acceptance[ev.copy_match]
        first[0] += ev.accepted_len > 0
        first[1] += 1
        later[0] += max(ev.accepted_len - 1, 0)
        later[1] += max(min(ev.accepted_len + 1, ev.verified) - 1, 0)
