"""The demo's report tells the run's story from the timeline alone: every phase with its
numbers, every Event, each policy on its batches, the verdict, the set-up,
'simulated' beside every simulated number, two real pictures, and a demo.json that gives the
timeline back."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from spectune.demo.report import write_report
from spectune.demo.timeline import Timeline
from spectune.demo.verdict import verdict

from .support import timeline

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> tuple[Timeline, Path, list[Path]]:
    out = tmp_path_factory.mktemp("demo")
    t = timeline()
    return t, out, write_report(t, out)


def _rows(text: str, first_cell: str) -> list[list[str]]:
    """The cells of every table row whose first cell is `first_cell`."""
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines()]
    return [r for r in rows if r[0] == first_cell]


def test_it_writes_the_four_files(report) -> None:
    _, out, paths = report
    names = ["demo.md", "demo.json", "threshold.png", "goodput.png"]
    assert paths == [out / n for n in names]


def test_each_phase_row_has_its_numbers(report) -> None:
    _, out, _ = report
    md = (out / "demo.md").read_text()
    assert _rows(md, "quiet: 8 clients, 1 pod") == [
        [
            "quiet: 8 clients, 1 pod",
            "A100",
            "1",
            "8",
            "7.5 / 8.0",
            "35.3 (crosses at batch 35.3)",
            "36",
            "0%",
            "1.50 (1.50 per engine)",
        ],
    ]
    assert _rows(md, "busy: 128 clients, 2 pods") == [
        [
            "busy: 128 clients, 2 pods",
            "A100",
            "2",
            "64/128/192",
            "33.1 / 58.2 *",
            "34.8 (crosses at batch 34.8)",
            "34",
            "3%",
            "6.20 (3.10 per engine)",
        ],
    ]
    assert _rows(md, "moved to H100") == [
        [
            "moved to H100",
            "H100",
            "2",
            "64/128/192",
            "40.3 / 60.1 *",
            "48.0 (crosses at batch 48.0)",
            "48",
            "12%",
            "8.40 (4.20 per engine)",
        ],
    ]


def test_each_mark_is_on_the_timeline(report) -> None:
    t, out, _ = report
    md = (out / "demo.md").read_text()
    for m in t.marks:
        minutes, seconds = divmod(int(m.t), 60)
        assert [f"{minutes}:{seconds:02d}", m.phase, m.reason, m.message] in [
            r[:4] for r in _rows(md, f"{minutes}:{seconds:02d}")
        ]


def test_the_modelled_policies_the_verdict_and_the_set_up_are_reported(report) -> None:
    t, out, _ = report
    md = (out / "demo.md").read_text()
    assert _rows(md, "busy *") == [
        [
            "busy *",
            "A100",
            "26 (60%), 50 (38%)",  # the batch under 5% of the time is left out
            "90%",
            "3100 (34)",
            "3040",
            "2400",
            "1.02x (never)",
        ]
    ]
    assert _rows(md, "moved *")[0][4:] == ["4200 (48)", "4250", "3900", "0.99x (never)"]
    assert _rows(md, "quiet") == [
        ["quiet", "A100", "26 (60%), 50 (38%)", "90%", "900 (36)", "700", "900", "1.00x (always)"]
    ]
    assert "auto (threshold) (simulated)" in md and "at least 20 steps each" in md
    for line in verdict(t).lines():
        assert f"- {line}\n" in md
    assert _rows(md, "simulated models") == [["simulated models", "95 s (1:35)"]]
    assert _rows(md, "engine image") == [["engine image", "3.5 s"]]
    assert "Total time: 611 s (10:11)." in md
    assert "](threshold.png)" in md and "](goodput.png)" in md


def test_simulated_numbers_say_so(report) -> None:
    _, out, _ = report
    md = (out / "demo.md").read_text()
    assert "simulated A100, H100 clock, 20x slower" in md
    assert "live goodput req/s (simulated)" in md
    assert "auto (threshold) (simulated)" in md


def test_the_pictures_are_real_pngs(report) -> None:
    _, out, _ = report
    for name in ("threshold.png", "goodput.png"):
        data = (out / name).read_bytes()
        assert data.startswith(PNG) and len(data) > 20_000
        width, height = struct.unpack(">II", data[16:24])  # the IHDR chunk
        assert width > 600 and height > 400


def test_demo_json_gives_the_timeline_back(report) -> None:
    t, out, _ = report
    assert Timeline.model_validate_json((out / "demo.json").read_text()) == t


def test_special_thresholds_read_as_policies(tmp_path: Path) -> None:
    t = timeline()
    phases = [
        t.phases[0].model_copy(update={"threshold": None}),
        t.phases[1].model_copy(update={"threshold": 0}),
    ]
    samples = [s.model_copy(update={"threshold": None}) for s in t.samples]
    write_report(t.model_copy(update={"phases": phases, "samples": samples}), tmp_path)
    md = (tmp_path / "demo.md").read_text()
    assert _rows(md, "quiet: 8 clients, 1 pod")[0][6] == "always"
    assert _rows(md, "busy: 128 clients, 2 pods")[0][6] == "never (0)"


def test_a_real_run_is_not_called_simulated_and_an_empty_one_still_reports(
    tmp_path: Path,
) -> None:
    real = timeline().model_copy(update={"simulated": False, "phases": [], "samples": []})
    paths = write_report(real, tmp_path)
    md = (tmp_path / "demo.md").read_text()
    assert "simulated" not in md.replace("simulated models", "")
    assert all(p.exists() for p in paths)


def test_the_report_judges_by_the_verdict_the_driver_uses(tmp_path: Path) -> None:
    t = timeline()
    two_changes = t.model_copy(update={"marks": t.marks[:-1]})
    write_report(two_changes, tmp_path, min_changes=2)
    md = (tmp_path / "demo.md").read_text()
    assert "- verdict: passed\n" in md and "fewer threshold changes" not in md
    write_report(two_changes, tmp_path)
    md = (tmp_path / "demo.md").read_text()
    assert "- fewer threshold changes than the 3 the demo expects\n" in md
    assert "- verdict: FAILED\n" in md and "Verdict: **FAILED**" in md


def test_a_title_without_its_phase_name_is_led_by_the_name(tmp_path: Path) -> None:
    t = timeline()
    phases = [t.phases[0].model_copy(update={"title": "a few clients"}), *t.phases[1:]]
    write_report(t.model_copy(update={"phases": phases}), tmp_path)
    assert _rows((tmp_path / "demo.md").read_text(), "quiet: a few clients")
