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
# Any JSON object, kept whole by the API server (a volume source, a pod spec's field).
FREE_FORM = {"x-kubernetes-preserve-unknown-fields": True}


def cel(rule: str, message: str, reason: str | None = None) -> dict[str, str]:
    out = {"rule": rule, "message": message}
    if reason:
        out["reason"] = reason
    return out


def inside_volume(path: str) -> str:
    """CEL: `path` is relative and never climbs out of the volume it is read in."""
    return f"(!{path}.startsWith('/') && !{path}.matches('(^|/)[.][.](/|$)'))"


def volume_source(what: str) -> Any:
    """A field holding one Kubernetes volume source, kept whole: the API server validates it
    as it validates any pod's volume when the engine pods are made."""
    return Field(
        None,
        description=f"a Kubernetes volume source holding the {what} (e.g. "
        "{persistentVolumeClaim: {claimName: weights}}), mounted read-only",
        json_schema_extra=FREE_FORM,
    )


class Spec(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ModelSpec(Spec):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    f"!has(self.volume) || {inside_volume('self.name')}",
                    "with model.volume, model.name is the checkpoint's directory inside it: "
                    "a relative path without '..'",
                )
            ]
        },
    )
    name: str = Field(
        min_length=1,
        max_length=512,
        description="HF checkpoint directory: inside `volume` when given, else in the image "
        "or a built-in model name",
    )
    volume: dict[str, Any] | None = volume_source("weights")
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


# What the operator itself sets on every engine pod; a template that sets them otherwise is
# refused (render.py builds them).
OWN_LABELS = (
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/managed-by",
)
OWN_VOLUMES = ("config", "admin-token", "weights", "draft-weights")
OWN_MOUNT_PATHS = ("/etc/spectune", "/var/run/spectune", "/weights/model", "/weights/draft")
OWN_CONTAINER_FIELDS = (
    "image",
    "command",
    "args",
    "ports",
    "readinessProbe",
    "livenessProbe",
    "startupProbe",
)
GPU_RESOURCE = "nvidia.com/gpu"


def _none_of(items: str, values: tuple[str, ...], field: str = "") -> str:
    """CEL: no element of the list `items` (its `field` when given) is one of `values`."""
    listed = ", ".join(f"'{v}'" for v in values)
    return f"{items}.all(x, !(x{field} in [{listed}]))"


def _free(description: str) -> Any:
    return Field(None, description=description, json_schema_extra=FREE_FORM)


def _free_list(description: str, max_items: int = 64, key: str | None = None) -> Any:
    """A list of free-form objects; `key`, when given, is a string field every item has (a
    merge key, which the CEL rules read)."""
    item: dict[str, Any] = {"type": "object", **FREE_FORM}
    if key:
        item |= {"required": [key], "properties": {key: {"type": "string"}}}
    return Field(
        default_factory=list,
        max_length=max_items,
        description=description,
        json_schema_extra={"items": item},
    )


