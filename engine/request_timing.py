"""When a request's tokens came, and whether that met the SLO. Torch-free: the server, the
load generator and the fleet simulator judge requests alike."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RequestTiming:
    ttft: float
    e2e: float
    output_tokens: int

    @property
    def tpot(self) -> float | None:
        """Mean time per output token after the first; None with a single token."""
        return (self.e2e - self.ttft) / (self.output_tokens - 1) if self.output_tokens > 1 else None

    def meets(self, ttft_target: float, tpot_target: float) -> bool:
        return self.ttft <= ttft_target and (self.tpot is None or self.tpot <= tpot_target)
