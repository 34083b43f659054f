"""The serve settings' speculation section as a file gives it: the exploration lease."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from spectune.engine.gate import Lease
from spectune.engine.serving.settings import (
    SettingsError,
    SpeculationSettings,
    load_settings,
    speculation_from_file,
)

LEASED = {
    "k": 4,
    "threshold": 32,
    "exploration": 0.02,
    "lease": {"exploration": 0.5, "until": 1796400000.0, "below": 32},
}


def write(tmp_path: Path, speculation: dict) -> Path:
    path = tmp_path / "engine.yaml"
    path.write_text(yaml.safe_dump({"speculation": speculation}))
    return path


def test_a_lease_in_the_file_validates_and_reaches_the_gate(tmp_path: Path) -> None:
    path = write(tmp_path, LEASED)
    spec = load_settings({"config_file": str(path)}, environ={}).speculation
    assert spec.lease is not None and spec.lease.until == 1796400000.0
    assert spec.gate().lease == Lease(0.5, 1796400000.0, below=32)
    assert spec.gate().exploration_at(1796399999.0) == 0.5
    assert spec.gate().exploration_at(1796400000.0) == 0.02
    assert speculation_from_file(path) == spec


def test_no_lease_is_the_default(tmp_path: Path) -> None:
    spec = speculation_from_file(write(tmp_path, {"exploration": 0.02}))
    assert spec.lease is None and spec.gate().lease is None


@pytest.mark.parametrize(
    ("lease", "said"),
    [
        ({"exploration": 1.5, "until": 1796400000.0}, "speculation.lease.exploration"),
        ({"exploration": 0.5}, "speculation.lease.until"),
        ({"exploration": 0.5, "until": 0}, "speculation.lease.until"),
        ({"exploration": 0.5, "until": 1.0, "below": 0}, "speculation.lease.below"),
        ({"exploration": 0.5, "until": 1.0, "for": 60}, "speculation.lease.for"),
    ],
)
def test_a_bad_lease_is_rejected_saying_where(tmp_path: Path, lease: dict, said: str) -> None:
    path = write(tmp_path, LEASED | {"lease": lease})
    with pytest.raises(SettingsError, match=rf"^{said}: ") as reload:
        speculation_from_file(path)
    with pytest.raises(SettingsError, match=rf"^{said}: ") as start:
        load_settings({"config_file": str(path)}, environ={})
    assert str(reload.value) == str(start.value)


def test_a_per_sku_threshold_is_found_by_the_gpus_name_as_its_node_label_spells_it() -> None:
    """torch names an H100 "NVIDIA H100 80GB HBM3"; GPU Feature Discovery labels its node, and
    the operator keys its threshold, "NVIDIA-H100-80GB-HBM3" (issue 59, M)."""
    s = SpeculationSettings(threshold=16, thresholds={"NVIDIA-H100-80GB-HBM3": 48, "cpu": None})
    assert s.on_device("NVIDIA H100 80GB HBM3").threshold == 48
    assert s.on_device("cpu").threshold is None
    assert s.on_device("NVIDIA L4").threshold == 16
    assert s.on_device("cpu").thresholds == {}
