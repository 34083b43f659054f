"""One request's state: its tokens, where its KV lives, and how well drafts do for it."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch-free at run time: the fleet simulator schedules sequences too
    import torch


# How a sequence tracks its drafts' acceptance (`Sequence.record_acceptance`): the share of its
# estimate kept and of the latest rate taken at each drafting iteration, and the estimate a
# paused sequence retries from, as a multiple of the floor (just above it: a draft still failing
# pauses again within a few iterations, a good one climbs back). One iteration's rate is noisy
# (k=4 drafts accepted at 0.6 a token: 0.33 on average, 0.35 its spread), so the estimate
# averages about ten iterations: taking 0.3 of each, a floor of 0.2 paused half of such a
# sequence's iterations, and speculation lost a fifth to a quarter of its speedup
# (docs/PERFORMANCE.md). The fleet simulator's spec runs track it in their own arrays.
ACCEPTANCE_KEPT, ACCEPTANCE_TAKEN = 0.9, 0.1
RETRY_OVER_FLOOR = 2.0
# The default floor, a share of drafted tokens accepted: 0.05 is about 0.17 a token at k=4,
# drafts that nearly never land. Higher floors pause sequences whose drafts still pay: in a batch
# that speculates, one sequence's drafts cost little (the forwards run for the others), and the
# gate, not the pause, turns speculation off where a batch's drafts do not pay. The pause, in
# iterations of the sequence.
MIN_ACCEPTANCE, PAUSE_ITERATIONS = 0.05, 16


class InvalidRequest(ValueError):
    """A request the engine refuses (bad parameters, prompt over the context)."""


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 64
    temperature: float = 0.0
    seed: int | None = None
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise InvalidRequest(f"max_tokens must be at least 1, got {self.max_tokens}")
        if not 0.0 <= self.temperature <= 100.0:
            raise InvalidRequest(f"temperature must be in [0, 100], got {self.temperature}")


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False, slots=True)
class Sequence:
    """Committed tokens t_0..t_{L-1}. Target KV is valid for positions < L-1 while running:
    the last token is fed by the next iteration. `draft_cached` counts the draft's valid
    positions, which lag while speculation is off and catch up when it resumes;
    `plain_unread` counts the lag's tokens that plain iterations committed (the part of a
    catch-up not charged to speculation)."""

    seq_id: int
    token_ids: list[int]
    prompt_len: int
    params: SamplingParams
    generator: torch.Generator | None = None
    status: Status = Status.WAITING
    block_table: list[int] = field(default_factory=list)
    draft_cached: int = 0
    plain_unread: int = 0
    finish_reason: str | None = None
    acceptance: float = 0.5  # EMA of accepted/drafted for this sequence
    paused_iterations: int = 0  # speculation is off for this sequence while > 0

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[self.prompt_len :]

    @property
    def num_output(self) -> int:
        return len(self.token_ids) - self.prompt_len

    @property
    def remaining(self) -> int:
        return self.params.max_tokens - self.num_output

    def record_acceptance(self, rate: float, floor: float, pause: int) -> None:
        """Track recent acceptance; below `floor`, stop drafting for this sequence for
        `pause` of its iterations, then retry from just above the floor."""
        self.acceptance = ACCEPTANCE_KEPT * self.acceptance + ACCEPTANCE_TAKEN * rate
        if self.acceptance < floor:
            self.paused_iterations = pause
            self.acceptance = RETRY_OVER_FLOOR * floor

    def take_pause(self) -> bool:
        """True (and one pause iteration used up) while speculation is paused for this sequence."""
        if self.paused_iterations > 0:
            self.paused_iterations -= 1
            return True
        return False

    @property
    def is_resumed(self) -> bool:
        """Preempted after producing tokens: its prefill recomputes KV without sampling."""
        return self.num_output > 0
