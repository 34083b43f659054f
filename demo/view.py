"""The demo's live terminal view: one line a tick, so a person watching sees the batch, the
threshold and the crossover move together, and the Event that moved them. Pure string
functions, shared with the report (SKU names, thresholds, the clock)."""

from __future__ import annotations

import re

from spectune.demo.timeline import Sample

# A GPU product label (nvidia.com/gpu.product) wherever it appears in a message.
_PRODUCT = re.compile(r"NVIDIA-[A-Za-z0-9]+(?:-[A-Za-z0-9]+)*")
# The model in a product label: a letter or two and digits (A100, H100, L4, L40S, A10G).
_MODEL = re.compile(r"[A-Z]{1,2}\d{1,4}[A-Z]?")
# What the operator puts before every CalibrationStarted message: noise in a short label.
_CALIBRATING = "re-measuring the crossover: "
STEP_COLUMN = 28  # the set-up step names are padded with dots to this width


def short_sku(product: str) -> str:
    """ "NVIDIA-A100-SXM4-40GB" -> "A100": the labels are too long for a line or a legend.
    Anything without a recognisable model keeps its name, less the "NVIDIA-" prefix."""
    parts = product.removeprefix("NVIDIA-").split("-")
    for part in parts:
        if _MODEL.fullmatch(part):
            return part
    return "-".join(parts)


def shorten_skus(text: str) -> str:
    """Every product label in an Event message, shortened as short_sku does."""
    return _PRODUCT.sub(lambda m: short_sku(m.group(0)), text)


def short_label(message: str, width: int = 30) -> str:
    """An Event message cut to `width` characters for a label on a plot, without the
    operator's fixed preamble so the words that differ survive."""
    text = shorten_skus(message.removeprefix(_CALIBRATING))
    return text if len(text) <= width else text[: width - 1] + "…"


def threshold_text(threshold: int | None) -> str:
    """None is no threshold (always speculate); 0 never speculates."""
    if threshold is None:
        return "always"
    if threshold == 0:
        return "never (0)"
    return str(threshold)


def clock(seconds: float) -> str:
    """m:ss on the demo's clock (seconds since the first phase began)."""
    whole = int(seconds)
    return f"{whole // 60}:{whole % 60:02d}"


def _per_sku(values: dict[str, float] | dict[str, float | None], fmt: str = ".1f") -> str:
    if not values:
        return "-"
    return ", ".join(
        f"{short_sku(sku)} {'-' if v is None else format(v, fmt)}"
        for sku, v in sorted(values.items())
    )


def status_line(sample: Sample, phase_no: int, phases: int, title: str, width: int = 160) -> str:
    """One compact line for a tick, e.g. `[2/5 busy: 64 clients, 1 pod] 1:35  batch A100 58.2
    | threshold 36 | crossover A100 35.3 | goodput 3.10 req/s | ThresholdChanged: ...`,
    cut to `width` characters."""
    pods = f"{sample.replicas} pod" + ("" if sample.replicas == 1 else "s")
    head = f"[{phase_no}/{phases} {title}: {sample.clients} clients, {pods}] {clock(sample.t)}"
    fields = [
        f"batch {_per_sku(sample.batch)}",
        f"threshold {threshold_text(sample.threshold)}",
        f"crossover {_per_sku(sample.crossover)}",
        f"goodput {sample.goodput_rps:.2f} req/s",
    ]
    if sample.event:
        fields.append(shorten_skus(sample.event))
    return _trim(f"{head}  " + " | ".join(fields), width)


def _trim(line: str, width: int) -> str:
    if len(line) <= width:
        return line
    return line[: width - 1] + "…" if width > 0 else ""


def seconds_text(seconds: float) -> str:
    """Seconds, with m:ss beside them once they run past a minute."""
    text = f"{seconds:.1f} s" if seconds < 10 else f"{seconds:.0f} s"
    return text if seconds < 60 else f"{text} ({clock(seconds)})"


def step_line(name: str, seconds: float, cold: bool, note: str = "", done: str = "built") -> str:
    """A set-up step: `cluster binaries ........ 12 s (cached)`, or when it had to build (or
    start: `done`), `(built: <note>)` so the first, slow run explains itself (note: e.g. "a
    first run on 2 cores takes ~30 min")."""
    how = (done + (f": {note}" if note else "")) if cold else "cached"
    dots = "." * max(3, STEP_COLUMN - len(name))
    return f"{name} {dots} {seconds_text(seconds)} ({how})"
