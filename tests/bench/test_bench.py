"""`spectune-engine bench` end to end on the tiny pair, in-process: the report validates
against its schema, and the crossover the load sweep sees agrees with the batch sweep."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from spectune.engine.bench.batch_sweep import SweepSettings
from spectune.engine.bench.runner import BenchSettings, run, turn_order
from spectune.engine.bench.schema import BenchResult, Slo
from spectune.engine.cli import main

from .modeled_device import ModeledDevice


def read_result(out: Path) -> BenchResult:
    return BenchResult.model_validate_json((out / "bench.json").read_text())


def test_small_sweep_writes_a_valid_report(tiny_pair, tmp_path: Path, capsys) -> None:
    out = tmp_path / "report"
    code = main(
        ["bench", "--model", str(tiny_pair[0]), "--draft", str(tiny_pair[1]), "--device", "cpu",
         "--batch-sizes", "1,2,4", "--iterations", "4", "--concurrency", "1,4",
         "--requests", "8", "--output-tokens", "uniform:8-24", "--out", str(out),
         "--stop-after", "0",  # every size: a busy CPU may time speculation losing at 1 and 2
         "--duration-s", "900"]  # every request sent: a busy CPU sent 6 of 8 within 120 s
    )  # fmt: skip
    assert code == 0
    stdout = capsys.readouterr().out
    assert "crossover:" in stdout and "goodput gated at load 4:" in stdout
    result = read_result(out)
    assert result.status == "complete" and result.error is None
    assert [p.batch for p in result.batch_sweep.points] == [1, 2, 4]
    assert all(p.spec_tokens_per_step > p.plain_tokens_per_step for p in result.batch_sweep.points)
    levels = result.load_sweep.levels
    assert {(v.policy, v.load) for v in levels} == {
        (p, c) for p in ("never", "always", "gated") for c in (1.0, 4.0)
    }
    assert all(v.ok == v.requests == 8 for v in levels)
    for load in (1.0, 4.0):  # every policy got the same requests
        assert len({v.output_tokens for v in levels if v.load == load}) == 1
    assert all(v.acceptance is None for v in levels if v.policy == "never")
    assert all(v.acceptance > 0 for v in levels if v.policy == "always")
    assert result.verdict is not None and len(result.verdict.ratios) == 2
    assert result.roofline is not None and result.roofline.ratio > 0
    assert result.crossover_agreement_buckets is not None  # checked in the next test
    for name in ("bench.md", "speedup.png", "goodput.png"):
        assert (out / name).stat().st_size > 0
    assert "## The gate's claim" in (out / "bench.md").read_text()
    # bench.json is valid against the published schema, and the schema is not vacuous.
    schema = BenchResult.model_json_schema(mode="serialization")
    report = json.loads((out / "bench.json").read_text())
    jsonschema.validate(report, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**report, "batch_sweep": "not an object"}, schema)


def test_load_sweep_crossover_agrees_with_the_batch_sweep(tiny_pair, tmp_path: Path) -> None:
    device = ModeledDevice()
    settings = BenchSettings(
        model=str(tiny_pair[0]),
        draft=str(tiny_pair[1]),
        device="cpu",
        batch=SweepSettings((1, 2, 3, 4, 6, 8, 12), iterations=4, stop_after=2),
        loads=(1, 2, 4, 8),
        requests=16,
        rounds=2,
        duration_s=900.0,  # every request sent, on a busy CPU too
        output_lengths="24",
        slo=Slo(ttft_ms=5000, tpot_ms=1000),
        policies=("never", "always"),
        out=tmp_path,
    )
    result = run(settings, "test", lambda _line: None, make_engine=device.make_engine)
    batch, load = result.batch_sweep.crossover, result.load_sweep.crossover
    # where depends on the tiny pair's acceptance, which the CPU type moves (0.75: about 6,
    # 0.89: about 10; test_engine.py); the sweep reaches 12
    assert batch.status == "crosses" and 3 < batch.batch < 12, result.batch_sweep.points
    assert load.status == "crosses", result.load_sweep.points
    assert result.crossover_agreement_buckets <= 1
    assert result.load_sweep.gated_threshold == batch.threshold
    assert all(v.requests == v.ok == 16 for v in result.load_sweep.levels)  # 2 rounds of 8
    assert read_result(tmp_path) == result


def test_a_failing_load_sweep_keeps_the_batch_sweep(tiny_pair, tmp_path: Path, capsys) -> None:
    code = main(
        ["bench", "--model", str(tiny_pair[0]), "--draft", str(tiny_pair[1]), "--device", "cpu",
         "--batch-sizes", "1,2", "--iterations", "2", "--concurrency", "1", "--requests", "2",
         "--request-timeout-s", "0.001", "--out", str(tmp_path)]
    )  # fmt: skip
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("spectune-engine: error: every request failed at never load 1")
    assert "no complete answer within 0.001 s" in err and "partial results: " in err
    result = read_result(tmp_path)
    assert result.status == "incomplete"
    assert [p.batch for p in result.batch_sweep.points] == [1, 2]  # measured before, kept
    (level,) = result.load_sweep.levels
    assert (level.policy, level.ok, level.errors) == ("never", 0, 2)


def test_bad_batch_sizes_are_one_readable_line(tmp_path: Path, capsys) -> None:
    assert main(["bench", "--batch-sizes", "5,7", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("spectune-engine: error: --batch-sizes must be ascending batch buckets")
    assert "\n" not in err


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--url", "http://127.0.0.1:9", "--sweep", "both"], "batch sweep needs the in-process"),
        (["--url", "http://127.0.0.1:9"], "needs --admin-token-file"),
        (["--policies", "never,sometimes"], "policies are never, always, gated or current"),
        (["--concurrency", "0"], "whole numbers >= 1"),
        (["--output-tokens", "lots"], "output lengths 'lots'"),
        (["--simulate-device", "B200"], "unknown GPU SKU 'B200'; simulated SKUs: H100"),
        (["--simulate-device", "H100", "--simulate-time-scale", "-1"], "must be > 0"),
        (
            ["--simulate-device", "L4", "--url", "http://127.0.0.1:9", "--policies", "current"],
            "--simulate-device needs the in-process engine",
        ),
    ],
)
def test_settings_that_cannot_work(tmp_path: Path, capsys, args: list[str], says: str) -> None:
    assert main(["bench", *args, "--out", str(tmp_path / "r")]) == 2
    assert says in capsys.readouterr().err
    assert not (tmp_path / "r").exists()  # refused before anything ran


def test_policy_order_is_balanced_over_rounds() -> None:
    policies = ["never", "always", "gated"]
    orders = [turn_order(policies, turn) for turn in range(6)]
    assert all(sorted(o) == sorted(policies) for o in orders)
    for position in range(3):
        assert sorted(o[position] for o in orders) == sorted(policies * 2)
    follows = [(o[i], o[i + 1]) for o in orders for i in range(2)]
    assert {follows.count(pair) for pair in set(follows)} == {2}
    assert len(set(follows)) == 6
    assert turn_order(policies, 6) == orders[0]
    assert turn_order(["current"], 3) == ["current"]


def test_the_load_sweep_on_a_simulated_sku_runs_at_its_speed(tiny_pair, tmp_path: Path) -> None:
    """Clients see the SKU's latencies: an L4 step of the virtual 8B model takes 67 ms, so a
    request's time per output token cannot be less, and the report says it is simulated."""
    out = tmp_path / "report"
    code = main(
        ["bench", "--model", str(tiny_pair[0]), "--method", "ngram", "--sweep", "load",
         "--threshold", "4", "--simulate-device", "L4", "--concurrency", "2", "--requests", "4",
         "--output-tokens", "8", "--policies", "never,always", "--out", str(out)]
    )  # fmt: skip
    assert code == 0
    result = read_result(out)
    assert result.machine.device.startswith("NVIDIA-L4 (simulated, time x1) on ")
    never = next(v for v in result.load_sweep.levels if v.policy == "never")
    assert never.ok == 4
    assert never.tpot_ms.p50 >= 66.0, never.tpot_ms
