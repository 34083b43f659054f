"""Token choice: greedy, temperature sampling, and speculative acceptance.

Acceptance follows Leviathan et al. (2023): a drafted token d with draft probability
q(d) is kept with probability min(1, p(d)/q(d)); at the first rejection the next token
is drawn from norm(max(0, p - q)); when all k pass, a bonus token comes from p. The
committed tokens are then distributed exactly as the target's. A deterministic
proposal (n-gram lookup) is the case q = one-hot(d).
"""

from __future__ import annotations

import torch
from torch import Tensor


def probabilities(logits: Tensor, temperature: float) -> Tensor:
    return torch.softmax(logits / temperature, dim=-1)


def draw(probs: Tensor, generator: torch.Generator | None) -> int:
    return int(torch.multinomial(probs, 1, generator=generator).item())


def choose_tokens(
    logits: Tensor, temperatures: list[float], generators: list[torch.Generator | None]
) -> tuple[list[int], list[Tensor | None]]:
    """One token per row of logits [B, V]: argmax at temperature 0, else a draw.

    Returns the tokens and, for sampled rows, the distribution they were drawn from.
    """
    greedy = logits.argmax(-1).tolist()
    tokens: list[int] = []
    dists: list[Tensor | None] = []
    for row, (t, g) in enumerate(zip(temperatures, generators, strict=True)):
        if t == 0:
            tokens.append(greedy[row])
            dists.append(None)
        else:
            p = probabilities(logits[row], t)
            tokens.append(draw(p, g))
            dists.append(p)
    return tokens, dists


def accept_greedy(target_choice: list[int], drafts: list[int]) -> tuple[list[int], int]:
    """Target's argmax at k+1 positions vs k drafts → (committed tokens, accepted count)."""
    accepted = 0
    while accepted < len(drafts) and drafts[accepted] == target_choice[accepted]:
        accepted += 1
    return [*drafts[:accepted], target_choice[accepted]], accepted


def accept_sampled(
    p: Tensor, q: Tensor | None, drafts: list[int], generator: torch.Generator | None
) -> tuple[list[int], int]:
    """p: [k+1, V] target probabilities; q: [k, V] draft probabilities, or None for a
    deterministic proposal. Returns (committed tokens, accepted count)."""
    k = len(drafts)
    d = torch.tensor(drafts, dtype=torch.long, device=p.device)
    p_d = p[:k].gather(1, d[:, None]).squeeze(1)
    q_d = torch.ones_like(p_d) if q is None else q.gather(1, d[:, None]).squeeze(1)
    u = torch.rand(k, generator=generator, device=p.device)
    rejected = (u * q_d > p_d).tolist()  # u < p/q, without dividing by a zero q
    accepted = rejected.index(True) if True in rejected else k
    if accepted == k:
        return [*drafts, draw(p[k], generator)], k
    residual = p[accepted].clone()
    if q is None:
        residual[drafts[accepted]] = 0.0
    else:
        residual = (residual - q[accepted]).clamp_(min=0.0)
    total = residual.sum()
    # p == q at this position would make rejection impossible; guard against rounding.
    residual = residual / total if total > 0 else p[accepted]
    return [*drafts[:accepted], draw(residual, generator)], accepted
