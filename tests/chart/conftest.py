"""helm comes from hack/build-binaries.sh like the cluster's parts (`built`)."""

from __future__ import annotations

import pytest

from tests.chart.support import HELM
from tests.cluster.support import built


@pytest.fixture(scope="session")
def helm_binary() -> None:
    """Install helm. Tests that run helm use it, and so must be marked `tools` (or `cluster`)."""
    built(HELM, "helm")
