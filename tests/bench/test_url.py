"""The bench against a real `spectune-engine serve` on a loopback port: policies switched
through the admin API and put back afterwards, counters read from /metrics; and bad
targets (nothing listening, a server answering errors, no prompts) fail with one
readable line, a non-zero exit and what was measured on disk."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from spectune.engine.bench.schema import BenchResult
from spectune.engine.bench.targets import HttpTarget
from spectune.engine.cli import main
from tests.server.support import Served, start_server, stop_server


@pytest.fixture(scope="module")
def served(tiny_pair, tmp_path_factory) -> Iterator[Served]:
    config = {
        "model": "tiny-target",
        "draft": "tiny-draft",
        "max_model_len": 256,
        "speculation": {"k": 4, "threshold": 6},
    }
    server = start_server(tmp_path_factory.mktemp("bench-server"), config)
    yield server
    stop_server(server)


def bench(out: Path, *args: str) -> int:
    return main(["bench", "--sweep", "load", "--output-tokens", "8", "--out", str(out), *args])


def result(out: Path) -> BenchResult:
    return BenchResult.model_validate_json((out / "bench.json").read_text())


def error_line(capsys) -> str:
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines, "no error printed"
    assert lines[-1].startswith("spectune-engine: error: ")
    return lines[-1]


def test_policies_against_a_url(served: Served, tmp_path: Path) -> None:
    code = bench(
        tmp_path, "--url", served.url, "--admin-token-file", str(served.token_file),
        "--rate", "20,40", "--requests", "4", "--policies", "never,always",
    )  # fmt: skip
    assert code == 0
    r = result(tmp_path)
    assert r.status == "complete" and r.load_sweep.kind == "open"
    assert (r.target.url, r.target.model, r.target.method, r.target.k) == (
        served.url, "tiny-target", "draft", 4,
    )  # fmt: skip
    assert [(v.policy, v.threshold, v.ok) for v in r.load_sweep.levels] == [
        ("never", 0, 4), ("always", None, 4), ("never", 0, 4), ("always", None, 4),
    ]  # fmt: skip
    assert all(v.acceptance is None for v in r.load_sweep.levels if v.policy == "never")
    assert all(v.acceptance > 0 for v in r.load_sweep.levels if v.policy == "always")
    # per-bucket steps from /metrics: which batches both modes reached moves with the CPU's
    # speed against the arrival rate (batch 1 lasts until the second request comes)
    assert r.load_sweep.points and {p.batch for p in r.load_sweep.points} <= {1, 2, 3, 4}
    assert served.get("/admin/speculation").json()["threshold"] == 6  # put back


def test_nothing_listening(tmp_path: Path, capsys) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    assert bench(tmp_path, "--url", f"http://127.0.0.1:{port}", "--policies", "current") == 2
    line = error_line(capsys)
    assert f"cannot reach http://127.0.0.1:{port}" in line and "partial results" in line
    assert result(tmp_path).status == "incomplete"


def test_a_server_answering_errors(served: Served, tmp_path: Path, capsys) -> None:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "y", "max_tokens": 999}\n')  # over the 256-token context
    code = bench(
        tmp_path / "out", "--url", served.url, "--policies", "current", "--prompts", str(prompts),
        "--concurrency", "1,2", "--requests", "2",
    )  # fmt: skip
    assert code == 2
    line = error_line(capsys)
    assert "every request failed at current load 1" in line and "context length" in line
    r = result(tmp_path / "out")
    assert r.status == "incomplete" and "every request failed" in r.error
    (level,) = r.load_sweep.levels  # what was measured is kept
    assert (level.load, level.ok, level.errors) == (1, 0, 2)
    assert level.first_error.startswith("HTTP 400: max_tokens 999")


def test_an_empty_prompt_file(tmp_path: Path, capsys) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert bench(tmp_path / "out", "--prompts", str(empty)) == 2
    assert "holds no prompts" in error_line(capsys)


def test_a_trace_replay_against_a_url(served: Served, tmp_path: Path) -> None:
    """The replay fits its requests into the context length the server reports in
    /v1/models (a smaller --trace-max-len wins); every window shows the threshold the
    server runs, read through its admin API."""
    args = ("--url", served.url, "--policies", "current", "--trace", "azure-conv",
            "--trace-speed", "20", "--trace-scale", "0.05", "--requests", "8")  # fmt: skip
    assert bench(tmp_path / "a", *args, "--trace-max-len", "40") == 0
    assert result(tmp_path / "a").trace.max_model_len == 40
    assert bench(tmp_path / "b", *args) == 0
    trace = result(tmp_path / "b").trace
    (run,) = trace.runs
    assert (trace.max_model_len, run.total.policy, run.total.ok) == (256, "current", 8)
    assert {tuple(w.thresholds) for w in run.windows} == {(6,)}
    assert run.total.mean_batch is not None  # from /metrics


def test_sampled_requests_reach_the_server_as_sampled(tmp_path: Path) -> None:
    """--temperature goes into every request: n-gram lookup proposes the continuation the
    text already had, which greedy decoding of this model often repeats and sampling at a high
    temperature rarely does, so the same prompts accept far fewer drafted tokens sampled."""
    config = {"model": "tiny-target", "method": "ngram", "max_model_len": 256,
              "speculation": {"k": 4}}  # fmt: skip
    (tmp_path / "ngram").mkdir()
    server = start_server(tmp_path / "ngram", config)
    acceptance = {}
    try:
        for t in ("0", "1.5"):
            out = tmp_path / t
            assert bench(out, "--url", server.url, "--concurrency", "4", "--requests", "16",
                         "--output-tokens", "24", "--policies", "current",
                         "--temperature", t) == 0  # fmt: skip
            (level,) = result(out).load_sweep.levels
            acceptance[t] = level.acceptance
    finally:
        stop_server(server)
    assert acceptance["0"] is not None and acceptance["1.5"] is not None
    assert acceptance["1.5"] < acceptance["0"] / 2, acceptance


def test_a_temperature_out_of_range(tmp_path: Path, capsys) -> None:
    assert bench(tmp_path, "--temperature", "-1") != 0
    assert "--temperature must be in [0, 100], got -1" in error_line(capsys)


def test_a_url_target_puts_back_the_exploration_it_raised(served: Served) -> None:
    """What a benchmark of calibration's cost changes on a server it does not own: the base
    share and a calibration's lease."""

    async def go() -> tuple[float, float]:
        token = served.token_file.read_text().strip()
        async with HttpTarget(served.url, None, token, 60) as target:
            await target.set_exploration(0.25)
            base = served.get("/admin/speculation").json()["exploration"]
            await target.set_exploration(0.5, lease_seconds=600)
            return base, served.get("/admin/speculation").json()["effective_exploration"]

    before = served.get("/admin/speculation").json()
    assert asyncio.run(go()) == (0.25, 0.5)
    after = served.get("/admin/speculation").json()
    assert (after["exploration"], after["lease"], after["threshold"]) == (
        before["exploration"],
        before["lease"],
        6,
    )
