"""spectune-sim's command line, in process and as the installed script: bad input is one line
on stderr starting `spectune-sim: ` and exit code 2; every example scenario checks; `schema`
prints the JSON Schema; `run` hands simulate the overrides and writes the report (a stand-in
simulate here, so that no simulation runs)."""

from __future__ import annotations

import json
import subprocess
import sys
import types
from pathlib import Path

import jsonschema
import pytest

from spectune.sim.cli import main
from spectune.sim.results import Run, SimResult, Window

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "examples" / "sim").glob("*.yaml"))

GOOD = """\
name: tiny one
traffic: {rate: 1, prompt_tokens: 10, output_tokens: 10, duration_s: 60}
fleet:
  pools: [{sku: H100, replicas: 1}]
spec:
  model: {name: m}
policies: [auto, never]
"""
BAD = {
    "missing": None,
    "yaml": "traffic: {rate: 1\nfleet: [\n",
    "sku": GOOD.replace("sku: H100", "sku: B300"),
    "field": GOOD + "colour: red\n",
    "spec": GOOD.replace("model: {name: m}", "model: {}"),
    "trace": GOOD.replace(
        "traffic: {rate: 1, prompt_tokens: 10, output_tokens: 10, duration_s: 60}",
        "traffic: {name: no-such-trace.csv}",
    ),
}
WHY = {
    "missing": "No such file",
    "yaml": "not valid YAML at line",
    "sku": "unknown SKU 'B300'",
    "field": "colour",
    "spec": "spec.model.name",
    "trace": "trace no-such-trace.csv",
}


def scenario(tmp_path: Path, name: str, text: str | None) -> Path:
    path = tmp_path / f"{name}.yaml"
    if text is not None:
        path.write_text(text)
    return path


def one_error_line(stderr: str) -> str:
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("spectune-sim: "), stderr
    return lines[0]


