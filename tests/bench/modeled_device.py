"""A modeled compute-bound device for the engine's clock.

On this CPU the tiny pair is dominated by per-step overhead, so speculation pays up to
large batches and a test cannot reach its crossover in seconds. Here every real forward
still runs (real drafts, real acceptance, real batching), but the clock the engine times
its iterations with advances by a roofline-shaped cost per forward instead of wall time:
overhead + max(floor, per_position * positions). The crossover then sits at a known,
small batch size, the same for every run.
"""

from __future__ import annotations

from dataclasses import dataclass

from spectune.engine.config import EngineConfig
from spectune.engine.drafting import ModelDrafter
from spectune.engine.engine import LLMEngine
from spectune.engine.model_runner import Feed, ModelRunner


@dataclass(frozen=True)
class Cost:
    overhead: float
    floor: float
    per_position: float

    def of(self, positions: int) -> float:
        return self.overhead + max(self.floor, self.per_position * positions)


TARGET = Cost(overhead=0.5e-3, floor=2e-3, per_position=0.25e-3)  # flat up to 8 positions
DRAFT = Cost(overhead=0.2e-3, floor=0.0, per_position=0.0)


class ModeledDevice:
    def __init__(self, target: Cost = TARGET, draft: Cost = DRAFT) -> None:
        self.target, self.draft = target, draft
        self.now = 0.0

    def clock(self) -> float:
        return self.now

    def make_engine(self, config: EngineConfig) -> LLMEngine:
        engine = LLMEngine(config, clock=self.clock)
        self._charge(engine.runner, self.target)
        if isinstance(engine.drafter, ModelDrafter):
            self._charge(engine.drafter.runner, self.draft)
        return engine

    def _charge(self, runner: ModelRunner, cost: Cost) -> None:
        """Through the runner's meter, which every forward calls: the draft's greedy chain
        runs its forwards inside one call, and wrapping `forward` left them uncharged."""

        def charge(feeds: list[Feed]) -> None:
            self.now += cost.of(sum(len(f.tokens) for f in feeds))

        runner.on_forward = charge
