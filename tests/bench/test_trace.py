"""Trace replay: the shipped Azure trace is read as recorded, a slice replays at its
compressed times with its scaled lengths (what does not fit is clipped and counted),
arrivals are open loop, the report has per-window rows and a plot, and a malformed
trace is refused with one readable line before anything runs."""

from __future__ import annotations

import asyncio
import csv
import gzip
import json
import time
import tomllib
from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path

import jsonschema
import pytest

from spectune.engine.bench.loadgen import Bounds, Counters, Finished, Output
from spectune.engine.bench.schema import BenchResult, Slo
from spectune.engine.bench.targets import EngineTarget
from spectune.engine.bench.trace import (
    TraceRequest,
    TraceSettings,
    fit,
    prompt_text,
    replay,
    replay_policies,
    slice_of,
)
from spectune.engine.bench.trace_file import BUILTIN, Recorded, Trace, load_trace
from spectune.engine.bench.workload import RequestSpec
from spectune.engine.cli import main

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = BUILTIN["azure-conv"]
# How late a send may be on a loaded 2-core machine (the engine's thread competes with
# the event loop for the GIL); a send is never early.
LATE_S = 1.0


def file_rows(count: int) -> list[tuple[datetime, int, int]]:
    """The first rows of the shipped file, read without the code under test."""
    with gzip.open(SHIPPED, "rt", newline="") as text:
        rows = list(csv.reader(text))
    assert rows[0] == ["TIMESTAMP", "ContextTokens", "GeneratedTokens"]
    return [(datetime.fromisoformat(t), int(c), int(g)) for t, c, g in rows[1 : count + 1]]


def test_the_shipped_trace_is_read_as_recorded_and_carries_its_attribution() -> None:
    trace = load_trace("azure-conv")
    assert len(trace.requests) == 19_366  # the file's README: 19,366 requests over 58 min
    assert 57 * 60 < trace.requests[-1].offset_s < 59 * 60
    rows = file_rows(50)
    got = trace.requests[:50]
    assert [(r.context_tokens, r.generated_tokens) for r in got] == [(c, g) for _, c, g in rows]
    offsets = [(t - rows[0][0]).total_seconds() for t, _, _ in rows]
    assert [r.offset_s for r in got] == pytest.approx(offsets, abs=1e-6)
    readme = (SHIPPED.parent / "README.md").read_text()
    assert "Creative Commons Attribution 4.0 International" in readme
    assert "Splitwise" in readme and "Azure Public Dataset" in readme
    # A wheel carries the trace and its README (package data), so a clone alone runs it.
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert "spectune.engine.bench.traces" in data["packages"]
    globs = data["package-data"]["spectune.engine.bench.traces"]
    shipped = {p.name for g in globs for p in SHIPPED.parent.glob(g)}
    assert shipped == {SHIPPED.name, "README.md"}


def test_lengths_scale_then_clip_to_the_model_and_every_clip_is_counted() -> None:
    trace = Trace("t", (
        Recorded(0.0, 40, 20),    # fits after scaling
        Recorded(1.0, 300, 20),   # context cut to make room for the output
        Recorded(2.0, 10, 400),   # output cut to max_len - 1, the context to 1
        Recorded(3.0, 1, 1),      # rounds to 0, kept at 1
    ))  # fmt: skip
    fitted = fit(trace, 0.5, 100)
    assert [(r.prompt_tokens, r.max_tokens) for r in fitted] == [
        (20, 10),
        (90, 10),
        (1, 99),
        (1, 1),
    ]
    assert [(r.clipped_context, r.clipped_output) for r in fitted] == [
        (False, False), (True, False), (True, True), (False, False),
    ]  # fmt: skip
    assert all(r.prompt_tokens + r.max_tokens <= 100 for r in fitted)


