"""Speculative sampling keeps the target's distribution exactly (chi-square tests that a wrong
variant fails), is seeded, and leaves the greedy path alone."""

from dataclasses import replace

import mlx.core as mx
import numpy as np
import pytest
from cli_run import dflash_cli

from dflash_core.engine import OracleDraft
from dflash_core.engine import sampling as sampling_module
from dflash_core.engine.sampling import Sampling, speculative_accept

# chi-square critical values at p = 0.001 (a correct sampler fails 1 run in 1,000)
CHI2_999 = {
    1: 10.83,
    2: 13.82,
    3: 16.27,
    4: 18.47,
    5: 20.52,
    6: 22.46,
    7: 24.32,
    8: 26.12,
    9: 27.88,
    10: 29.59,
    11: 31.26,
    12: 32.91,
    13: 34.53,
    14: 36.12,
    15: 37.70,
    16: 39.25,
    17: 40.79,
    18: 42.31,
    19: 43.82,
    20: 45.31,
    21: 46.80,
    22: 48.27,
    23: 49.73,
    24: 51.18,
    25: 52.62,
    26: 54.05,
    27: 55.48,
    28: 56.89,
    29: 58.30,
    30: 59.70,
}


def chi_square(counts: dict, expected: dict, n: int) -> tuple:
    """(statistic, degrees of freedom), cells expecting fewer than 5 pooled into one."""
    small = {k for k, p in expected.items() if p * n < 5}
    cells = [(counts.get(k, 0), p * n) for k, p in expected.items() if k not in small]
    if small:
        cells.append((sum(c for k, c in counts.items() if k in small), sum(expected[k] for k in small) * n))
    unexpected = sum(c for k, c in counts.items() if k not in expected)
    assert unexpected == 0, f"{unexpected} samples the target could never give"
    return sum((o - e) ** 2 / e for o, e in cells), len(cells) - 1


# --- the acceptance rule on a small Markov "target" ---------------------------------------------

V, N_PROPOSALS, TRIALS = 5, 3, 12_000


def markov_setup(seed: int):
    """A target p(next | last) as a row-stochastic table, and a draft that is partly right: for
    block position k it proposes from a mix of the target's true k-step-ahead distribution and
    noise (drawn in parallel, as a DFlash draft does, never conditioned on its own draws)."""
    rng = np.random.default_rng(seed)
    P = rng.dirichlet(np.full(V, 0.6), size=V)
    steps = [np.linalg.matrix_power(P, k + 1) for k in range(N_PROPOSALS)]
    noise = rng.dirichlet(np.ones(V), size=(N_PROPOSALS, V))
    Q = np.stack([0.6 * steps[k] + 0.4 * noise[k] for k in range(N_PROPOSALS)])  # Q[k][staged]
    return P, Q


def first_two_tokens(P, Q, staged: int) -> tuple:
    """Cycles of draft -> verify -> speculative_accept after `staged` until two tokens follow it."""
    out = []
    while len(out) < 2:
        q = mx.array(Q[:, staged].astype(np.float32))
        drafted = [mx.random.categorical(mx.log(q[k])).item() for k in range(N_PROPOSALS)]
        p = mx.array(P[[staged] + drafted].astype(np.float32))  # the verify rows: p(. | prefix)
        a, staged, _ = speculative_accept(drafted, q, p)
        out += drafted[:a] + [staged]
    return tuple(out[:2])


def markov_statistic(seed: int) -> float:
    P, Q = markov_setup(seed)
    mx.random.seed(seed)
    counts = {}
    for _ in range(TRIALS):
        key = first_two_tokens(P, Q, staged=0)
        counts[key] = counts.get(key, 0) + 1
    expected = {(x, y): P[0, x] * P[x, y] for x in range(V) for y in range(V)}
    stat, dof = chi_square(counts, expected, TRIALS)
    return stat / CHI2_999[dof]


@pytest.mark.slow
def test_accepted_tokens_have_the_targets_distribution():
    assert markov_statistic(seed=3) < 1.0


@pytest.mark.slow
def test_the_test_catches_a_wrong_resample(monkeypatch):
    """Power: resampling a rejected position from p instead of the residual over-weights what the
    draft proposed; the same test must reject it."""
    monkeypatch.setattr(sampling_module, "residual", lambda p, q: p)
    assert markov_statistic(seed=3) > 1.0


def test_accept_keeps_a_proposal_the_target_likes_more_than_the_draft():
    p = mx.array([[0.1, 0.9], [0.5, 0.5]])
    q = mx.array([[0.5, 0.5]])
    mx.random.seed(0)
    for _ in range(50):  # p(d) >= q(d): always kept, whatever the draw
        a, _, draws = speculative_accept([1], q, p)
        assert a == 1 and draws.p == pytest.approx([0.9]) and draws.q == pytest.approx([0.5])


# --- through the engine, on a small random pair ---------------------------------------------------


@pytest.fixture()
def sharp_pair(random_pairs):
    """A random llama pair whose output head is scaled up, so its distributions are peaked enough
    for a test of a few thousand runs (restored after the test)."""
    pair = random_pairs["llama"]
    head = pair.model.lm_head
    saved = head.weight
    head.weight = saved * 15.0
    yield pair
    head.weight = saved


