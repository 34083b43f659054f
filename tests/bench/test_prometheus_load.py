"""benchmarks/prometheus_load.py: its stand-in exporter serves the series a real engine serves,
and a tiny fleet on the real Prometheus is read in full (every engine, steps on every SKU, the
queries counted on Prometheus's side), so the benchmark cannot report figures for empty reads."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
from prometheus_client import generate_latest

from spectune.engine import contract as c
from spectune.engine.engine import Iteration
from spectune.engine.request_timing import RequestTiming
from spectune.engine.serving.metrics import EngineMetrics
from tests.server.metrics_text import parse

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "prometheus_load.py"
TARGET_LABELS = {"namespace", "pod", "container"}  # the scrape's, not the engine's


def load_benchmark() -> ModuleType:
    """The benchmark script, imported (it is not in a package)."""
    spec = importlib.util.spec_from_file_location("prometheus_load", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


bench = load_benchmark()


def test_the_stand_in_serves_the_series_an_engine_serves() -> None:
    """One pod's page against the engine's own collectors after steps in both modes at every
    bucket up to its max batch, explored and not, and a request: the same series, by name and
    labels (the SKU's and the engine's identity included), once the target's labels are off."""
    (deployment,) = bench.fleet(1, 1)
    (pod,) = deployment.pods
    page = bench.Page()
    bench.engine_series(page, pod)
    served = {
        (name, frozenset((k, v) for k, v in labels if k not in TARGET_LABELS))
        for name, labels in parse(page.render(600.0).decode())
    }
    engine = EngineMetrics({"device": pod.sku.device, "simulated": "false",
                            "model": "llama-3.1-8b", "draft": "llama-3.2-1b",
                            "version": bench.VERSION})  # fmt: skip
    for mode in c.MODES:
        for batch in bench.BATCHES:
            for explored in (False, True):
                engine.observe_iteration(Iteration(mode, batch, batch, 0.01, explored=explored))
    engine.observe_request(RequestTiming(ttft=0.1, e2e=1.0, output_tokens=10), "ok", True, 5)
    engine.observe_tokens(0.1, 1)
    assert served == set(parse(generate_latest(engine.registry).decode()))


def test_without_prometheus_one_line_says_how_to_build_it(tmp_path: Path, capsys) -> None:
    assert bench.main(["--prometheus", str(tmp_path / "prometheus")]) == 2
    err = capsys.readouterr().err.strip()
    assert "no Prometheus at" in err and "make binaries" in err and "\n" not in err


@pytest.mark.tools
@pytest.mark.slow
@pytest.mark.usefixtures("prometheus_binary")
def test_a_tiny_fleet_is_read_in_full() -> None:
    """3 deployments x 2 pods at 2 s scrapes, one on two SKUs: every turn's window holds both
    engines and decode steps on each SKU its pods run on, and Prometheus counted queries."""
    settings = bench.Settings(
        deployments=3, pods=2, scrape_interval=2, window=10, rounds=1, threads=2, targets=2
    )
    said: list[str] = []
    report = bench.run(settings, said.append)
    assert any(line.startswith("warming up") for line in said)
    for phase in (report.one_at_a_time, report.concurrent):
        assert [r.deployment for r in phase.reconciles] == ["llm-000", "llm-001", "llm-002"]
        for r in phase.reconciles:
            assert r.error is None and r.found == r.served == 2, r
            assert set(r.steps) == r.skus and all(n > 0 for n in r.steps.values()), r
        assert phase.load.queries > 0
    skus = [r.skus for r in report.one_at_a_time.reconciles]
    assert len(skus[0]) == 2 and len(set().union(*skus)) == 3  # a mixed deployment, 3 SKUs
    assert report.one_at_a_time.queries_per_read >= 1
    assert report.concurrent.load.series > 0 and report.concurrent.load.resident_bytes > 0
    table = report.table()
    assert "| queries/s per deployment at one read per 10 s | < 1 |" in table
    assert "| engines in the windows / served | all | 6 / 6 | met |" in table
