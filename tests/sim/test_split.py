"""Two classes of requests and the split fleet: bulk arrivals leave the interactive ones as they
were, each request is judged against its class's SLO while the engines count the
SpecDeployment's, and a split routes each class to its own pool of the same pods."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from spectune.engine import contract as c
from spectune.sim.arrivals import arrivals
from spectune.sim.cli import main
from spectune.sim.engine_pod import series_key
from spectune.sim.fleet import FleetSim
from spectune.sim.scenario import ScenarioError
from spectune.sim.split import SplitResult, compare
from tests.sim.support import BASE, scenario

BULK = {"share": 0.25, "prompt_tokens": 256, "output_tokens": 256,
        "slo": {"ttft_ms": 20000, "tpot_ms": 500}}  # fmt: skip
AUTOSCALER = {"target": 8, "max": 6}
FOUR = {"pools": [{"sku": "A100", "replicas": 4}], "startup_s": 5, "kv_cache_gib": 60}


def test_bulk_requests_leave_the_interactive_ones_as_they_were() -> None:
    alone = arrivals(scenario(), seed=3)
    both = arrivals(scenario(bulk=BULK), seed=3)
    assert [a for a in both if a.workload == "interactive"] == alone
    bulk = [a for a in both if a.workload == "bulk"]
    assert {(a.prompt_tokens, a.output_tokens) for a in bulk} == {(256, 256)}
    assert len(bulk) / len(both) == pytest.approx(0.25, abs=0.05)
    assert [a.at for a in both] == sorted(a.at for a in both)


def test_each_class_meets_its_own_slo_and_the_engines_count_the_deployments() -> None:
    """TPOT 1 ms: no request meets the SpecDeployment's SLO, so the engines (what the operator
    reads) count none; every bulk request finished meets its own loose SLO."""
    spec = copy.deepcopy(BASE["spec"])
    spec["slo"]["tpotMilliseconds"] = 1
    sc = scenario(spec=spec, bulk=BULK, traffic=BASE["traffic"] | {"duration_s": 120})
    sim = FleetSim(sc, "never", 0, arrivals(sc, 0), 120.0)
    sim.run()
    run = sim.result(0.0)
    counted = sum(p.engine.series.values[series_key(c.REQUESTS_SLO_MET)] for p in sim.pods)
    assert counted == 0
    bulk, interactive = run.workloads["bulk"], run.workloads["interactive"]
    assert bulk.finished > 0 and bulk.slo_met == bulk.finished
    assert interactive.finished > 0 and interactive.slo_met == 0
    assert run.slo_met == bulk.slo_met + interactive.slo_met
    in_windows = sum(w.slo_met_by_workload["bulk"] for w in run.windows)
    assert in_windows == bulk.slo_met


def test_one_class_has_no_workloads_in_its_result() -> None:
    sc = scenario(traffic=BASE["traffic"] | {"duration_s": 60})
    sim = FleetSim(sc, "never", 0, arrivals(sc, 0), 60.0)
    sim.run()
    run = sim.result(0.0)
    assert run.workloads == {} and all(w.slo_met_by_workload == {} for w in run.windows)


def test_a_split_keeps_bulk_batches_away_from_the_interactive_requests() -> None:
    """Long bulk outputs fill every pod's batch in one pool; split 2 + 2, the interactive
    requests run on pods of their own, at smaller batches and faster tokens, and the bulk ones
    on the other two, slower: the same four pods and the same arrivals."""
    heavy = BULK | {"share": 0.5, "output_tokens": 1024}
    sc = scenario(
        fleet=FOUR,
        bulk=heavy,
        split={"interactive_pods": [2]},
        policies=["never"],
        traffic=BASE["traffic"] | {"rate": 8, "duration_s": 120},
    )
    result = compare(sc)
    (one,) = [x for x in result.layouts if x.name == "one pool, never"]
    (split,) = [x for x in result.layouts if x.name == "split 2 + 2"]
    assert (one.interactive_pods, one.bulk_pods) == (4, 0)
    assert (split.interactive_pods, split.bulk_pods) == (2, 2)
    assert split.tpot_p50_ms["interactive"] < 0.8 * one.tpot_p50_ms["interactive"]
    assert split.tpot_p50_ms["bulk"] > 1.1 * one.tpot_p50_ms["bulk"]  # on half the pods
    assert split.explored_share > 0  # the interactive pool ran auto: its calibration explored
    assert one.explored_share == 0 and split.goodput["bulk"] > 0


@pytest.mark.parametrize(
    ("changes", "why"),
    [
        ({"split": {"interactive_pods": [2]}}, "needs a bulk class"),
        ({"bulk": BULK, "split": {"interactive_pods": [4]}}, "leaves no pod to one class"),
        ({"bulk": BULK, "split": {"interactive_pods": [2]}, "autoscaler": AUTOSCALER}, "fixed"),
        ({"bulk": BULK | {"share": 1.0}}, "bulk.share"),
    ],
)
def test_a_split_that_cannot_be_compared_is_refused(changes: dict[str, Any], why: str) -> None:
    with pytest.raises(ScenarioError, match=why):
        scenario(fleet=FOUR, **changes)


def test_the_split_command_writes_its_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(
        "name: tiny split\n"
        "traffic: {rate: 4, prompt_tokens: 32, output_tokens: 32, duration_s: 60}\n"
        "bulk: {share: 0.3, prompt_tokens: 64, output_tokens: 128, "
        "slo: {ttft_ms: 10000, tpot_ms: 300}}\n"
        "split: {interactive_pods: [1]}\n"
        "fleet: {pools: [{sku: H100, replicas: 2}]}\n"
        "spec: {model: {name: m}}\n"
        "policies: [never]\n"
    )
    out = tmp_path / "out"
    assert main(["split", str(path), "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert captured.out.strip() == str(out / "split.md")
    assert "split 1 + 1" in captured.err  # progress
    data = (out / "split.json").read_text()
    jsonschema.validate(
        SplitResult.model_validate_json(data).model_dump(mode="json"),
        SplitResult.model_json_schema(mode="serialization"),
    )
    report = (out / "split.md").read_text()
    assert "SIMULATED" in report and "| split 1 + 1 | 1 + 1 |" in report


def test_the_split_command_refuses_a_scenario_without_a_split(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(
        "traffic: {rate: 1, prompt_tokens: 10, output_tokens: 10, duration_s: 60}\n"
        "fleet: {pools: [{sku: H100, replicas: 1}]}\nspec: {model: {name: m}}\n"
    )
    assert main(["split", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "has no split: section" in err