def test_a_slice_is_bounded_by_count_and_by_time() -> None:
    requests = [TraceRequest(float(t), 8, 8) for t in (0, 1, 2, 3, 10)]
    by_count = slice_of(requests, 1.0, Bounds(3, 100, 60))
    assert (len(by_count.requests), by_count.end_s, by_count.stopped_by) == (3, 3.0, "requests")
    by_time = slice_of(requests, 2.0, Bounds(100, 1.0, 60))  # 1 s of replay = 2 s of trace
    assert (len(by_time.requests), by_time.end_s, by_time.stopped_by) == (3, 2.0, "duration")
    whole = slice_of(requests, 1.0, Bounds(100, 100, 60))
    assert (len(whole.requests), whole.end_s, whole.stopped_by) == (5, 10.0, "end")


def test_a_slice_replays_at_its_compressed_times_with_its_lengths(tiny_engine) -> None:
    """Twelve requests, 9.4 s of trace at 6x: each reaches the engine within LATE_S of
    its trace time / 6, with exactly the scaled prompt and output lengths."""
    trace = load_trace("azure-conv")
    part = slice_of(fit(trace, 0.1, tiny_engine.max_model_len), 6.0, Bounds(12, 60, 60))
    prompts = [prompt_text(r.prompt_tokens, i) for i, r in enumerate(part.requests)]
    seen: list[RequestSpec] = []

    class Recording(EngineTarget):
        def stream(self, spec: RequestSpec) -> AsyncIterator[Output | Finished]:
            seen.append(spec)
            return super().stream(spec)

    async def go():
        async with Recording(tiny_engine) as target:
            return await replay(target, part, prompts, 6.0, 3, 60)

    run = asyncio.run(go())
    rows = file_rows(12)
    assert [r.prompt_tokens for r in part.requests] == [max(1, round(c * 0.1)) for _, c, _ in rows]
    assert [r.max_tokens for r in part.requests] == [max(1, round(g * 0.1)) for _, _, g in rows]
    assert [s.prompt for s in seen] == prompts  # sent in trace order
    tokenizer = tiny_engine.tokenizer
    assert [len(tokenizer.encode(s.prompt).ids) for s in seen] == [
        r.prompt_tokens for r in part.requests
    ]
    assert [s.max_tokens for s in seen] == [r.max_tokens for r in part.requests]
    assert all(r.ok for r in run.results), [r.error for r in run.results]
    assert [r.output_tokens for r in run.results] == [r.max_tokens for r in part.requests]
    for request, result in zip(part.requests, run.results, strict=True):
        late = result.sent_at - run.start - request.at_s / 6.0
        assert -0.005 <= late <= LATE_S, (request, late)
    sent = [r.sent_at for r in run.results]
    assert sent[-1] - sent[0] == pytest.approx(part.requests[-1].at_s / 6.0, abs=LATE_S)
    assert len(run.samples) == 4  # the start and three window ends
    steps = [s.counters.decode_steps for s in run.samples]
    assert steps == sorted(steps) and steps[-1] > 0


class SlowServer:
    """Answers every request after `delay_s`; records when each arrived and the
    thresholds it was set to."""

    def __init__(self, delay_s: float, max_model_len: int | None = 64) -> None:
        self.delay_s = delay_s
        self.max_model_len = max_model_len
        self.arrived: list[float] = []
        self.current: int | None = 7
        self.steps = 0
        self.temperatures: list[float] = []

    async def stream(self, spec: RequestSpec) -> AsyncIterator[Output | Finished]:
        self.arrived.append(time.perf_counter())
        self.temperatures.append(spec.temperature)
        await asyncio.sleep(self.delay_s)
        self.steps += 1
        yield Output()
        yield Finished(spec.max_tokens)

    async def set_threshold(self, threshold: int | None) -> None:
        self.current = threshold

    async def threshold(self) -> int | None:
        return self.current

    async def counters(self) -> Counters:
        return Counters({}, 0, 0, self.steps, 2.0 * self.steps)


