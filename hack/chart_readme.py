"""Render charts/spectune/README.md from values.yaml, whose `# -- ` comments (helm-docs style)
document the key that follows them, so the chart's README and its values cannot disagree.

    .venv/bin/python hack/chart_readme.py          # or: make chart-readme

Every key gets a row (key, type, default, description); a mapping written as a block gets one
only when it carries a comment, its keys following as rows of their own. A test compares the
committed README with this output."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

CHART = Path(__file__).resolve().parents[1] / "charts" / "spectune"
KEY = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z0-9_.-]+):(?:\s|$)")
TYPES = {bool: "bool", int: "int", float: "float", str: "string", list: "list", dict: "object"}


@dataclass(frozen=True)
class Row:
    key: str
    value: Any
    description: str
    section: bool  # a block mapping: its keys have rows of their own


def rows(values_yaml: str) -> list[Row]:
    """One row per key of values.yaml, in file order, with the `# --` comment above it."""
    data = yaml.safe_load(values_yaml)
    lines = values_yaml.splitlines()
    keys = [(i, m) for i, line in enumerate(lines) if (m := KEY.match(line))]
    path: list[tuple[int, str]] = []  # (indent, key) of the enclosing mappings
    found = []
    for n, (i, m) in enumerate(keys):
        indent = len(m["indent"])
        while path and path[-1][0] >= indent:
            path.pop()
        path.append((indent, m["key"]))
        names = [key for _, key in path]
        value = data
        for name in names:
            value = value[name]
        deeper = n + 1 < len(keys) and len(keys[n + 1][1]["indent"]) > indent
        found.append(Row(".".join(names), value, _comment(lines, i), deeper))
    return found


def _comment(lines: list[str], i: int) -> str:
    """The `# -- ` block right above line i, joined into one line; "" when there is none."""
    block: list[str] = []
    for line in reversed(lines[:i]):
        text = line.strip()
        if not text.startswith("#"):
            return ""
        block.insert(0, text.lstrip("#").strip())
        if text.startswith("# --"):
            return " ".join(block)[2:].strip()
    return ""


def render(values_yaml: str, chart: dict[str, Any]) -> str:
    """The README: the chart's name and description, then the values table."""
    table = [
        f"| `{r.key}` | {TYPES.get(type(r.value), 'null')} | "
        f"{'' if r.section else _cell(f'`{json.dumps(r.value)}`')} | {_cell(r.description)} |"
        for r in rows(values_yaml)
        if r.description or not r.section
    ]
    return "\n".join(
        [
            f"# {chart['name']}",
            "",
            chart["description"].strip(),
            "",
            f"Chart version {chart['version']}, app version {chart['appVersion']}. Installing it "
            'on a GPU cluster: the repository\'s README.md, "Install on your cluster".',
            "",
            "## Values",
            "",
            "Generated from values.yaml's comments by hack/chart_readme.py (`make chart-readme`).",
            "",
            "| Key | Type | Default | Description |",
            "|---|---|---|---|",
            *table,
            "",
        ]
    )


def _cell(text: str) -> str:
    """A table cell: a pipe would end it."""
    return text.replace("|", "\\|")


def main() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    (CHART / "README.md").write_text(render((CHART / "values.yaml").read_text(), chart))


if __name__ == "__main__":
    main()