class Strategy(Spec):
    """The engine Deployment's rollout: a Deployment's strategy with rollingUpdate's two
    fields flattened into it. GPU pods fill in what is unset with maxSurge 0 and
    maxUnavailable 1: a surge pod would wait for a GPU that a full pool does not have, and the
    rollout with it; CPU pods leave it to Kubernetes (25% and 25%)."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "self.type == 'RollingUpdate' || !has(self.maxSurge) && "
                    "!has(self.maxUnavailable)",
                    "maxSurge and maxUnavailable apply only to type RollingUpdate",
                )
            ]
        },
    )
    type: Literal["RollingUpdate", "Recreate"] = "RollingUpdate"
    maxSurge: int | str | None = Field(
        None, description="pods above replicas in a rollout, a count or a percentage; GPU pods: 0"
    )
    maxUnavailable: int | str | None = Field(
        None,
        description="pods below replicas in a rollout, a count or a percentage; GPU pods: 1",
    )


class TemplateContainer(Spec):
    """The engine container's part of a template; the operator's own fields are declared
    only so that a template setting them is refused with the reason, not silently pruned."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "self.name == 'engine'",
                    "template.spec.containers: only the engine container (name: engine) can "
                    "be adjusted",
                ),
                cel(
                    " && ".join(f"!has(self.{f})" for f in OWN_CONTAINER_FIELDS),
                    "the operator sets the engine container's image (spec.engine.image), "
                    "command, args, ports (spec.engine.port) and probes",
                    "FieldValueForbidden",
                ),
                cel(
                    "!has(self.volumeMounts) || "
                    + _none_of("self.volumeMounts", OWN_MOUNT_PATHS, ".mountPath"),
                    f"mount paths {', '.join(OWN_MOUNT_PATHS)} are the operator's",
                    "FieldValueForbidden",
                ),
                cel(
                    "!has(self.resources) || ("
                    + " && ".join(
                        f"(!has(self.resources.{k}) || !('{GPU_RESOURCE}' in self.resources.{k}))"
                        for k in ("requests", "limits")
                    )
                    + ")",
                    f"{GPU_RESOURCE} comes from spec.engine.gpus",
                    "FieldValueForbidden",
                ),
            ]
        },
    )
    name: str = Field(max_length=63)
    env: list[dict[str, Any]] = _free_list("as a container's env, merged by name", key="name")
    envFrom: list[dict[str, Any]] = _free_list("as a container's envFrom", 16)
    volumeMounts: list[dict[str, Any]] = _free_list("merged by mountPath", 32, "mountPath")
    resources: Resources | None = None
    securityContext: dict[str, Any] | None = _free("merged over the restricted default")
    lifecycle: dict[str, Any] | None = _free(
        "replaces the default preStop, a 10 s sleep while endpoints stop routing to the pod"
    )
    image: str | None = Field(None, description="refused: spec.engine.image")
    command: list[str] | None = Field(None, description="refused: the operator's")
    args: list[str] | None = Field(None, description="refused: the operator's")
    ports: list[dict[str, Any]] | None = Field(
        None,
        description="refused: spec.engine.port",
        json_schema_extra={"items": {"type": "object", **FREE_FORM}},
    )
    readinessProbe: dict[str, Any] | None = _free("refused: the operator's")
    livenessProbe: dict[str, Any] | None = _free("refused: the operator's")
    startupProbe: dict[str, Any] | None = _free("refused: the operator's")


class TemplatePodSpec(Spec):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    f"!has(self.volumes) || {_none_of('self.volumes', OWN_VOLUMES, '.name')}",
                    f"volume names {', '.join(OWN_VOLUMES)} are the operator's",
                    "FieldValueForbidden",
                )
            ]
        },
    )
    containers: list[TemplateContainer] = Field(default_factory=list, max_length=1)
    volumes: list[dict[str, Any]] = _free_list("extra volumes, merged by name", 32, "name")
    tolerations: list[dict[str, Any]] = _free_list("GPU nodes are usually tainted")
    affinity: dict[str, Any] | None = _free("as a pod's affinity")
    nodeSelector: dict[str, str] = Field(default_factory=dict)
    imagePullSecrets: list[dict[str, Any]] = _free_list("merged by name", 16, "name")
    serviceAccountName: str | None = Field(None, max_length=253)
    securityContext: dict[str, Any] | None = _free("merged over the restricted default")
    runtimeClassName: str | None = Field(None, max_length=253)
    priorityClassName: str | None = Field(None, max_length=253)
    terminationGracePeriodSeconds: int | None = Field(
        None,
        ge=0,
        le=86_400,
        description="default 60: the preStop's 10 s, then up to 30 s for in-flight requests",
    )
    topologySpreadConstraints: list[dict[str, Any]] = _free_list("as a pod's", 16)
    initContainers: list[dict[str, Any]] = _free_list("merged by name", 16, "name")


