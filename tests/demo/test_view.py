"""The live line and the set-up lines say what a person watching needs, in a fixed width."""

from __future__ import annotations

import pytest

from spectune.demo.timeline import Sample
from spectune.demo.view import (
    short_label,
    short_sku,
    status_line,
    step_line,
    threshold_text,
)

from .support import A100, H100


@pytest.mark.parametrize(
    ("product", "short"),
    [
        (A100, "A100"),
        (H100, "H100"),
        ("NVIDIA-L4", "L4"),
        ("NVIDIA-L40S", "L40S"),
        ("Tesla-T4", "T4"),
        ("NVIDIA-GeForce-RTX-4090", "GeForce-RTX-4090"),
    ],
)
def test_short_sku_keeps_the_model(product: str, short: str) -> None:
    assert short_sku(product) == short


def _sample(**update) -> Sample:
    fields = {
        "t": 95.0,
        "phase": "busy",
        "clients": 64,
        "replicas": 1,
        "batch": {A100: 58.24},
        "threshold": 36,
        "crossover": {A100: 35.31},
        "goodput_rps": 3.1,
        "requests": 15,
        "event": f"ThresholdChanged: {A100}: threshold 96 -> 36 (crosses at batch 35.3)",
    }
    return Sample(**(fields | update))


def test_status_line_shows_the_tick() -> None:
    line = status_line(_sample(), 2, 5, "busy", width=200)
    assert line == (
        "[2/5 busy: 64 clients, 1 pod] 1:35  batch A100 58.2 | threshold 36 | crossover A100 "
        "35.3 | goodput 3.10 req/s | ThresholdChanged: A100: threshold 96 -> 36 (crosses at "
        "batch 35.3)"
    )


def test_status_line_names_each_sku_and_the_special_thresholds() -> None:
    line = status_line(
        _sample(
            replicas=2,
            batch={H100: 40.0, A100: 20.0},
            crossover={A100: 35.3, H100: None},
            threshold=None,
            event=None,
        ),
        3,
        5,
        "moved",
    )
    assert "1 pod" not in line and "2 pods" in line
    assert "batch A100 20.0, H100 40.0" in line and "crossover A100 35.3, H100 -" in line
    assert "threshold always" in line and line.endswith("goodput 3.10 req/s")
    assert "threshold never (0)" in status_line(_sample(threshold=0), 1, 1, "quiet")


@pytest.mark.parametrize("width", [40, 100, 160])
def test_status_line_fits_its_width(width: int) -> None:
    line = status_line(_sample(event="ThresholdKept: " + "x" * 300), 2, 5, "busy", width=width)
    assert len(line) == width and line.endswith("…")
    assert len(status_line(_sample(event="x" * 300), 2, 5, "busy")) == 160


def test_thresholds_read_as_policies() -> None:
    assert [threshold_text(t) for t in (None, 0, 36)] == ["always", "never (0)", "36"]


def test_short_label_keeps_the_words_that_differ() -> None:
    message = f"re-measuring the crossover: GPU SKUs changed from {A100} to {H100}"
    assert short_label(message) == "GPU SKUs changed from A100 to…"
    assert len(short_label(message)) == 30
    assert short_label("re-measuring the crossover: traffic shifted") == "traffic shifted"


def test_step_lines_say_whether_the_step_was_cached_or_built() -> None:
    cached = step_line("cluster binaries", 12.0, cold=False)
    built = step_line("cluster binaries", 1800.0, cold=True, note="a first run takes ~30 min")
    assert cached.startswith("cluster binaries ...") and cached.endswith(" 12 s (cached)")
    assert built.endswith(" 1800 s (30:00) (built: a first run takes ~30 min)")
    assert step_line("engine image", 3.52, cold=True).endswith(" 3.5 s (built)")
    started = step_line("the local cluster", 7.8, cold=True, note="seconds", done="started")
    assert started.endswith(" 7.8 s (started: seconds)")
    assert cached.index("12 s") == step_line("image", 12.0, cold=False).index("12 s")
