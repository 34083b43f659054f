"""What the demo saw, as data: the live samples, the operator's Events on the same clock, each
phase's outcome and the counterfactual goodput of the fixed policies. The driver fills it in;
the report and the verdict read only this, so they are tested without a cluster."""

from __future__ import annotations

from pydantic import BaseModel, Field

# The operator's Events the timeline marks, and the ones that change a threshold.
CHANGED = "ThresholdChanged"
TRIGGERED = "CalibrationStarted"
ROLLED_BACK = "RolledBack"
MARKED = (TRIGGERED, CHANGED, "ThresholdKept", ROLLED_BACK, "ThresholdRecommended")


class Step(BaseModel):
    """A set-up step and how long it took (cold steps build binaries or train models)."""

    name: str
    seconds: float


class Sample(BaseModel):
    """One tick of the live run, every field as the demo read it at the tick's end."""

    t: float = Field(description="seconds since the first phase began")
    phase: str
    clients: int
    replicas: int
    batch: dict[str, float] = Field(
        default_factory=dict, description="SKU -> mean running batch over the tick"
    )
    overrun_percent: dict[str, float] = Field(
        default_factory=dict,
        description="SKU -> iterations this CPU ran past the modelled GPU per 100 decode steps",
    )
    threshold: int | None = Field(description="status.threshold.current; None: always")
    crossover: dict[str, float | None] = Field(
        default_factory=dict, description="SKU -> measured crossover; None: not crossed"
    )
    goodput_rps: float = Field(description="SLO-met requests per second over the tick")
    requests: int
    event: str | None = Field(None, description="the operator's latest Event, 'Reason: text'")


class Mark(BaseModel):
    """One of the operator's Events (MARKED), on the samples' clock."""

    t: float
    phase: str
    reason: str
    message: str


class PolicyAtBatch(BaseModel):
    """One batch bucket a phase's engines ran in both modes, and what each mode's decode
    throughput was there."""

    bucket: int
    batch: int = Field(description="the mean running batch of its plain steps, rounded")
    share: float = Field(description="its share of the compared buckets' decode time")
    never: float = Field(description="decode tokens/s not speculating, on the GPU's clock")
    always: float = Field(description="decode tokens/s speculating, on the GPU's clock")


class Counterfactual(BaseModel):
    """Each policy's decode throughput per engine on the phase's traffic (demo/counterfactual.py):
    per batch bucket, each mode's throughput as the phase's engines measured it on the
    simulated GPU's clock (exploration interleaves the modes at the same batches), weighted by
    the bucket's share of their decode time. `auto` runs the threshold the operator chose,
    `never` and `always` the two fixed policies; the verdict compares them."""

    threshold: int | None
    compared: float = Field(
        description="share of the phase's decode time in buckets measured in both modes"
    )
    batches: list[PolicyAtBatch]
    gpu_tokens_per_s: dict[str, float] = Field(
        description="policy (auto, never, always) -> decode tokens per second of the GPU, on "
        "its own clock, over the compared buckets"
    )


class PhaseResult(BaseModel):
    name: str
    title: str
    started: float
    ended: float
    sku: str = Field(description="the nvidia.com/gpu.product the pods ran on")
    replicas: int
    clients: list[int] = Field(description="over all pods, a level every LEVEL_SECONDS in turn")
    temperature: float
    threshold: int | None = Field(description="at the phase's end; None: always speculate")
    crossover: float | None = Field(description="the SKU's measured crossover at the end")
    crossover_reason: str = ""
    mean_batch: float = Field(description="mean running batch per engine over the phase")
    peak_batch: float = Field(description="the highest tick's mean running batch per engine")
    overrun_percent: float = Field(
        description="iterations this CPU ran longer than the modelled GPU, per 100 decode "
        "steps (prefills too, so it can pass 100): where it is high, live goodput measures "
        "the CPU more than the GPU"
    )
    goodput_rps: float = Field(description="live SLO-met requests/s over the phase")
    counterfactual: Counterfactual | None = None

    @property
    def crosses(self) -> bool:
        """Whether the phase's batch (at its busiest level) reached the measured crossover, or
        the threshold where only a bound was measured ("does not pay even at 32"): where the
        threshold decides between speculating and not."""
        if self.crossover is not None:
            return self.peak_batch >= self.crossover
        t = self.threshold
        return t is not None and 1 < t <= self.peak_batch


class Timeline(BaseModel):
    started_at: str = Field(description="ISO time the demo began")
    time_scale: float = Field(description="the simulated GPUs' clock runs this much slower")
    simulated: bool = True
    cold_steps: list[Step] = Field(default_factory=list)
    phases: list[PhaseResult] = Field(default_factory=list)
    samples: list[Sample] = Field(default_factory=list)
    marks: list[Mark] = Field(default_factory=list)
    total_seconds: float = 0.0
