"""SpecDeployment v1alpha1: the single source of the CRD schema (crds/ is generated).

Field names follow Kubernetes API conventions (camelCase, integers rather than floats in
spec). Cross-field rules are CEL expressions carried on the models, so the API server
itself rejects nonsense with the message written here.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

GROUP = "spectune.io"
VERSION = "v1alpha1"
KIND = "SpecDeployment"
PLURAL = "specdeployments"
DEFAULT_IMAGE = "spectune/engine:0.1.0"


def cel(rule: str, message: str, reason: str | None = None) -> dict[str, str]:
    out = {"rule": rule, "message": message}
    if reason:
        out["reason"] = reason
    return out


class Spec(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ModelSpec(Spec):
    name: str = Field(
        min_length=1,
        max_length=512,
        description="HF checkpoint directory in the pod, or a built-in model name",
    )
    dtype: Literal["float32", "bfloat16", "float16"] | None = Field(
        None, description="weights dtype; default float32 on the CPU, bfloat16 on GPUs"
    )


class Resources(Spec):
    requests: dict[str, int | str] = Field(
        default_factory=dict, description="as a container's resources.requests"
    )
    limits: dict[str, int | str] = Field(
        default_factory=dict, description="as a container's resources.limits"
    )


class EngineSpec(Spec):
    image: str = Field(DEFAULT_IMAGE, min_length=1, max_length=512)
    gpus: int = Field(0, ge=0, le=64, description="nvidia.com/gpu per pod")
    resources: Resources = Field(default_factory=Resources)
    nodeSelector: dict[str, str] = Field(default_factory=dict)
    maxBatchSize: int = Field(64, ge=1, le=4096)
    port: int = Field(8000, ge=1, le=65535)
    podAnnotations: dict[str, str] = Field(
        default_factory=dict, description="annotations added to the engine pods"
    )


class ThresholdSpec(Spec):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "x-kubernetes-validations": [
                cel("self.min <= self.max", "threshold.min must not exceed threshold.max"),
                cel(
                    "self.mode != 'Manual' || has(self.value)",
                    "threshold.value is required in Manual mode",
                ),
                cel(
                    "!has(self.value) || self.value == 0 || "
                    "(self.value >= self.min && self.value <= self.max)",
                    "threshold.value must lie between threshold.min and threshold.max "
                    "(or be 0: never speculate)",
                ),
            ]
        },
    )
    mode: Literal["Auto", "Manual", "Advisory"] = Field(
        "Auto",
        description="Auto: measure and patch; Manual: pin value; "
        "Advisory: measure and recommend only",
    )
    value: int | None = Field(
        None, ge=0, le=4096, description="pinned threshold (Manual); start value otherwise"
    )
    min: int = Field(1, ge=0, le=4096)
    max: int = Field(256, ge=1, le=4096)


class SpeculationSpec(Spec):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "self.method != 'draft' || has(self.draft)",
                    "speculation.draft is required when method is draft",
                ),
                cel(
                    "self.method == 'draft' || !has(self.draft)",
                    "speculation.draft is only used when method is draft",
                ),
            ]
        },
    )
    method: Literal["draft", "ngram", "none"] = "ngram"
    draft: str | None = Field(
        None, min_length=1, max_length=512, description="draft checkpoint or built-in name"
    )
    numSpeculativeTokens: int = Field(4, ge=1, le=16)
    threshold: ThresholdSpec = Field(default_factory=ThresholdSpec)


class SloSpec(Spec):
    ttftMilliseconds: int = Field(1000, ge=1, le=600_000)
    tpotMilliseconds: int = Field(100, ge=1, le=60_000)


class TuningSpec(Spec):
    calibrationWindowSeconds: int = Field(120, ge=10, le=86_400)
    explorationPercent: int = Field(
        2, ge=0, le=50, description="share of iterations run in the other mode"
    )
    minDwellSeconds: int = Field(
        300, ge=0, le=86_400, description="minimum time between threshold changes"
    )
    trafficChangePercent: int = Field(
        30, ge=1, le=1000, description="load change that triggers re-measuring"
    )
    maxAgeSeconds: int = Field(
        3600,
        ge=60,
        le=604_800,
        description="re-measure the crossover after this long even if nothing changed",
    )


class SpecDeploymentSpec(Spec):
    replicas: int = Field(1, ge=0, le=1000)
    model: ModelSpec
    engine: EngineSpec = Field(default_factory=EngineSpec)
    speculation: SpeculationSpec = Field(default_factory=SpeculationSpec)
    slo: SloSpec = Field(default_factory=SloSpec)
    tuning: TuningSpec = Field(default_factory=TuningSpec)


class Condition(BaseModel):
    type: Literal["Ready", "Calibrated", "Progressing", "Degraded", "MetricsAvailable"]
    status: Literal["True", "False", "Unknown"]
    reason: str
    message: str = ""
    lastTransitionTime: str
    observedGeneration: int | None = None


class ThresholdStatus(BaseModel):
    current: int | None = Field(
        None, description="threshold the engines run with; absent: always speculate"
    )
    recommended: int | None = None
    source: Literal["Spec", "Measured", "Default"] = "Default"


CURVE = "batch bucket -> measured speedup (spec over plain decode throughput)"


class CrossoverStatus(BaseModel):
    batchSize: int | None = None
    measuredAt: str | None = None
    reason: str | None = None
    sku: str | None = None
    replicas: int | None = None
    curve: dict[str, float] = Field(default_factory=dict, description=CURVE)


class SkuThreshold(BaseModel):
    """One GPU SKU's measured crossover and the threshold its pods run."""

    sku: str
    threshold: int | None = Field(None, description="absent: always speculate")
    batchSize: int | None = Field(None, description="crossover batch size; absent: not crossed")
    reason: str = ""
    confidencePercent: int = 0
    pods: int = 0
    curve: dict[str, float] = Field(default_factory=dict, description=CURVE)