class TemplateMetadata(Spec):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    f"!has(self.labels) || {_none_of('self.labels', OWN_LABELS)}",
                    f"labels {', '.join(OWN_LABELS)} select the engine pods: the operator's",
                    "FieldValueForbidden",
                )
            ]
        },
    )
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


class PodTemplate(Spec):
    """A pod template fragment merged into the engine pods, as a strategic merge patch would
    merge it (named list items by name, maps key by key)."""

    metadata: TemplateMetadata = Field(default_factory=TemplateMetadata)
    spec: TemplatePodSpec = Field(default_factory=TemplatePodSpec)


class EngineSpec(Spec):
    image: str | None = Field(
        None,
        min_length=1,
        max_length=512,
        description="unset: the operator's default (the chart's engine.image), so an upgrade "
        "moves engines to its image at their next rollout",
    )
    gpus: int = Field(
        0, ge=0, le=1, description="nvidia.com/gpu per pod (the engine uses one device)"
    )
    resources: Resources = Field(
        default_factory=Resources,
        description="the engine container's; cpu and memory neither requested nor limited here "
        "are requested at 2 and 16Gi with GPUs, 1 and 2Gi without (never BestEffort)",
    )
    nodeSelector: dict[str, str] = Field(default_factory=dict)
    maxBatchSize: int = Field(64, ge=1, le=4096)
    port: int = Field(8000, ge=1, le=65535)
    strategy: Strategy = Field(
        default_factory=Strategy,
        description="the engine Deployment's rollout; by default one GPU pod at a time",
    )
    podAnnotations: dict[str, str] = Field(
        default_factory=dict, description="annotations added to the engine pods"
    )
    template: PodTemplate = Field(
        default_factory=PodTemplate,
        description="merged into the engine pods: tolerations, affinity, env, volumes, ...",
    )


# Auto's start value when the spec gives none: until the first calibration decides (about two
# minutes), speculating past the crossover on a busy fleet costs far more than not speculating
# below it on a quiet one (spectune-sim: 0.83x the best fixed threshold in a busy H100 fleet's
# first window with no threshold, 0.998x from 8 or 16), and small batches are where
# speculation pays on every SKU.
DEFAULT_START_THRESHOLD = 8


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
        None,
        ge=0,
        le=4096,
        description="pinned threshold (Manual); start value otherwise: unset, Auto starts "
        f"from {DEFAULT_START_THRESHOLD} (within min..max) and Advisory leaves the engines "
        "speculating at every batch",
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
                cel(
                    f"!has(self.draftVolume) || (has(self.draft) && {inside_volume('self.draft')})",
                    "with speculation.draftVolume, speculation.draft is the draft's directory "
                    "inside it: a relative path without '..'",
                ),
            ]
        },
    )
    method: Literal["draft", "ngram", "none"] = "ngram"
    draft: str | None = Field(
        None,
        min_length=1,
        max_length=512,
        description="draft checkpoint: inside `draftVolume` when given, else in the image or a "
        "built-in name",
    )
    draftVolume: dict[str, Any] | None = volume_source("draft's weights")
    numSpeculativeTokens: int = Field(4, ge=1, le=16)
    threshold: ThresholdSpec = Field(default_factory=ThresholdSpec)


class SloSpec(Spec):
    ttftMilliseconds: int = Field(1000, ge=1, le=600_000)
    tpotMilliseconds: int = Field(100, ge=1, le=60_000)


