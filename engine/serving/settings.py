"""`spectune-engine serve` settings: one validated object from a YAML file, environment
variables (SPECTUNE_<FIELD>) and flags, in that order of precedence (flags win).

The `speculation` section is the part that changes at run time: through the admin API,
or when the watched config file (a mounted ConfigMap) changes. Everything else needs a
restart.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from spectune.engine.contract import gpu_product
from spectune.engine.device_time import sku_named
from spectune.engine.gate import GateSettings, Lease


class SettingsError(ValueError):
    """A config file, variable or flag that does not validate; the message says which."""


class ExplorationLease(BaseModel):
    """Raised exploration that reverts by itself: the operator renews it while it calibrates.
    `until` is absolute unix time, so the ConfigMap and the admin API carry the same expiry
    (and an engine restarted after it reads it as already over); the clocks must agree (NTP).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    exploration: float = Field(ge=0, le=1, description="share of iterations run in the other mode")
    until: float = Field(gt=0, description="unix wall-clock seconds; in the past: inert")
    below: int | None = Field(
        None,
        ge=1,
        description="past the threshold, speculation is explored only at batches below this; "
        "null: at every batch",
    )


class SpeculationSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    k: int = Field(4, ge=1, le=16, description="drafted tokens per sequence per iteration")
    threshold: int | None = Field(
        None,
        ge=0,
        description="batch size at/above which speculation is off; null: always on, 0: never",
    )
    hysteresis: float = Field(
        1.0, ge=0, le=1024, description="once off, batch must fall below threshold - this"
    )
    exploration: float = Field(
        0.0, ge=0, le=1, description="share of iterations run plain where the gate speculates"
    )
    lease: ExplorationLease | None = Field(
        None, description="exploration raised until a unix time, then back to `exploration`"
    )
    thresholds: dict[str, int | None] = Field(
        default_factory=dict,
        description="per GPU product (the engine's `device`, as nvidia.com/gpu.product names "
        "it), the threshold an engine on it runs instead of `threshold`: the operator's per-SKU "
        "thresholds, which the ConfigMap and the admin API carry alike, so that each engine "
        "picks its own and no SKU's threshold reaches another's pods",
    )

    @field_validator("thresholds")
    @classmethod
    def _no_negative(cls, value: dict[str, int | None]) -> dict[str, int | None]:
        for product, threshold in value.items():
            if threshold is not None and threshold < 0:
                raise ValueError(f"{product}: a threshold is >= 0 or null, got {threshold}")
        return value

    def on_device(self, device: str) -> SpeculationSettings:
        """What an engine on `device` runs: its product's threshold where `thresholds` has one,
        else `threshold`; the map is then resolved (empty), so the admin API answers with
        what runs."""
        product = gpu_product(device)
        threshold = self.thresholds.get(product, self.threshold)
        return self.model_copy(update={"threshold": threshold, "thresholds": {}})

    def gate(self) -> GateSettings:
        lease = (
            None
            if self.lease is None
            else Lease(self.lease.exploration, self.lease.until, self.lease.below)
        )
        return GateSettings(
            threshold=self.threshold,
            hysteresis=self.hysteresis,
            exploration=self.exploration,
            lease=lease,
        )


class SloSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    ttft_ms: int = Field(1000, gt=0, description="time-to-first-token target")
    tpot_ms: int = Field(100, gt=0, description="mean time-per-output-token target")


class ServeSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str = "tiny-target"
    # The name clients ask for and /v1/models lists (vLLM's --served-model-name); unset: `model`.
    served_model_name: str | None = Field(None, min_length=1)
    draft: str | None = None
    method: Literal["auto", "draft", "ngram", "none"] = "auto"
    speculation: SpeculationSettings = SpeculationSettings()
    slo: SloSettings = SloSettings()
    max_batch_size: int = Field(64, ge=1, le=4096)
    max_queue: int = Field(256, ge=0, description="requests waiting for admission before 429")
    max_model_len: int | None = Field(None, ge=2)
    kv_cache_bytes: int | None = Field(None, ge=1)
    device: str | None = None
    # The order of operator/models.py: typing caches equal Literals, and the first one made
    # decides the order in the generated CRD.
    dtype: Literal["float32", "bfloat16", "float16"] | None = None
    # How graphed decode shapes read the paged KV cache (engine/config.py): auto is Flex in
    # place on CUDA, the gather on the CPU.
    attention: Literal["auto", "flex", "gather"] = "auto"
    # torch.compile the small ops between the matmuls (CUDA always compiles Flex): Inductor
    # builds C++ kernels on the CPU, Triton ones on CUDA, with the compiler the image carries.
    compile: bool = False
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    admin_token_file: Path | None = None
    config_file: Path | None = None
    drain_timeout_s: float = Field(30.0, ge=0)
    # One iteration running longer than this makes the engine unhealthy (/healthz 503: the
    # kubelet restarts it): it must outlast the longest legitimate iteration, a long prefill.
    hang_timeout_s: float = Field(120.0, gt=0)
    max_body_bytes: int = Field(1 << 20, ge=1024)
    seed: int = 0
    # Run on a simulated GPU SKU (engine/simulated_device.py): real tokens, the SKU's clock.
    simulate_device: str | None = None
    simulate_time_scale: float = Field(1.0, gt=0, description="modelled seconds x this")
    simulate_extra_context: int = Field(0, ge=0, description="simulated cached tokens per sequence")
    simulate_context_scale: float = Field(
        1.0, gt=0, description="simulated cached tokens per real one"
    )

    @property
    def model_id(self) -> str:
        return self.served_model_name or self.model

    @field_validator("simulate_device")
    @classmethod
    def _known_sku(cls, value: str | None) -> str | None:
        if value:
            sku_named(value)  # raises ValueError naming the SKUs there are
        return value or None


# Flat names (flags and SPECTUNE_* variables) for the nested fields.
NESTED = {
    "k": ("speculation", "k"),
    "threshold": ("speculation", "threshold"),
    "hysteresis": ("speculation", "hysteresis"),
    "exploration": ("speculation", "exploration"),
    "ttft_ms": ("slo", "ttft_ms"),
    "tpot_ms": ("slo", "tpot_ms"),
}
FLAT_FIELDS = [f for f in ServeSettings.model_fields if f not in ("speculation", "slo")] + list(
    NESTED
)


def read_file(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as err:
        raise SettingsError(f"config file {path}: {err}") from err
    if not isinstance(data, dict):
        raise SettingsError(f"config file {path}: expected a mapping at the top level")
    return data


def _overlay(base: dict[str, Any], flat: dict[str, Any]) -> dict[str, Any]:
    merged = {k: dict(v) if isinstance(v, dict) else v for k, v in base.items()}
    for key, value in flat.items():
        if key in NESTED:
            section, field = NESTED[key]
            merged.setdefault(section, {})[field] = value
        else:
            merged[key] = value
    return merged


def explain(err: ValidationError, *prefix: str) -> str:
    """The first validation error as one line: where, what, and the value given."""
    first = err.errors()[0]
    where = ".".join((*prefix, *(str(p) for p in first["loc"])))
    return f"{where}: {first['msg']} (got {first.get('input')!r})"


def _validate(data: dict[str, Any]) -> ServeSettings:
    try:
        return ServeSettings.model_validate(data)
    except ValidationError as err:
        raise SettingsError(explain(err)) from err


def load_settings(flags: dict[str, Any], environ: dict[str, str] | None = None) -> ServeSettings:
    """File < environment < flags. `flags` holds only the flags given on the command line."""
    environ = os.environ if environ is None else environ
    config_file = flags.get("config_file") or environ.get("SPECTUNE_CONFIG_FILE")
    data = read_file(Path(config_file)) if config_file else {}
    env = {
        f: environ[f"SPECTUNE_{f.upper()}"]
        for f in FLAT_FIELDS
        if f"SPECTUNE_{f.upper()}" in environ
    }
    for key in ("threshold",):  # "" or "none" in the environment means unset
        if key in env and env[key].lower() in ("", "none", "null"):
            env[key] = None
    return _validate(_overlay(_overlay(data, env), flags))


def speculation_from_file(path: Path) -> SpeculationSettings:
    """The speculation section of a changed config file, validated; SettingsError if not."""
    data = read_file(path)
    try:
        return SpeculationSettings.model_validate(data.get("speculation") or {})
    except ValidationError as err:
        raise SettingsError(explain(err, "speculation")) from err
