"""helm comes from hack/build-binaries.sh like the cluster's parts: a fresh clone has none
until something builds or copies it, and the chart tests may run before any cluster test."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.chart.support import HELM
from tests.cluster.support import REPO, require_cluster_tools


@pytest.fixture(scope="session")
def helm_binary() -> None:
    """Install helm (from the per-user build cache in a second, else built from source). Tests
    that run helm use it, and so must be marked `tools` (or `cluster`)."""
    if HELM.exists():
        return
    require_cluster_tools(HELM.parent, shutil.which("go"))
    subprocess.run([str(REPO / "hack" / "build-binaries.sh"), "helm"], check=True, timeout=3600)
