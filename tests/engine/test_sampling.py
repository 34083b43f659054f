"""Rejection sampling keeps the target's distribution (Leviathan et al. 2023).

The test: V = 6 tokens, k = 2 drafts, fixed target rows p0, p1 and draft rows q0, q1
that differ from them on purpose. N = 30,000 seeded trials of draft-then-verify. The
first committed token must follow p0 and, when a second token is committed, it must
follow p1. Each is a chi-square goodness-of-fit test at alpha = 0.001. Power, from the
noncentral chi-square and asserted by the tests: > 0.99 against any deviation of
Cohen's w >= 0.05 at the first position (e.g. 2.5% of the mass moved between two
tokens) and w >= 0.08 at the second, which fewer trials reach. A negative control
(committing drafts without the correction) must be rejected.
"""

from __future__ import annotations

import torch
from scipy import stats

from spectune.engine.sampling import accept_greedy, accept_sampled

N = 30_000
ALPHA = 0.001
P = torch.tensor(
    [
        [0.30, 0.25, 0.20, 0.10, 0.10, 0.05],
        [0.05, 0.10, 0.15, 0.20, 0.20, 0.30],
        [0.50, 0.10, 0.10, 0.10, 0.10, 0.10],
    ]
)
Q = torch.tensor([[0.10, 0.10, 0.40, 0.20, 0.10, 0.10], [0.40, 0.20, 0.10, 0.10, 0.10, 0.10]])


def _power(n: int, w: float, df: int = 5) -> float:
    crit = stats.chi2.ppf(1 - ALPHA, df)
    return float(1 - stats.ncx2.cdf(crit, df, n * w**2))


def _pvalue(tokens: list[int], p: torch.Tensor) -> float:
    observed = torch.bincount(torch.tensor(tokens), minlength=p.numel()).double()
    expected = p.double() / p.double().sum() * observed.sum()
    return float(stats.chisquare(observed.numpy(), expected.numpy()).pvalue)


def _trials(q: torch.Tensor | None, correct: bool = True) -> tuple[list[int], list[int]]:
    gen = torch.Generator().manual_seed(1234)
    first, second = [], []
    for _ in range(N):
        if q is None:
            drafts = [0, 5]  # a deterministic proposal, as n-gram lookup makes
        else:
            drafts = [int(torch.multinomial(q[i], 1, generator=gen)) for i in range(2)]
        if correct:
            out, _ = accept_sampled(P, q, drafts, gen)
        else:
            out = drafts  # negative control: commit drafts blindly
        first.append(out[0])
        if len(out) > 1:
            second.append(out[1])
    return first, second


def test_model_draft_commits_the_target_distribution() -> None:
    first, second = _trials(Q)
    assert _power(len(first), 0.05) > 0.99 and _power(len(second), 0.08) > 0.99
    assert _pvalue(first, P[0]) > ALPHA
    assert _pvalue(second, P[1]) > ALPHA


def test_deterministic_draft_commits_the_target_distribution() -> None:
    first, second = _trials(None)
    assert _power(len(first), 0.05) > 0.99 and _power(len(second), 0.08) > 0.99
    assert _pvalue(first, P[0]) > ALPHA
    assert _pvalue(second, P[1]) > ALPHA


def test_the_statistical_test_rejects_uncorrected_drafts() -> None:
    first, _ = _trials(Q, correct=False)
    assert _pvalue(first, P[0]) < ALPHA


def test_greedy_acceptance_keeps_the_matching_prefix_and_the_targets_next_token() -> None:
    assert accept_greedy([5, 6, 7, 8], [5, 6, 7]) == ([5, 6, 7, 8], 3)
    assert accept_greedy([5, 9, 7, 8], [5, 6, 7]) == ([5, 9], 1)
    assert accept_greedy([4, 6, 7, 8], [5, 6, 7]) == ([4], 0)
    assert accept_greedy([4], []) == ([4], 0)
