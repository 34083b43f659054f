"""The report of a hand-built result (2 policies x 2 seeds): sim.json validates against the
published schema, report.md is labelled SIMULATED and holds the tables and intervals, the
pictures are PNGs; the statistics match scipy's. No simulation runs: the result is made here."""

from __future__ import annotations

import json
import math
from pathlib import Path

import jsonschema
import pytest
import scipy.stats

from spectune.sim.report import (
    best_fixed,
    by_policy,
    paired,
    stat,
    steady,
    t975,
    threshold_steps,
    write_report,
)
from spectune.sim.results import (
    Calibration,
    OperatorEvent,
    Run,
    SimResult,
    ThresholdPoint,
    Window,
)

PNG = b"\x89PNG\r\n\x1a\n"
WINDOW_S = 300.0


def window(i: int, goodput: float, thresholds: dict[str, int | None], explored=0.0) -> Window:
    return Window(
        start_s=i * WINDOW_S, seconds=WINDOW_S, arrivals=100, finished=95, rejected=1,
        slo_met=int(goodput * 300),
        goodput=goodput, decode_tokens_per_s=goodput * 200,
        tpot_p50_ms=40.0, mean_running=12.0, pods=4.0,
        explored_share=explored, thresholds=thresholds,
    )  # fmt: skip


def run(policy: str, seed: int, goodputs: list[float], **operator) -> Run:
    """A run whose windows have these goodputs; auto runs move H100 from 16 to 32 at 650 s."""
    auto = policy == "auto"
    held = [16, 16, 32] if auto else [None if policy == "always" else int(policy)] * 3
    windows = [
        window(i, g, {"H100": t}, explored=0.02 if auto else 0.0)
        for i, (g, t) in enumerate(zip(goodputs, held, strict=True))
    ]
    return Run(
        policy=policy, seed=seed, requests=300, finished=285, rejected=3,
        slo_met=int(sum(goodputs) * 300), goodput=sum(goodputs) / 3,
        decode_tokens_per_s=sum(goodputs) / 3 * 200,
        tpot_p50_ms=40.0, explored_share=0.02 if auto else 0.0,
        iterations=90_000, windows=windows, wall_seconds=1.5, **operator,
    )  # fmt: skip


def auto_operator(seed: int) -> dict:
    return {
        "thresholds": [
            ThresholdPoint(at_s=0.0, sku="H100", threshold=16),
            ThresholdPoint(at_s=650.0 + seed, sku="H100", threshold=32, crossover=33.5),
        ],
        "events": [
            OperatorEvent(at_s=650.0, reason="ThresholdChanged", message="16 -> 32"),
            OperatorEvent(at_s=800.0, reason="RolledBack", message="back to 16", warning=True),
        ],
        "calibrations": [
            Calibration(
                trigger="Initial", started_s=30.0, decided_s=150.0, outcome="ThresholdKept"
            ),
            Calibration(trigger="Traffic", started_s=500.0, decided_s=None, outcome="Running"),
        ],
        "prometheus_queries": 612,
    }


def result(seeds=(0, 1)) -> SimResult:
    runs = [run("auto", s, [2.0 + s * 0.1, 3.0, 2.5 + s * 0.2], **auto_operator(s)) for s in seeds]
    runs += [run("16", s, [2.1 + s * 0.1, 2.9, 2.0 + s * 0.1]) for s in seeds]
    return SimResult(
        scenario="unit", inputs={"name": "unit"}, duration_s=900.0, window_s=WINDOW_S,
        pod_hours=2.0 * len(runs),
        wall_seconds=12.0, runs=runs,
    )  # fmt: skip


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("sim")
    report = write_report(result(), out)
    assert report == out / "report.md"
    return out


def test_sim_json_validates_against_the_published_schema(written: Path) -> None:
    data = json.loads((written / "sim.json").read_text())
    schema = SimResult.model_json_schema(mode="serialization")
    jsonschema.validate(data, schema)
    assert SimResult.model_validate(data) == result()