class BucketSums(BaseModel):
    """One batch bucket's decode steps over a window, both modes summed."""

    steps: int
    tokens: int
    seconds: float


class Baseline(BaseModel):
    """The fleet when the crossover was last measured: what the triggers compare with."""

    replicas: int
    skus: list[str] = Field(default_factory=list)
    model: str
    draft: str | None = None
    method: str
    k: int
    measuredAt: str
    traffic: dict[str, float] = Field(default_factory=dict)
    bounds: dict[str, int] = Field(
        default_factory=dict,
        description="SKU -> the batch where the measured range ended, for SKUs where "
        "speculation paid at every batch measured: traffic running past it re-measures",
    )
    floors: dict[str, int] = Field(
        default_factory=dict,
        description="SKU -> the smallest batch measured, for SKUs where speculation paid at "
        "no batch measured: traffic running below it re-measures",
    )
    covered: dict[str, list[int]] | None = Field(
        default=None,
        description="SKU -> [smallest, largest] batch bucket measured in both modes: a replica "
        "change re-measures only once the load runs outside it",
    )


class SpeculationKey(BaseModel):
    """The spec fields a speedup curve belongs to: a curve of one is no evidence for another."""

    model: str
    draft: str | None = None
    method: str
    k: int


class CalibrationStatus(BaseModel):
    """Calibration state: kept here, a restarted operator resumes it (no engine left exploring)."""

    phase: Literal["Idle", "Exploring", "Verifying"] = "Idle"
    trigger: str | None = Field(None, description="kind of the change that started it")
    message: str | None = None
    startedAt: str | None = None
    changedAt: str | None = Field(None, description="when the threshold last changed")
    finishedAt: str | None = Field(None, description="when the last calibration ended")
    retryAfter: str | None = Field(
        None,
        description="no trigger before this: the last calibration ended without a measurement "
        "kept (failed, aborted, cancelled or rolled back)",
    )
    config: SpeculationKey | None = Field(
        None, description="the configuration this calibration measures (a spec change ends it)"
    )
    previous: list[SkuThreshold] = Field(
        default_factory=list,
        description="per-SKU thresholds before the last change (for roll back); empty when "
        "none was measured",
    )
    previousThreshold: ThresholdStatus | None = Field(
        None, description="the threshold before the last change, and where it came from"
    )
    unverified: str | None = Field(
        None,
        description="why the goodput check after the last change could not decide yet: "
        "verification goes on, and the change is rolled back if it never can",
    )
    before: dict[str, float] = Field(
        default_factory=dict, description="traffic before the last change (goodput check)"
    )
    beforeSteps: dict[str, dict[str, BucketSums]] = Field(
        default_factory=dict,
        description="SKU -> batch bucket -> decode steps before the last change, in the mode "
        "the thresholds before it ran there, from the calibration's window (goodput check)",
    )
    reached: dict[str, list[int]] = Field(
        default_factory=dict,
        description="SKU -> [smallest, largest] batch bucket holding 5% or more of this "
        "calibration's decode steps",
    )
    reachedAt: str | None = Field(None, description="when that range last grew")
    baseline: Baseline | None = None


class SpecDeploymentStatus(BaseModel):
    observedGeneration: int | None = None
    replicas: int = 0
    readyReplicas: int = 0
    selector: str = ""
    threshold: ThresholdStatus = Field(default_factory=ThresholdStatus)
    crossover: CrossoverStatus = Field(default_factory=CrossoverStatus)
    perSku: list[SkuThreshold] = Field(default_factory=list)
    calibration: CalibrationStatus = Field(default_factory=CalibrationStatus)
    goodput: str | None = Field(None, description="requests per second within the SLO, fleet-wide")
    conditions: list[Condition] = Field(default_factory=list)


def parse_spec(spec: dict[str, Any]) -> SpecDeploymentSpec:
    """The operator's view of a spec (the API server already validated and defaulted it)."""
    return SpecDeploymentSpec.model_validate(spec)