def target_two_tokens(pair, ids, s: Sampling) -> dict:
    """The target's own distribution of the first two sampled tokens, exactly."""
    first = s.probabilities(pair.model(mx.array(ids)[None])[0, -1]).tolist()
    out = {}
    for x, px in enumerate(first):
        if px > 0:
            second = s.probabilities(pair.model(mx.array(ids + [x])[None])[0, -1]).tolist()
            out.update({(x, y): px * py for y, py in enumerate(second) if py > 0})
    return out


@pytest.mark.slow
@pytest.mark.parametrize(
    "temperature,top_p,draft",
    [
        (1.0, 1.0, "greedy-continuation"),
        (0.7, 0.9, "greedy-continuation"),
        (1.0, 1.0, "model"),
        (1.0, 1.0, "model-with-vocabulary"),  # q is zero outside the draft's vocabulary
    ],
)
def test_dflash_sampling_has_the_targets_distribution(sharp_pair, temperature, top_p, draft, monkeypatch):
    pair = sharp_pair
    if draft == "model-with-vocabulary":
        vocab = tuple(range(1, pair.draft.config.vocab_size, 2))
        monkeypatch.setattr(pair.draft, "config", replace(pair.draft.config, draft_vocab=vocab))
    ids = pair.encode("def fib(n):", chat_template=False)
    s = Sampling(temperature, top_p)
    expected = target_two_tokens(pair, ids, s)
    base = list(pair.baseline(ids, 12))[-1]
    # a deterministic draft that is partly right: the target's greedy continuation
    draft_fn = OracleDraft(len(ids), base.tokens) if draft == "greedy-continuation" else None
    runs, counts, accepted = 500, {}, 0
    mx.random.seed(7)
    for _ in range(runs):
        *cycles, summary = pair.dflash(ids, 3, 4, draft_fn=draft_fn, min_confidence=0, sampling=s)
        key = tuple(summary.tokens[:2])
        counts[key] = counts.get(key, 0) + 1
        accepted += summary.accepted_tokens
    stat, dof = chi_square(counts, expected, runs)
    assert stat < CHI2_999[dof], (stat, dof)
    if draft_fn is not None:  # the random draft model's own proposals are (nearly) never kept
        assert accepted > 0  # the draft's proposals were kept, not only resampled


def test_same_seed_same_tokens_another_seed_other_tokens(random_pairs):
    pair = random_pairs["qwen3"]
    ids = pair.encode("import os", chat_template=False)

    def run(seed):
        *cycles, summary = pair.dflash(ids, 24, sampling=Sampling(1.0, 1.0, seed))
        assert all(c.draws is not None and len(c.draws.u) == min(c.accepted_len + 1, c.verified) for c in cycles)
        return summary.tokens

    assert run(3) == run(3)
    assert run(3) != run(4)
    plain = list(pair.baseline(ids, 24, sampling=Sampling(1.0, 1.0, 3)))[-1]
    assert plain.engine == "sampling" and plain.stats()["seed"] == 3
    assert plain.tokens == list(pair.baseline(ids, 24, sampling=Sampling(1.0, 1.0, 3)))[-1].tokens


def test_probabilities_are_mlx_lms_sampler(random_pairs):
    """The baseline samples through mlx-lm's own sampler; DFlash through Sampling.probabilities:
    the same distribution (chi-square on the first token)."""
    pair = random_pairs["llama"]
    s = Sampling(0.7, 0.9)
    logits = pair.model(mx.array(pair.encode("x = 1", chat_template=False))[None])[0, -1] * 6.0
    probs = s.probabilities(logits).tolist()
    sampler = s.sampler()
    logprobs = (logits - mx.logsumexp(logits))[None]
    mx.random.seed(1)
    n, counts = 4000, {}
    for _ in range(n):
        tok = sampler(logprobs).item()
        counts[tok] = counts.get(tok, 0) + 1
    stat, dof = chi_square(counts, {t: p for t, p in enumerate(probs) if p > 0}, n)
    assert stat < CHI2_999[dof], (stat, dof)


# --- the command line ----------------------------------------------------------------------------


@pytest.mark.slow
def test_generate_with_a_seed_is_repeatable_and_reports_acceptance(random_dirs):
    import json

    t, d = random_dirs["llama"]

    def generate(seed):
        out = dflash_cli(
            "generate",
            *("--model", t, "--draft", d, "--prompt", "def fib(n):", "--max-tokens", 24),
            *("--temperature", 0.8, "--seed", seed, "--json", "--compare-baseline"),
        )
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    first, again, other = generate(3), generate(3), generate(4)
    assert first["tokens"] == again["tokens"] and first["tokens"] != other["tokens"]
    stats = first["stats"]
    assert stats["temperature"] == 0.8 and stats["seed"] == 3 and stats["cycles"] >= 1
    assert "accepted_tokens" in stats and "identical" not in first  # no token-for-token verdict when sampling
    assert len(first["baseline"]["tokens"]) == 24
