"""Speculative sampling over a DFlash block (Leviathan et al. 2023; Chen et al. 2023).

The draft samples each proposal d_k from its own distribution q_k; the target's verify forward
gives p_k. In order, d_k is kept with probability min(1, p_k(d_k) / q_k(d_k)); at the first
rejection the next token is drawn from the residual normalize(max(0, p_k - q_k)), and when every
proposal is kept it is drawn from p after the block. Each emitted token is then distributed
exactly as the target alone would sample it. A DFlash draft samples its positions in parallel, so
q_k does not depend on d_(k-1); the argument holds position by position all the same, because d_k
is independent of the earlier draws that were accepted.
"""

from dataclasses import dataclass

import mlx.core as mx
from mlx_lm.sample_utils import apply_top_p, make_sampler


@dataclass(frozen=True)
class Sampling:
    temperature: float  # > 0 (temperature 0 is the greedy path, not this one)
    top_p: float = 1.0
    seed: int | None = None  # None: MLX's global random state as it stands

    def probabilities(self, logits: mx.array) -> mx.array:
        """(n, V) logits -> (n, V) probabilities, filtered exactly as mlx-lm's sampler filters
        them (top-p on the untempered distribution, then the temperature), so that plain sampling
        through mlx-lm and DFlash sample from one distribution."""
        logprobs = logits.astype(mx.float32) - mx.logsumexp(logits.astype(mx.float32), axis=-1, keepdims=True)
        if 0 < self.top_p < 1:
            logprobs = apply_top_p(logprobs, self.top_p)
        return mx.softmax(logprobs / self.temperature, axis=-1)

    def sampler(self):
        """The same distribution as an mlx-lm sampler, for plain sampling (the baseline)."""
        return make_sampler(self.temperature, self.top_p if self.top_p < 1 else 0.0)

    def seed_draws(self):
        if self.seed is not None:
            mx.random.seed(self.seed)


@dataclass
class Draws:
    """What decided one cycle's acceptance, per examined proposal (for the page and the tests)."""

    p: list  # target probability of each proposal, p_k(d_k)
    q: list  # draft probability of each proposal, q_k(d_k)
    u: list  # the uniform draw: d_k kept when u * q_k(d_k) < p_k(d_k)


def sample(probs: mx.array) -> int:
    return mx.random.categorical(mx.log(probs)).item()


def point_mass(tokens: list, vocab: int) -> mx.array:
    """The distributions of a deterministic draft: all mass on each proposal."""
    return (mx.arange(vocab)[None] == mx.array(tokens)[:, None]).astype(mx.float32)


def residual(p: mx.array, q: mx.array) -> mx.array:
    """normalize(max(0, p - q)): where the target has more mass than the draft gave."""
    extra = mx.maximum(p - q, 0.0)
    total = extra.sum()
    # a rejection needs p(d) < q(d), so some mass is left; rounding can still leave none
    return mx.where(total > 0, extra / mx.maximum(total, 1e-30), p)


def speculative_accept(drafted: list, q: mx.array, p: mx.array) -> tuple:
    """drafted: n proposals, q: (n, V) the distributions they were drawn from, p: (n + 1, V) the
    target's. Returns (accepted_len, next_token, Draws)."""
    n = len(drafted)
    if n == 0:  # a plain step: the next token is drawn from p, as plain sampling draws it
        return 0, sample(p[0]), Draws([], [], [])
    rows, picked = mx.arange(n), mx.array(drafted)
    p_d, q_d, u = p[rows, picked], q[rows, picked], mx.random.uniform(shape=(n,))
    mx.eval(p_d, q_d, u)
    p_d, q_d, u = p_d.tolist(), q_d.tolist(), u.tolist()
    a = 0
    while a < n and u[a] * q_d[a] < p_d[a]:
        a += 1
    next_token = sample(residual(p[a], q[a]) if a < n else p[n])
    examined = min(a + 1, n)
    return a, next_token, Draws(p_d[:examined], q_d[:examined], u[:examined])
