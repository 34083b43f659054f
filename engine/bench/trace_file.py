"""Recorded request traces as files: the CSV format (TIMESTAMP, ContextTokens,
GeneratedTokens) and the built-in names. Torch-free, so that the fleet simulator replays the
same traces the bench does.

The project ships one trace, `azure-conv` (traces/README.md: its source and license).
"""

from __future__ import annotations

import csv
import gzip
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO

from spectune.engine.bench.workload import BenchError

TRACES = Path(__file__).parent / "traces"
BUILTIN = {"azure-conv": TRACES / "AzureLLMInferenceTrace_conv.csv.gz"}
COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


@dataclass(frozen=True)
class Recorded:
    """One request as the trace recorded it."""

    offset_s: float  # after the trace's first request
    context_tokens: int
    generated_tokens: int


@dataclass(frozen=True)
class Trace:
    source: str
    requests: tuple[Recorded, ...]  # in time order


def load_trace(name: str | Path) -> Trace:
    """A CSV file with the columns TIMESTAMP, ContextTokens and GeneratedTokens (gzip when
    its name ends in .gz), or a built-in name; a file that cannot be replayed raises a
    BenchError of one line naming the file, the line and the field."""
    path = BUILTIN.get(str(name), Path(name))
    where = f"trace {name}"
    try:
        with _open(path) as text:
            reader = csv.DictReader(text)
            found = reader.fieldnames or []
            if missing := [c for c in COLUMNS if c not in found]:
                raise BenchError(
                    f"{where}: no column {', '.join(missing)} in its header "
                    f"(expected a CSV file with columns {', '.join(COLUMNS)})"
                )
            rows = [_row(f"{where}, line {reader.line_num}", row) for row in reader]
    except gzip.BadGzipFile:
        raise BenchError(f"{where}: the name ends in .gz but it is not gzip data") from None
    except EOFError:
        raise BenchError(f"{where}: the compressed file is cut short") from None
    except OSError as err:
        raise BenchError(f"{where}: {err.strerror or err}") from None
    except UnicodeDecodeError:
        raise BenchError(f"{where}: not UTF-8 text (expected a CSV file)") from None
    except csv.Error as err:
        raise BenchError(f"{where}: not a readable CSV file ({err})") from None
    if not rows:
        raise BenchError(f"{where} holds no requests")
    rows.sort(key=lambda r: r[0])
    first = rows[0][0]
    if rows[-1][0] == first:
        raise BenchError(f"{where}: every request has the same TIMESTAMP; nothing to replay")
    recorded = tuple(Recorded((t - first).total_seconds(), c, g) for t, c, g in rows)
    return Trace(str(name), recorded)


def _open(path: Path) -> IO[str]:
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8-sig", newline="")
    return path.open(encoding="utf-8-sig", newline="")


def _row(where: str, row: dict) -> tuple[datetime, int, int]:
    if None in row or any(row[c] is None for c in COLUMNS):
        raise BenchError(f"{where}: expected one field per header column")
    stamp = row["TIMESTAMP"].strip()
    try:
        when = datetime.fromisoformat(stamp)
    except ValueError:
        raise BenchError(
            f"{where}: TIMESTAMP {stamp!r} is not a date and time (YYYY-MM-DD HH:MM:SS.ffffff)"
        ) from None
    if when.tzinfo is not None:
        when = when.astimezone(UTC).replace(tzinfo=None)
    return when, _tokens(where, row, "ContextTokens"), _tokens(where, row, "GeneratedTokens")


def _tokens(where: str, row: dict, column: str) -> int:
    text = row[column].strip()
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise BenchError(f"{where}: {column} {text!r} is not a whole number >= 1")
    return value