class TuningSpec(Spec):
    calibrationWindowSeconds: int | None = Field(
        None,
        ge=10,
        le=86_400,
        description="seconds of metrics a calibration reads per phase; unset: 8 scrapes at the "
        "interval Prometheus is seen scraping the engines, 120 at least "
        "(status.calibrationWindowSeconds says which)",
    )
    explorationPercent: int = Field(
        2,
        ge=0,
        le=50,
        description="share of iterations run plain where the threshold speculates "
        "(speculation past it is explored only while calibrating)",
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
    # Goodput counts requests against a per-request TPOT, and speculation spreads TPOT across
    # requests (each drafts at its own acceptance) where plain decoding does not: in
    # benchmarks/calibration_bias.py's closed loop on a simulated L4 drafting at 0.44 +/- 0.1 a
    # token, at batch 4 speculation decoded 3% faster and its requests' p90 TPOT was 9% longer,
    # and on a busy L4 fleet every threshold speculating where speedup read 1.00-1.05 lost
    # goodput to plain decoding (docs/PERFORMANCE.md).
    requiredGainPercent: int = Field(
        5,
        ge=0,
        le=100,
        description="how much faster speculation must decode in a batch bucket for the "
        "threshold to speculate there: the crossover is where the speedup falls to 1 + this",
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
    measuredAt: str | None = Field(
        None,
        description="when this SKU's crossover was last measured: a SKU whose pods leave and "
        "come back runs this threshold again, re-measured only once this is older than "
        "tuning.maxAgeSeconds",
    )
    goneSince: str | None = Field(
        None,
        description="when the last pod on this SKU left (none is scraped since): gone for "
        "longer than tuning.maxAgeSeconds, the SKU leaves status",
    )


class BucketSums(BaseModel):
    """One batch bucket's decode steps over a window, both modes summed."""

    steps: int
    tokens: int
    seconds: float


# What a calibration found on a SKU (engine/crossover.py's statuses, less unknown).
Outcome = Literal["crosses", "always_pays", "never_pays"]


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
        description="SKU -> the smallest batch measured, or the SKU's threshold where that is "
        "lower, for SKUs where speculation paid at no batch measured: traffic running below it "
        "(speculating, unmeasured) re-measures",
    )
    covered: dict[str, list[int]] | None = Field(
        default=None,
        description="SKU -> [smallest, largest] batch bucket measured in both modes: a replica "
        "change re-measures only once the load runs outside it",
    )
    outcomes: dict[str, Outcome] = Field(
        default_factory=dict,
        description="SKU -> what the measurement found: a crossing, or speculation paying at "
        "every batch measured or at none. A traffic shift that moves speedup the way a one-sided "
        "finding already points (down where it paid at none, up where it paid at every batch) "
        "leaves it true and re-measures nothing",
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
        "kept (failed, aborted, cancelled or rolled back) or with a move the minimum dwell "
        "held back (re-measured once it has passed). A spec change or a GPU SKU not measured "
        "yet re-measures at once all the same, unless calibrations are failing",
    )
    failures: int = Field(
        0,
        ge=0,
        description="calibrations in a row that measured nothing (too little traffic, "
        "Prometheus gone): each waits twice as long as the one before to retry, up to "
        "tuning.maxAgeSeconds",
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
    extendedAt: str | None = Field(
        None,
        description="when this calibration went on exploring past its window: the buckets "
        "deciding a crossover were too noisy to decide on",
    )
    exploreBelow: int | None = Field(
        None,
        description="past the threshold, this calibration explores speculation only at batches "
        "below this: a traffic shift moves the crossover by a bounded factor, so it is measured "
        "near the thresholds in force (from the next bucket, widened while speculation clearly "
        "pays at the range's top), not at batches far past them; traffic below a floor is "
        "measured below the floor; and once speculation clearly loses at a measured batch on "
        "every SKU it loses from there up; null: at every batch",
    )
    losesFrom: int | None = Field(
        None,
        description="the batch from which speculation was measured clearly losing on every "
        "SKU: where this calibration narrowed its range, or the floor it measures below; "
        "traffic running only past its range never widens it past this",
    )
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
    calibrationWindowSeconds: int | None = Field(
        None, description="the calibration window in force: the spec's, or 8 scrape intervals"
    )
    conditions: list[Condition] = Field(default_factory=list)


def parse_spec(spec: dict[str, Any]) -> SpecDeploymentSpec:
    """The operator's view of a spec (the API server already validated and defaulted it)."""
    return SpecDeploymentSpec.model_validate(spec)