# `split` refuses a scenario without a split before it reads the trace (test_split.py)
@pytest.mark.parametrize(
    ("command", "case"),
    [(command, case) for command in ("check", "run", "split") for case in sorted(BAD)
     if (command, case) != ("split", "trace")],
)  # fmt: skip
def test_bad_input_is_one_line_and_exit_2(
    case: str, command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = scenario(tmp_path, case, BAD[case])
    assert main([command, str(path)]) == 2
    captured = capsys.readouterr()
    assert WHY[case] in one_error_line(captured.err)
    assert captured.out == ""


@pytest.mark.parametrize(
    ("args", "why"),
    [
        ([], "the following arguments are required: COMMAND"),
        (["simulate"], "invalid choice"),
        (["run", "x.yaml", "--policies", "0"], "use 'never' for 0"),
        (["run", "x.yaml", "--policies", "sometimes"], "unknown policy 'sometimes'"),
        (["run", "x.yaml", "--seeds", "one"], "invalid int value"),
        (["check"], "required: scenario"),
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(
    args: list[str], why: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(args) == 2
    assert why in one_error_line(capsys.readouterr().err)


def test_a_policy_or_seed_listed_twice_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = scenario(tmp_path, "good", GOOD)
    assert main(["run", str(path), "--policies", "auto", "16", "16"]) == 2
    assert "lists a policy twice" in one_error_line(capsys.readouterr().err)
    assert main(["run", str(path), "--seeds", "1", "1"]) == 2
    assert "lists a seed twice" in one_error_line(capsys.readouterr().err)


def installed() -> list[str]:
    """The installed script beside this interpreter, else the module."""
    script = Path(sys.executable).parent / "spectune-sim"
    return [str(script)] if script.exists() else [sys.executable, "-m", "spectune.sim.cli"]


@pytest.mark.parametrize("case", ["missing", "field"])
def test_the_installed_command_fails_in_one_line(case: str, tmp_path: Path) -> None:
    path = scenario(tmp_path, case, BAD[case])
    done = subprocess.run(
        [*installed(), "check", str(path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert WHY[case] in one_error_line(done.stderr)


def test_the_installed_schema_command_prints_the_published_schema() -> None:
    done = subprocess.run(
        [*installed(), "schema"], capture_output=True, text=True, timeout=60, check=True
    )
    schema = json.loads(done.stdout)
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema == SimResult.model_json_schema(mode="serialization")


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_every_example_checks(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", str(path)]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    assert captured.out.count("\n") == 1
    assert captured.out.startswith(f"{path}: ok: '{path.stem}'")


def test_the_examples_are_there_and_say_they_are_simulated() -> None:
    assert {p.name for p in EXAMPLES} >= {
        "h100-azure-hour.yaml",
        "hpa-2-to-12.yaml",
        "sku-migration.yaml",
        "longer-contexts.yaml",
    }
    for path in EXAMPLES:
        text = path.read_text()
        assert "SIMULATED" in text, path.name
        if "azure-conv" in text:
            assert "Azure LLM inference trace 2023, Microsoft, CC BY 4.0" in text, path.name


def tiny_run(policy: str, seed: int, window: Window) -> Run:
    return Run(
        policy=policy, seed=seed, requests=10, finished=10, rejected=0, slo_met=9, goodput=0.15,
        decode_tokens_per_s=30.0,
        tpot_p50_ms=40.0, explored_share=0.0, iterations=100, windows=[window],
        wall_seconds=0.1,
    )  # fmt: skip


def tiny_result(policies: list, seeds: list[int]) -> SimResult:
    window = Window(
        start_s=0, seconds=60, arrivals=10, finished=10, rejected=0, slo_met=9, goodput=0.15,
        decode_tokens_per_s=30.0, tpot_p50_ms=40.0, mean_running=1.0, pods=1.0, explored_share=0.0,
        thresholds={"H100": 8},
    )  # fmt: skip
    runs = [tiny_run(str(p), s, window) for p in policies for s in seeds]
    return SimResult(
        scenario="tiny one", inputs={"name": "tiny one"}, duration_s=60, window_s=60,
        pod_hours=0.1, wall_seconds=0.5,
        runs=runs,
    )  # fmt: skip


def test_run_hands_simulate_the_overrides_and_prints_the_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls = []

    def simulate(scenario, progress=None, policies=None, seeds=None, per_iteration=False):
        calls.append((scenario.name, policies, seeds, per_iteration))
        progress("halfway")
        return tiny_result(policies or scenario.policies, seeds or scenario.seeds)

    monkeypatch.setitem(sys.modules, "spectune.sim.run", types.SimpleNamespace(simulate=simulate))
    monkeypatch.chdir(tmp_path)
    path = scenario(tmp_path, "good", GOOD)
    assert main(["run", str(path), "--seeds", "3", "4", "--policies", "auto", "16"]) == 0
    assert calls == [("tiny one", ["auto", 16], [3, 4], False)]
    captured = capsys.readouterr()
    report = Path(captured.out.strip())
    assert report == Path(".cache/sim/tiny-one/report.md")
    assert "SIMULATED" in report.read_text()
    assert (report.parent / "sim.json").exists()
    assert captured.err == "halfway\n"

    out = tmp_path / "elsewhere"
    assert main(["run", str(path), "--out", str(out), "--per-iteration"]) == 0
    assert calls[-1] == ("tiny one", None, None, True)
    assert capsys.readouterr().out.strip() == str(out / "report.md")


def test_a_tiny_scenario_runs_end_to_end(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The real simulate on one pod for a simulated minute: a second or two."""
    path = scenario(tmp_path, "good", GOOD + "window_s: 30\n")
    out = tmp_path / "out"
    args = ["run", str(path), "--out", str(out), "--seeds", "0", "1"]
    assert main([*args, "--policies", "auto", "never", "8"]) == 0
    assert capsys.readouterr().out.strip() == str(out / "report.md")
    data = json.loads((out / "sim.json").read_text())
    jsonschema.validate(data, SimResult.model_json_schema(mode="serialization"))
    assert {(r["policy"], r["seed"]) for r in data["runs"]} == {
        (p, s) for p in ("auto", "never", "8") for s in (0, 1)
    }
    assert "SIMULATED" in (out / "report.md").read_text()
    assert (out / "thresholds.png").stat().st_size > 0


def test_the_command_line_and_the_report_load_no_torch_kopf_or_kubernetes() -> None:
    code = (
        "import sys, spectune.sim.cli, spectune.sim.report; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & "
        "{'torch', 'kopf', 'kubernetes', 'matplotlib'}))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "[]"  # matplotlib too: only drawing imports it
