"""Drafters propose up to k tokens per sequence for the target to verify in one forward.

`ModelDrafter` runs a small draft model over the same block tables as the target (its
KV is a second cache indexed by the same block ids). Its cache lags after a prefill and
while speculation is off, so a gated-off iteration never touches the draft; the first spec
iteration after that catches up in a forward of its own, which says how much of what it
read speculation owes (the draft's prefill) and how much plain iterations left it.

`NgramDrafter` copies what followed the latest earlier occurrence of the sequence's last
n tokens (prompt lookup): no model, no KV.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from numpy.lib.stride_tricks import sliding_window_view
from torch import Tensor

from spectune.engine.model_runner import Feed, ModelRunner
from spectune.engine.sampling import choose_tokens
from spectune.engine.sequence import Sequence


@dataclass
class Draft:
    tokens: list[int]
    probs: Tensor | None  # [len(tokens), V] when sampled from a draft model; None: deterministic


def prompt_lookup(tokens: list[int], k: int, min_n: int, max_n: int) -> list[int]:
    """Up to k tokens that followed the most recent earlier match of the last n tokens,
    trying the longest n first."""
    arr = np.asarray(tokens)
    for n in range(min(max_n, len(arr) - 1), min_n - 1, -1):
        windows = sliding_window_view(arr[:-1], n)  # starts 0..L-n-1: a token follows each
        hits = np.flatnonzero((windows == arr[-n:]).all(axis=1))
        if hits.size:
            start = int(hits[-1]) + n
            return arr[start : start + k].tolist()
    return []


class NgramDrafter:
    def __init__(self, min_n: int, max_n: int) -> None:
        self.min_n, self.max_n = min_n, max_n

    def propose(self, seqs: list[Sequence], ks: list[int]) -> list[Draft]:
        return [
            Draft(prompt_lookup(s.token_ids, k, self.min_n, self.max_n) if k else [], None)
            for s, k in zip(seqs, ks, strict=True)
        ]


# In steady speculation the draft has seen all but the newest one or two committed tokens
# (the newest is fed with the first draft token; an accepted k-th draft never was).
STEADY_LAG = 2


@dataclass(frozen=True)
class CatchUp:
    """What one catch-up forward read: `owed` tokens speculation would have had to read
    anyway (the draft's prefill of what the target prefilled, and what a paused sequence
    skipped), `missed` tokens only because plain iterations committed them.

    The forward's measured time is split between them by token count rather than by running
    two forwards: one forward keeps the draft's computation (its KV, hence its drafts)
    exactly as it was, and a second would add a fixed cost (launches, a pass over the
    weights) that exists only to be measured. Missed tokens sit at later positions and so
    attend to a little more context each: the split charges the owed share slightly high.
    """

    owed: int = 0
    missed: int = 0

    @property
    def fed(self) -> int:
        return self.owed + self.missed

    def split(self, seconds: float) -> tuple[float, float]:
        """(owed, missed) shares of the forward's `seconds`."""
        if not self.fed:
            return 0.0, 0.0
        return seconds * self.owed / self.fed, seconds * self.missed / self.fed


def _owed(seq: Sequence) -> int:
    """Of the tokens a catch-up feeds `seq`, those it would feed had no plain iteration run:
    with them uncommitted the lag is shorter by `plain_unread`, and within the steady lag
    the first drafting forward reads it at no forward of its own."""
    without = len(seq) - 1 - seq.draft_cached - seq.plain_unread
    return without if without >= STEADY_LAG else 0


class ModelDrafter:
    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner

    def catch_up(self, seqs: list[Sequence]) -> CatchUp:
        """Feed the draft every committed token it missed beyond the steady-state lag, in one
        forward, leaving the newest token for the first drafting forward. Nothing fed: none
        missed."""
        behind = [s for s in seqs if len(s) - s.draft_cached > STEADY_LAG]
        if not behind:
            return CatchUp()
        self.runner.forward(
            [Feed(s.token_ids[s.draft_cached : -1], s.draft_cached, s.block_table) for s in behind],
            all_logits=False,
        )
        fed = sum(len(s) - 1 - s.draft_cached for s in behind)
        owed = sum(_owed(s) for s in behind)
        for s in behind:
            s.draft_cached = len(s) - 1
        return CatchUp(owed, fed - owed)

    def propose(self, seqs: list[Sequence], ks: list[int]) -> list[Draft]:
        drafts = [Draft([], None) for _ in seqs]
        active = [i for i, k in enumerate(ks) if k > 0]
        probs: dict[int, list[Tensor]] = {i: [] for i in active}
        # First forward: the committed tokens the draft has not seen (one or two after
        # catch_up), then one forward per drafted token.
        feeds = [
            Feed(
                seqs[i].token_ids[seqs[i].draft_cached :], seqs[i].draft_cached, seqs[i].block_table
            )
            for i in active
        ]
        for i in active:
            seqs[i].draft_cached = len(seqs[i])
            seqs[i].plain_unread = 0
        while active:
            logits = self.runner.forward(feeds, all_logits=False)[:, 0]
            batch = [seqs[i] for i in active]
            tokens, dists = choose_tokens(
                logits, [s.params.temperature for s in batch], [s.generator for s in batch]
            )
            for i, t, p in zip(active, tokens, dists, strict=True):
                drafts[i].tokens.append(t)
                if p is not None:
                    probs[i].append(p)
            active = [i for i in active if len(drafts[i].tokens) < ks[i]]
            feeds = []
            for i in active:
                s = seqs[i]
                feeds.append(Feed([drafts[i].tokens[-1]], s.draft_cached, s.block_table))
                s.draft_cached += 1
        for i, ps in probs.items():
            if ps:
                drafts[i].probs = torch.stack(ps)
        return drafts