def test_the_report_is_labelled_simulated_and_tabulates_each_policy(written: Path) -> None:
    text = (written / "report.md").read_text()
    assert text.startswith("# spectune-sim: unit (SIMULATED)")
    assert "**SIMULATED: not a measurement.**" in text
    assert "| policy | seeds | goodput (req/s) | 95% interval |" in text
    assert "\n| auto | 2 | " in text and "\n| 16 | 2 | " in text
    overall_auto = stat([(2.0 + 3.0 + 2.5) / 3, (2.1 + 3.0 + 2.7) / 3])
    assert overall_auto.interval() in text and overall_auto.interval().startswith("[")
    assert " ± " in text  # window cells carry their intervals
    for heading in ("Goodput per window", "Decode tokens/s per window", "### Calibrations"):
        assert heading in text
    assert "best fixed in hindsight (16)" in text
    assert "![windows.png (simulated)](windows.png)" in text
    assert "pod-hours simulated per CPU-minute: 40" in text  # 8 pod-hours / 0.2 CPU-minutes


def test_auto_is_compared_seed_by_seed_with_an_interval(written: Path) -> None:
    """Each seed's runs served the same arrivals, so auto / policy is taken per seed: seed 0
    2.5 / 2.333, seed 1 2.6 / 2.4 (window goodputs averaged)."""
    text = (written / "report.md").read_text()
    per_seed = stat([2.5 / ((2.1 + 2.9 + 2.0) / 3), 2.6 / ((2.2 + 2.9 + 2.1) / 3)])
    low, high = per_seed.bounds() or (math.nan, math.nan)
    cell = f"{per_seed.mean:.3f} [{low:.3f}, {high:.3f}]"
    of_means = f"{2.55 / 2.3667:.3f}"
    assert f"| 16 | {of_means} | {cell} |" in text
    assert f"| best fixed in hindsight (16) | {of_means} | {cell} |" in text
    one = result(seeds=(0,)).runs
    assert paired(one[:1], one[1:]) == f"{2.5 / (7.0 / 3):.3f} (1 seed)"


def test_the_operator_section_counts_changes_rollbacks_and_queries(written: Path) -> None:
    text = (written / "report.md").read_text()
    # seed, ThresholdChanged, timeline steps, RolledBack, calibrations, explored, queries
    assert "| 0 | 1 | 1 | 1 | 2 | 2.00% | 612 | 2,448 | H100 32 |" in text
    assert "| 0 | Initial | 0:00:30 | 120 s | ThresholdKept |" in text
    assert "| 1 | Traffic | 0:08:20 | still running | Running |" in text
    assert "| 1 | 0:10:51 | H100 | 32 | 33.5 |" in text
    # Window 1 (300-600 s) is the only steady one: auto held 16 there, paired with policy 16.
    assert "Paired with the same fixed threshold: in 2 window(s)" in text
    assert "over the 1 window(s) where auto's thresholds were steady" in text


def test_the_pictures_are_pngs(written: Path) -> None:
    for name in ("windows.png", "thresholds.png"):
        data = (written / name).read_bytes()
        assert len(data) > 1000 and data.startswith(PNG), name


def test_one_seed_says_it_has_no_interval(tmp_path: Path) -> None:
    text = write_report(result(seeds=(0,)), tmp_path).read_text()
    assert "1 seed: no interval" in text
    assert " ± " not in text


def test_without_auto_there_is_no_operator_section_and_no_timeline(tmp_path: Path) -> None:
    only_fixed = result().model_copy(
        update={"runs": [r for r in result().runs if r.policy != "auto"]}
    )
    text = write_report(only_fixed, tmp_path).read_text()
    assert "No `auto` run in this result." in text
    assert "The operator" not in text
    assert not (tmp_path / "thresholds.png").exists()
    assert (tmp_path / "windows.png").read_bytes().startswith(PNG)


def test_the_t_quantile_matches_scipy() -> None:
    for df in [*range(1, 40), 60, 120, 1000]:
        assert t975(df) == pytest.approx(scipy.stats.t.ppf(0.975, df), abs=1e-4), df


def test_stat_is_the_mean_and_a_student_t_half_width() -> None:
    s = stat([1.0, 2.0, 3.0])
    assert s.mean == 2.0 and s.n == 3
    assert s.half == pytest.approx(4.3027 * 1.0 / math.sqrt(3))
    assert stat([5.0]).half is None


def test_an_interval_is_clipped_at_zero() -> None:
    assert stat([0.0, 0.0, 1.0]).interval() == f"[0, {stat([0.0, 0.0, 1.0]).bounds()[1]:.3g}]"


def test_best_fixed_and_steady_windows() -> None:
    groups = by_policy(result())
    best = best_fixed(groups, 2)
    assert best is not None and best[0] == "16"
    auto = groups["auto"][0]
    assert [steady(auto, i, WINDOW_S) for i in range(3)] == [False, True, False]
    assert threshold_steps(auto) == 1
