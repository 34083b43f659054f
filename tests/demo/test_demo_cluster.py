"""The demo (`make demo`) cut to its first phase (a short calibration window) on the real local
cluster: the chart installed, its operator run as the chart's ServiceAccount, real engines
behind the pods, real Prometheus. The report must tell the run as it happened, and nothing of
the demo may be left running. (The five phases take about 11 minutes on this machine: too long
for `make test`; README, "The demo".)"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from spectune.demo.cluster import NAMESPACE
from spectune.demo.timeline import CHANGED, TRIGGERED, Timeline
from spectune.demo.verdict import verdict
from spectune.operator.models import GROUP, KIND, VERSION
from tests.cluster.support import REPO, Cluster

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


EARLIER = "threshold 8 -> 12 (an earlier run's)"


def an_earlier_runs_event(cluster: Cluster) -> None:
    """A ThresholdChanged Event about an earlier SpecDeployment `demo`, deleted since: Events
    outlive their object, and a second `make demo` on a running cluster must not read it."""
    with cluster.api() as admin:
        core = client.CoreV1Api(admin)
        with contextlib.suppress(ApiException):  # there already: the demo (or a test) made it
            core.create_namespace({"metadata": {"name": NAMESPACE}})
        now = datetime.now(UTC)
        core.create_namespaced_event(
            NAMESPACE,
            {
                "metadata": {"generateName": "demo."},
                "involvedObject": {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND,
                                   "name": "demo", "namespace": NAMESPACE,
                                   "uid": str(uuid.uuid4())},
                "reason": CHANGED, "message": EARLIER, "type": "Normal",
                "firstTimestamp": now, "lastTimestamp": now,
            },
        )  # fmt: skip


@pytest.fixture(scope="module")
def demo(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("demo")
    an_earlier_runs_event(cluster)
    run = subprocess.run(
        [sys.executable, "-m", "spectune.demo.run", "--phases", "quiet", "--window", "20",
         "--no-set-up", "--out", str(out)],
        capture_output=True, text=True, timeout=600, cwd=REPO,
    )  # fmt: skip
    print(run.stdout[-6000:], run.stderr[-3000:])
    assert run.returncode == 0, run.stderr[-2000:]
    return out, run.stdout


def test_the_first_calibration_moves_the_threshold_and_says_why(demo) -> None:
    """A few clients: speculation pays at every batch they make, so the first calibration
    moves the example's start value (8) to just past those batches (the next bucket above 3),
    not beyond what it measured, and the Events say so."""
    out, stdout = demo
    timeline = Timeline.model_validate_json((out / "demo.json").read_text())
    (quiet,) = timeline.phases
    assert quiet.name == "quiet" and quiet.threshold == 4, quiet
    assert quiet.crossover is None and not quiet.crosses
    assert 2 <= quiet.mean_batch <= quiet.peak_batch <= 3, quiet  # three closed-loop clients
    started = [m.message for m in timeline.marks if m.reason == TRIGGERED]
    assert started and "no crossover measured yet" in started[0]
    changed = [m.message for m in timeline.marks if m.reason == CHANGED]
    assert any("threshold 8 -> 4" in m and "pays at every batch measured" in m for m in changed)
    assert not any(EARLIER in m for m in changed), changed
    result = verdict(timeline, min_changes=1)
    assert result.ok and len(result.changes) == 1 and result.unexplained == 0, result.lines()
    assert any(s.threshold == 8 for s in timeline.samples)  # the live view saw it move
    assert timeline.samples[-1].threshold == 4
    assert "the operator reacted after" in stdout


def test_the_report_tells_what_the_run_measured(demo) -> None:
    out, _ = demo
    timeline = Timeline.model_validate_json((out / "demo.json").read_text())
    report = (out / "demo.md").read_text()
    assert "simulated" in report
    (quiet,) = timeline.phases
    assert quiet.title in report
    cf = quiet.counterfactual  # each policy at the batches the engine ran, as it measured them
    assert cf is not None and cf.compared > 0.5, cf  # 50% exploration for most of the phase
    assert sum(b.share for b in cf.batches) == pytest.approx(1)
    assert max(b.batch for b in cf.batches) <= 3, cf.batches  # three clients
    tps = cf.gpu_tokens_per_s
    assert tps["auto"] == tps["always"]  # a threshold above every batch is always speculating
    # at these batches a verify forward costs what a plain one does (memory-bound): every
    # accepted draft token is a gain, as the calibration found
    assert tps["always"] > tps["never"] > 0, cf
    assert "Each policy's decode tokens per second per engine" in report
    for mark in timeline.marks:
        assert mark.message[:40] in report
    for line in verdict(timeline, min_changes=1).lines():
        assert line in report
    for png in ("threshold.png", "goodput.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_nothing_of_the_demo_keeps_running(cluster: Cluster, demo) -> None:
    """Its operator is gone, and so are its engine pods."""
    out, _ = demo
    ours = ("--leader-election-lease=spectune-demo", str(out))
    left = [c for c in command_lines() if any(o in c for o in ours)]
    assert not left, left
    assert not list((REPO / ".local" / "run").glob("demo-*.pid"))
    with cluster.api() as admin:
        pods = client.CoreV1Api(admin).list_namespaced_pod("spectune-demo").items
        assert not [p.metadata.name for p in pods if not p.metadata.deletion_timestamp]


def command_lines() -> list[str]:
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                found.append((proc / "cmdline").read_bytes().replace(b"\0", b" ").decode())
            except OSError:
                continue
    return found
