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

from spectune.engine.draft_lag import CatchUp, catch_up
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


class ModelDrafter:
    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner

    def catch_up(self, seqs: list[Sequence]) -> CatchUp:
        """Feed the draft every committed token it missed beyond the steady-state lag, in one
        forward (draft_lag.catch_up)."""

        def read(behind: list[Sequence]) -> None:
            feeds = [
                Feed(s.token_ids[s.draft_cached : -1], s.draft_cached, s.block_table)
                for s in behind
            ]
            self.runner.forward(feeds, all_logits=False)

        return catch_up(seqs, read)

    @staticmethod
    def _chains(seqs: list[Sequence], ks: list[int], active: list[int]) -> bool:
        """Greedy rows all drafting the same k: the whole loop runs on the device
        (ModelRunner.greedy_chain). Sampled drafts need each row's generator on the host."""
        return len({ks[i] for i in active}) == 1 and all(
            seqs[i].params.temperature == 0 for i in active
        )

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
        if active and self._chains(seqs, ks, active):
            chosen = self.runner.greedy_chain(feeds, ks[active[0]]).tolist()
            for i, tokens in zip(active, chosen, strict=True):
                drafts[i].tokens = tokens
                seqs[i].draft_cached += len(tokens) - 1
            return drafts
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