def test_a_slow_server_does_not_slow_the_arrivals() -> None:
    """Open loop: ten requests due within 0.45 s are all sent on time although the
    server answers none of them for 2 s."""
    server = SlowServer(delay_s=2.0)
    requests = [TraceRequest(0.05 * i, 4, 4) for i in range(10)]
    part = slice_of(requests, 1.0, Bounds(10, 60, 60))

    async def go():
        start = time.perf_counter()
        run = await replay(server, part, ["x" * 4] * 10, 1.0, 1, 60)
        return start, run

    start, run = asyncio.run(go())
    assert len(server.arrived) == 10
    assert server.arrived[-1] - start < 0.45 + LATE_S < 2.0  # all in before any answer
    assert all(r.ok and r.done_at - r.sent_at >= 2.0 for r in run.results)


def test_per_window_report_counts_arrivals_thresholds_and_clipping() -> None:
    server = SlowServer(delay_s=0.01)
    trace = Trace("t", tuple(Recorded(t, 40, 30) for t in (0, 0.1, 0.2, 0.5, 0.55, 0.6, 0.9, 1.2)))
    settings = TraceSettings(trace, speed=2.0, scale=1.0, windows=3)
    updates = []
    result = asyncio.run(
        replay_policies(
            server,
            settings,
            [("never", 0), ("current", None)],
            Bounds(100, 60, 60),
            Slo(ttft_ms=1000, tpot_ms=1000),
            lambda _line: None,
            updates.append,
            temperature=0.7,
        )
    )
    assert (result.requests, result.stopped_by, result.trace_seconds) == (8, "end", 1.2)
    assert result.temperature == 0.7 and server.temperatures == [0.7] * 16  # 8 per policy
    assert (result.max_model_len, result.clipped_context, result.clipped_output) == (64, 8, 0)
    assert (result.prompt_tokens_mean, result.output_tokens_mean) == (34, 30)
    assert updates[0].runs == [] and updates[-1] == result
    never, current = result.runs
    assert never.total.policy == "never" and never.total.ok == 8
    assert [w.arrivals for w in never.windows] == [3, 3, 2]  # [0, 0.4), [0.4, 0.8), [0.8, 1.2]
    assert [w.start_s for w in never.windows] == [0.0, 0.4, 0.8]
    assert all(w.seconds == pytest.approx(0.2) for w in never.windows)
    assert all(w.thresholds == [0] for w in never.windows)
    assert all(w.thresholds == [0] for w in current.windows)  # 'current' changes nothing
    assert all(w.mean_batch in (None, 2.0) for w in never.windows)


def test_a_server_that_hides_its_context_length_needs_trace_max_len() -> None:
    trace = Trace("t", (Recorded(0, 4, 4), Recorded(1, 4, 4)))
    with pytest.raises(ValueError, match="pass --trace-max-len"):
        asyncio.run(
            replay_policies(
                SlowServer(0.0, max_model_len=None),
                TraceSettings(trace),
                [("current", None)],
                Bounds(10, 10, 10),
                Slo(ttft_ms=1, tpot_ms=1),
                lambda _line: None,
                lambda _r: None,
            )
        )


def test_bench_replays_the_shipped_trace_and_reports_it(tiny_pair, tmp_path: Path, capsys) -> None:
    out = tmp_path / "report"
    code = main(
        ["bench", "--model", str(tiny_pair[0]), "--draft", str(tiny_pair[1]), "--device", "cpu",
         "--sweep", "load", "--threshold", "4", "--policies", "never,gated",
         "--trace", "azure-conv", "--trace-speed", "8", "--trace-scale", "0.1",
         "--trace-max-len", "64", "--requests", "16", "--temperature", "1.5",
         "--out", str(out)]
    )  # fmt: skip
    assert code == 0
    captured = capsys.readouterr()
    assert "goodput gated over the trace:" in captured.out
    result = BenchResult.model_validate_json((out / "bench.json").read_text())
    jsonschema.validate(
        json.loads((out / "bench.json").read_text()),
        BenchResult.model_json_schema(mode="serialization"),
    )
    t = result.trace
    assert result.status == "complete" and result.load_sweep is None
    assert t.temperature == 1.5
    assert (t.source, t.requests, t.trace_requests, t.stopped_by) == (
        "azure-conv",
        16,
        19_366,
        "requests",
    )
    fitted = fit(load_trace("azure-conv"), 0.1, 64)[:16]
    clipped = (sum(r.clipped_context for r in fitted), sum(r.clipped_output for r in fitted))
    assert (t.clipped_context, t.clipped_output) == clipped and clipped[0] > 0
    assert f"{clipped[0]} contexts and {clipped[1]} outputs clipped" in captured.err
    assert [(r.total.policy, r.total.threshold, r.total.ok) for r in t.runs] == [
        ("never", 0, 16), ("gated", 4, 16),
    ]  # fmt: skip
    for run in t.runs:
        assert len(run.windows) == 12 and sum(w.arrivals for w in run.windows) == 16
        assert {tuple(w.thresholds) for w in run.windows} == {(run.total.threshold,)}
    assert run.total.output_tokens == sum(r.max_tokens for r in fitted)
    md = (out / "bench.md").read_text()
    assert "## Trace replay" in md and "### gated, per window" in md
    assert f"{clipped[0]} contexts and {clipped[1]} outputs clipped" in md
    assert (out / "trace.png").stat().st_size > 0


HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
ROW = "2023-11-16 18:15:46.6805900,374,44\n"


@pytest.mark.parametrize(
    ("name", "content", "says"),
    [
        (
            "cols.csv",
            "when,ContextTokens\n1,2\n",
            "no column TIMESTAMP, GeneratedTokens in its header",
        ),
        (
            "time.csv",
            HEADER + ROW + "yesterday,3,4\n",
            "line 3: TIMESTAMP 'yesterday' is not a date",
        ),
        (
            "neg.csv",
            HEADER + ROW + "2023-11-16 18:15:47,-3,4\n",
            "line 3: ContextTokens '-3' is not",
        ),
        (
            "word.csv",
            HEADER + ROW + "2023-11-16 18:15:47,3,many\n",
            "GeneratedTokens 'many' is not",
        ),
        ("short.csv", HEADER + ROW + "2023-11-16 18:15:47,3\n", "line 3: expected one field per"),
        ("empty.csv", HEADER, "holds no requests"),
        ("same.csv", HEADER + ROW + ROW, "every request has the same TIMESTAMP"),
        ("plain.csv.gz", HEADER + ROW, "the name ends in .gz but it is not gzip data"),
        ("binary.csv", "\udcff\udcfe", "not UTF-8 text"),
    ],
)
def test_a_malformed_trace_is_one_readable_line(
    tmp_path: Path, capsys, name: str, content: str, says: str
) -> None:
    path = tmp_path / name
    path.write_bytes(content.encode("utf-8", "surrogateescape"))
    out = tmp_path / "report"
    assert main(["bench", "--sweep", "load", "--trace", str(path), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"spectune-engine: error: trace {path}") and says in err, err
    assert "\n" not in err
    assert not out.exists()  # refused before anything ran


def test_a_missing_trace_file_is_one_readable_line(tmp_path: Path, capsys) -> None:
    path = tmp_path / "nowhere.csv"
    assert main(["bench", "--trace", str(path), "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"spectune-engine: error: trace {path}: No such file or directory"


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--rounds", "2"], "no --rounds, --prompts"),
        (["--rate", "1"], "--trace replaces load levels"),
        (["--trace-speed", "0"], "--trace-speed and --trace-scale must be positive"),
        (["--trace-scale", "nan"], "--trace-speed and --trace-scale must be positive"),
        (["--sweep", "load"], "gating a trace replay needs --threshold"),
        (["--trace-max-len", "1"], "--trace-max-len must be at least 2"),
    ],
)
def test_trace_settings_that_cannot_work(
    tmp_path: Path, capsys, args: list[str], says: str
) -> None:
    out = tmp_path / "r"
    assert main(["bench", "--trace", "azure-conv", *args, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("spectune-engine: error: ") and says in err and "\n" not in err
    assert not out.exists()  # refused before anything ran


def test_trace_flags_without_a_trace_are_refused(tmp_path: Path, capsys) -> None:
    out = tmp_path / "r"
    assert main(["bench", "--trace-scale", "0.1", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "spectune-engine: error: --trace-scale needs --trace"
    assert not out.exists()
