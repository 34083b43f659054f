"""Run the engine on a simulated GPU SKU: real tokens from the real forwards, a modelled clock.

Every forward still runs on the real device, so outputs and acceptance are exactly what they
would be (speculation stays lossless). Each forward is charged the seconds
engine/device_time.py gives for it on the SKU, for the virtual model it stands for (Llama
3.1 8B as the target, Llama 3.2 1B as the draft), times `time_scale`; the engine times its
iterations on that clock. When `hold` is on (serving), each iteration is also held until its
modelled time has passed on the wall clock, so clients see the SKU's latencies; an iteration
whose real time was already longer is an overrun: the simulation was not faithful there, and
it is counted and logged. Uniform scaling moves no crossover, so a scale that keeps the
modelled time above this CPU's real time changes nothing but the speed of the whole run.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Protocol

from spectune.engine.device_time import LLAMA_1B, LLAMA_8B, Sku, VirtualModel, sku_named

log = logging.getLogger(__name__)
OVERRUN_LOG_INTERVAL_S = 10.0


class Fed(Protocol):
    """What a forward ran for one sequence (model_runner.Feed)."""

    tokens: list[int]
    start: int


@dataclass
class SimulatedDevice:
    sku: Sku
    time_scale: float = 1.0
    target: VirtualModel = LLAMA_8B
    draft: VirtualModel = LLAMA_1B
    hold: bool = True  # keep the wall clock to the modelled one (off: the clock alone, e.g. sweeps)
    # Cached tokens each sequence holds on the simulated device beyond its real ones: the
    # built-in models were trained on 128-token sequences, serving contexts run to thousands.
    extra_context: int = 0
    # Modelled cached tokens per real one: unlike the extra context, it keeps the traffic's
    # prompt lengths in proportion, so that longer prompts move the crossover as far as
    # thousands-of-tokens contexts would.
    context_scale: float = 1.0
    modelled: float = 0.0  # scaled modelled seconds so far: the engine's clock
    overruns: int = 0  # iterations whose real time exceeded their modelled time
    _last_log: float = field(default=-OVERRUN_LOG_INTERVAL_S, repr=False)

    @classmethod
    def named(
        cls, sku: str, time_scale: float = 1.0, extra_context: int = 0, context_scale: float = 1.0
    ) -> SimulatedDevice:
        """EngineConfig has checked the scales and the extra context; the SKU is looked up here."""
        return cls(
            sku_named(sku), time_scale, extra_context=extra_context, context_scale=context_scale
        )

    @property
    def label(self) -> str:
        """The device as metrics name it: the SKU's nvidia.com/gpu.product value."""
        return self.sku.product

    def clock(self) -> float:
        return self.modelled

    def charge(self, model: VirtualModel, feeds: Sequence[Fed]) -> None:
        """Advance the clock by one forward over `feeds`: each reads its `start` cached tokens,
        and its j-th new token attends to start + j of them."""
        scale, extra = self.context_scale, self.extra_context
        positions = cached = attended = 0
        for f in feeds:  # one pass: the fleet simulator charges millions of forwards
            n = len(f.tokens)
            start = (f.start if scale == 1.0 else round(f.start * scale)) + extra
            positions += n
            cached += start
            attended += n * start + n * (n - 1) // 2
        self.charge_totals(model, positions, cached, attended)

    def charge_totals(
        self, model: VirtualModel, positions: int, cached: int, attended: int
    ) -> None:
        """charge() for feeds whose counts, as charge() scales and sums them, are these."""
        self.modelled += self.time_scale * model.forward(self.sku, positions, cached, attended)

    def charge_one_each(self, model: VirtualModel, starts: Sequence[int]) -> None:
        """charge() for one new token per sequence after `starts` cached tokens (a plain decode
        step, a draft's proposal step): the same seconds, without a feed per sequence."""
        scale = self.context_scale
        cached = sum(starts) if scale == 1.0 else sum(round(s * scale) for s in starts)
        self.charge_batch(model, len(starts), cached)

    def charge_batch(self, model: VirtualModel, count: int, cached: int) -> None:
        """charge_one_each() for `count` sequences whose (scaled) starts sum to `cached`."""
        cached += count * self.extra_context
        self.charge_totals(model, count, cached, cached)

    @contextmanager
    def iteration(self) -> Iterator[None]:
        """Around one engine iteration: hold the wall clock to the modelled time it took."""
        wall0, modelled0 = time.perf_counter(), self.modelled
        yield
        if not self.hold:
            return
        real, modelled = time.perf_counter() - wall0, self.modelled - modelled0
        if real > modelled > 0:
            self._overrun(real, modelled)
        elif real < modelled:
            time.sleep(modelled - real)

    def forget_overruns(self) -> None:
        """Start counting afresh (after a warm-up, whose first forwards run cold by design)."""
        self.overruns = 0
        self._last_log = -OVERRUN_LOG_INTERVAL_S

    def _overrun(self, real: float, modelled: float) -> None:
        self.overruns += 1
        now = time.monotonic()
        if now - self._last_log >= OVERRUN_LOG_INTERVAL_S:
            self._last_log = now
            log.warning(
                "simulated %s: an iteration took %.1f ms of real time, longer than its modelled "
                "%.1f ms (%d overruns so far): raise the time scale for a faithful simulation",
                self.sku.product,
                real * 1e3,
                modelled * 1e3,
                self.overruns,
            )
