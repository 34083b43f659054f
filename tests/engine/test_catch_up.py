"""The draft's catch-up forward, split: what speculation owes (the draft's prefill, what a
paused sequence skipped) against what only plain iterations made it miss."""

from __future__ import annotations

import pytest

from spectune.engine.draft_lag import CatchUp
from spectune.engine.drafting import ModelDrafter
from spectune.engine.model_runner import Feed
from spectune.engine.sequence import SamplingParams, Sequence


class Recorder:
    """Stands in for the draft's runner: catch_up reads no logits."""

    def __init__(self) -> None:
        self.feeds: list[Feed] = []

    def forward(self, feeds: list[Feed], all_logits: bool) -> None:
        self.feeds += feeds


def seq(length: int, prompt: int, draft_cached: int, plain_unread: int = 0) -> Sequence:
    s = Sequence(0, list(range(length)), prompt, SamplingParams(), block_table=[0])
    s.draft_cached, s.plain_unread = draft_cached, plain_unread
    return s


@pytest.mark.parametrize(
    ("length", "draft_cached", "plain_unread", "owed", "missed"),
    [
        (21, 0, 0, 20, 0),  # just prefilled: the whole prompt is the draft's prefill
        (26, 0, 5, 20, 5),  # prefilled, then five plain iterations
        (47, 40, 5, 0, 6),  # steady lag of two, then five plain: all switching
        (46, 40, 5, 0, 5),  # steady lag of one, then five plain
        (46, 40, 0, 5, 0),  # paused for five spec iterations: speculation's own cost
    ],
)
def test_a_catch_up_splits_owed_from_missed(length, draft_cached, plain_unread, owed, missed):
    runner = Recorder()
    s = seq(length, 20, draft_cached, plain_unread)
    assert ModelDrafter(runner).catch_up([s]) == CatchUp(owed, missed)
    assert sum(len(f.tokens) for f in runner.feeds) == owed + missed
    assert s.draft_cached == length - 1


def test_within_the_steady_lag_nothing_is_fed() -> None:
    runner = Recorder()
    assert ModelDrafter(runner).catch_up([seq(30, 20, 28, plain_unread=1)]) == CatchUp()
    assert runner.feeds == []


def test_the_forwards_time_is_split_by_tokens() -> None:
    assert CatchUp(30, 10).split(0.004) == pytest.approx((0.003, 0.001))
    assert CatchUp(30, 0).split(0.004) == (0.004, 0.0)
    assert CatchUp().split(0.004) == (0.0, 0.0)


def test_a_forward_owing_any_token_owes_at_least_a_draft_forwards_time() -> None:
    """A paused sequence's 16 skipped tokens beside 48 that plain iterations committed: steady
    speculation would run that forward for the 16 alone, at about a draft forward's cost."""
    assert CatchUp(16, 48).split(0.012, floor=0.010) == pytest.approx((0.010, 0.002))
    assert CatchUp(1000, 40).split(0.052, floor=0.010) == pytest.approx((0.05, 0.002))
    assert CatchUp(16, 48).split(0.008, floor=0.010) == (0.008, 0.0)  # never past the forward
    assert CatchUp(0, 48).split(0.012, floor=0.010) == (0.0, 0.012)  # nothing owed: all missed
