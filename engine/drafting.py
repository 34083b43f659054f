"""Drafters propose up to k tokens per sequence for the target to verify in one forward.

`ModelDrafter` runs a small draft model over the same block tables as the target (its
KV is a second cache indexed by the same block ids). Its cache lags while speculation
is off (and after a prefill), so a gated-off iteration never touches the draft; the
first spec iteration after that catches up in a forward of its own, so that its time can
be counted apart from the steady-state cost of speculating.

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


class ModelDrafter:
    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner

    def catch_up(self, seqs: list[Sequence]) -> bool:
        """Feed the draft every committed token it missed beyond the steady-state lag, in one
        forward, leaving the newest token for the first drafting forward. False: none missed."""
        behind = [s for s in seqs if len(s) - s.draft_cached > STEADY_LAG]
        if not behind:
            return False
        self.runner.forward(
            [Feed(s.token_ids[s.draft_cached : -1], s.draft_cached, s.block_table) for s in behind],
            all_logits=False,
        )
        for s in behind:
            s.draft_cached = len(s) - 1
        return True

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
