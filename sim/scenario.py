"""A simulation scenario as a YAML file: the traffic, the fleet, the SpecDeployment the operator
tunes, the timed events and the policies compared. pydantic checks it; a file that does not
check gets one readable line (`ScenarioError`), and the CLI exits 2 on it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from spectune.engine.device_time import SKUS
from spectune.operator.autotune import window_too_short
from spectune.operator.models import SpecDeploymentSpec


class ScenarioError(ValueError):
    """A scenario that cannot be run, said in one line."""


class Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TraceSource(Model):
    """A recorded trace replayed at `speed` x, lengths x `scale`, `copies` overlaid (each
    shifted by a fraction of a second, so that a few pods' trace drives a large fleet)."""

    name: str = "azure-conv"  # a built-in name or a CSV file in the trace format
    speed: float = Field(1.0, gt=0)
    scale: float = Field(1.0, gt=0)
    copies: int = Field(1, ge=1, le=1000)
    start_s: float = Field(0.0, ge=0)  # where in the trace to start
    duration_s: float | None = Field(None, gt=0)  # of trace time; default: to its end


class SyntheticSource(Model):
    """Poisson arrivals of fixed-length requests: tests and small studies."""

    rate: float = Field(gt=0)  # requests per second
    prompt_tokens: int = Field(ge=1)
    output_tokens: int = Field(ge=1)
    duration_s: float = Field(gt=0)


class Acceptance(Model):
    """Per request, the probability each drafted token is accepted: a Beta distribution with
    this mean and standard deviation (0: every request the same)."""

    mean: float = Field(0.7, ge=0, le=1)
    spread: float = Field(0.1, ge=0, le=0.5)


class Slo(Model):
    ttft_ms: float = Field(gt=0)
    tpot_ms: float = Field(gt=0)


class Bulk(Model):
    """A second class of requests beside the traffic's (the interactive class): bulk work with
    long outputs on a loose SLO, Poisson arrivals making up `share` of all requests. The
    engines count SLO-met against the SpecDeployment's SLO (the one they know, what the
    operator reads); the report counts each class against its own. Timed shifts apply to the
    interactive class only."""

    share: float = Field(gt=0, lt=1)
    prompt_tokens: int = Field(ge=1)
    output_tokens: int = Field(ge=1)
    slo: Slo
    acceptance: Acceptance | None = None  # default: the scenario's


class Split(Model):
    """The seed's second remedy beside one pool: the same pods as two, routed by class. For
    each count in `interactive_pods`, that many speculate (`auto`) on the interactive requests
    and the rest of the fleet serves the bulk ones plain (`never`)."""

    interactive_pods: list[int] = Field(min_length=1)


class Pool(Model):
    sku: str
    replicas: int = Field(ge=0, le=1000)
    kv_cache_gib: float | None = Field(None, gt=0)  # per pod; default: the fleet's

    @field_validator("sku")
    @classmethod
    def known_sku(cls, v: str) -> str:
        if v not in SKUS:
            raise ValueError(f"unknown SKU {v!r}; simulated SKUs: {', '.join(SKUS)}")
        return v


class Fleet(Model):
    pools: list[Pool] = Field(min_length=1)
    kv_cache_gib: float = Field(20.0, gt=0)  # per pod, the draft's KV included (pools may override)
    max_model_len: int = Field(8192, ge=2)
    startup_s: float = Field(30.0, ge=0)  # from creation to ready
    max_queue: int = Field(256, ge=0)  # waiting requests per pod before 429
    routing: Literal["random", "least-loaded"] = "random"  # a Service picks at random


class Autoscaler(Model):
    """HPA-like: every `period_s` the desired replicas are ceil(ready x metric / target),
    within [min, max]; a scale down waits for the highest desire in `stabilization_s`."""

    metric: Literal["running", "waiting"] = "running"  # per pod, averaged
    target: float = Field(gt=0)
    min: int = Field(1, ge=1)
    max: int = Field(ge=1)
    period_s: float = Field(15.0, gt=0)
    stabilization_s: float = Field(300.0, ge=0)

    @model_validator(mode="after")
    def ordered(self) -> Autoscaler:
        if self.min > self.max:
            raise ValueError(f"autoscaler min ({self.min}) exceeds max ({self.max})")
        return self


class Operator(Model):
    resync_s: float = Field(10.0, gt=0)
    settings_delay_s: float = Field(1.0, ge=0)  # from a committed turn to engines running it
    scrape_interval_s: float = Field(15.0, gt=0)
    exploration_lease_s: float = Field(60.0, ge=20)


class Scale(Model):
    kind: Literal["scale"]
    at_s: float = Field(ge=0)
    replicas: int = Field(ge=0, le=1000)
    sku: str | None = None  # the pool; default: the first


class Migrate(Model):
    """Every pod of pool `from_sku` replaced by pods of `to_sku` (a rolling node-pool move)."""

    kind: Literal["migrate"]
    at_s: float = Field(ge=0)
    from_sku: str
    to_sku: str


class AcceptanceShift(Model):
    kind: Literal["acceptance"]
    at_s: float = Field(ge=0)
    mean: float = Field(ge=0, le=1)
    spread: float = Field(0.1, ge=0, le=0.5)


class ContextShift(Model):
    """Prompt lengths of requests arriving from `at_s` on, x `scale`."""

    kind: Literal["context"]
    at_s: float = Field(ge=0)
    scale: float = Field(gt=0)


class LoadShift(Model):
    """Arrivals from `at_s` on, x `scale`: each request kept with probability `scale` below
    1, sent again as often as `scale` says above it (same lengths, its own acceptance)."""

    kind: Literal["load"]
    at_s: float = Field(ge=0)
    scale: float = Field(ge=0, le=100)


class PrometheusOutage(Model):
    kind: Literal["prometheus_outage"]
    at_s: float = Field(ge=0)
    duration_s: float = Field(gt=0)


class OperatorRestart(Model):
    kind: Literal["operator_restart"]
    at_s: float = Field(ge=0)
    down_s: float = Field(10.0, ge=0)


TimedEvent = Annotated[
    Scale
    | Migrate
    | AcceptanceShift
    | ContextShift
    | LoadShift
    | PrometheusOutage
    | OperatorRestart,
    Field(discriminator="kind"),
]
Policy = Literal["auto", "never", "always"] | int


class Scenario(Model):
    name: str = "scenario"
    traffic: TraceSource | SyntheticSource
    acceptance: Acceptance = Field(default_factory=Acceptance)
    fleet: Fleet
    spec: SpecDeploymentSpec  # the SpecDeployment the operator tunes (replicas: the pools')
    operator: Operator = Field(default_factory=Operator)
    autoscaler: Autoscaler | None = None
    bulk: Bulk | None = None
    split: Split | None = None  # `spectune-sim split`: one pool against split fleets
    events: list[TimedEvent] = Field(default_factory=list)
    policies: list[Policy] = Field(default_factory=lambda: ["auto", "never", "always"])
    seeds: list[int] = Field(default_factory=lambda: [0], min_length=1)

    @field_validator("seeds")
    @classmethod
    def seeds_distinct(cls, v: list[int]) -> list[int]:
        if len(set(v)) != len(v):
            raise ValueError("a seed is listed twice")
        return v

    window_s: float = Field(300.0, gt=0)  # report windows

    @field_validator("policies")
    @classmethod
    def thresholds_positive(cls, v: list[Policy]) -> list[Policy]:
        for p in v:
            if isinstance(p, int) and p < 1:
                raise ValueError(f"a fixed threshold must be >= 1 (use 'never' for 0), got {p}")
        if len(set(map(str, v))) != len(v):
            raise ValueError("a policy is listed twice")
        return v

    @model_validator(mode="after")
    def skus_known(self) -> Scenario:
        pools = {p.sku for p in self.fleet.pools}
        if len(pools) != len(self.fleet.pools):
            raise ValueError("fleet.pools: a SKU has two pools")
        for e in self.events:
            for sku in (getattr(e, "sku", None), getattr(e, "from_sku", None),
                        getattr(e, "to_sku", None)):  # fmt: skip
                if sku is not None and sku not in SKUS:
                    raise ValueError(f"event at {e.at_s} s: unknown SKU {sku!r}")
            if isinstance(e, Migrate):
                if e.from_sku not in pools:
                    raise ValueError(f"event at {e.at_s} s: no pool {e.from_sku!r} to migrate from")
                pools.add(e.to_sku)
            if isinstance(e, Scale) and e.sku is not None:
                pools.add(e.sku)  # a scale may open a pool
        return self

    @model_validator(mode="after")
    def window_holds_scrapes(self) -> Scenario:
        """The operator refuses a calibration window of too few scrapes; a scenario asking for
        one would show an autotuner that never measures."""
        if too_short := window_too_short(self.spec, self.operator.scrape_interval_s):
            raise ValueError(f"spec.{too_short} (operator.scrape_interval_s)")
        return self

    @model_validator(mode="after")
    def split_of_one_pool(self) -> Scenario:
        """A split is compared at equal GPU count: one fixed pool, cut in two."""
        if self.split is None:
            return self
        if self.bulk is None:
            raise ValueError("split: needs a bulk class to route to the plain pool")
        fixed = not any(isinstance(e, Scale | Migrate) for e in self.events)
        if len(self.fleet.pools) != 1 or self.autoscaler is not None or not fixed:
            raise ValueError(
                "split: compares one fixed pool (no autoscaler, scale or migrate) with split fleets"
            )
        pods = self.fleet.pools[0].replicas
        for n in self.split.interactive_pods:
            if not 1 <= n < pods:
                raise ValueError(
                    f"split.interactive_pods: {n} leaves no pod to one class of the {pods}"
                )
        return self

    def kv_cache_gib(self, sku: str) -> float:
        pool = next((p for p in self.fleet.pools if p.sku == sku), None)
        return pool.kv_cache_gib if pool and pool.kv_cache_gib else self.fleet.kv_cache_gib

    @property
    def replicas(self) -> int:
        return sum(p.replicas for p in self.fleet.pools)


def _where(err: ValidationError) -> str:
    first = err.errors()[0]
    where = ".".join(str(p) for p in first["loc"] if not str(p).startswith("function-"))
    return f"{where or 'the file'}: {first['msg']}"


def parse_scenario(data: Any, source: str = "scenario") -> Scenario:
    if not isinstance(data, dict):
        raise ScenarioError(f"{source}: expected a mapping at the top, got {type(data).__name__}")
    try:
        return Scenario.model_validate(data)
    except ValidationError as err:
        raise ScenarioError(f"{source}: {_where(err)}") from None


def load_scenario(path: str | Path) -> Scenario:
    """A scenario file, or ScenarioError naming the file and the first problem in it."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as err:
        raise ScenarioError(f"{path}: {err.strerror or err}") from None
    except UnicodeDecodeError:
        raise ScenarioError(f"{path}: not UTF-8 text (expected YAML)") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        line = f" at line {mark.line + 1}" if mark is not None else ""
        raise ScenarioError(f"{path}: not valid YAML{line}") from None
    return parse_scenario(data, str(path))
