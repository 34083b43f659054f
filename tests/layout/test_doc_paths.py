"""Every repository path the documentation quotes exists, and none points outside the
repository: README.md and docs/*.md are the map, and a map with stale paths misleads.

What counts as a quoted path: a markdown link or image to a relative target (resolved from
the document's folder), and, in code (inline spans and fenced blocks) or prose, a token that
contains a `/` and either starts with a top-level entry of the repository (`engine/...`,
`hack/...`) or ends with a known file suffix. Those are resolved from the repository root.
Not paths: URLs, absolute paths (`/metrics`, `/admin/speculation`), `~/...`, names such as
`nvidia.com/gpu` or `REGISTRY/spectune-operator`, templated tokens (`{size}-target`,
`$PWD/...`), and what runs generate under ignored folders (`.cache/`, `.local/`, `.venv/`).
A glob must match at least one file; a pytest node id's file must define its test."""

from __future__ import annotations

import bisect
import itertools
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# Written by runs, ignored by git: quoted paths under them need not exist in a checkout.
GENERATED = (".cache/", ".local/", ".venv/")

# Top-level entries that are not the repository's own (build output, caches, a venv).
NOT_OURS = {".git", ".venv", ".cache", ".local", "build", "dist", "__pycache__"}

SUFFIXES = (
    ".py", ".md", ".sh", ".yaml", ".yml", ".json", ".txt", ".toml", ".png", ".csv", ".gz",
    ".in", ".tpl", ".Dockerfile", ".cfg", ".ini", ".mod", ".sum",
)  # fmt: skip

LINK = re.compile(r"!?\[(?:[^\]\\]|\\.)*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$", re.MULTILINE)
FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.DOTALL)
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
# Punctuation around a token that is not part of the path: `(hack/README.md)`, `crds/,`.
EDGES = "()[]{}<>,;:'\"`!"


@dataclass(frozen=True)
class Quote:
    doc: str
    line: int
    kind: str  # "link" (relative to the document) or "path" (relative to the repository)
    text: str


def documents(root: Path) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def top_level(root: Path) -> set[str]:
    return {p.name for p in root.iterdir()} - NOT_OURS - {p.name for p in root.glob("*.egg-info")}


def _split(text: str) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    """(prose lines, fenced code lines) as (line number, text) pairs."""
    prose, code, fence = [], [], None
    for number, line in enumerate(text.splitlines(), 1):
        opened = FENCE.match(line)
        if fence is None and opened:
            fence = opened.group(1)
        elif fence is not None and opened and opened.group(1).startswith(fence[0] * len(fence)):
            fence = None
        else:
            (code if fence else prose).append((number, line))
    return prose, code


def _line_numbers(lines: list[tuple[int, str]]) -> Callable[[int], int]:
    """Offset in the lines joined by newlines -> that line's number in the document."""
    starts = list(itertools.accumulate((len(line) + 1 for _, line in lines[:-1]), initial=0))
    return lambda offset: lines[bisect.bisect_right(starts, offset) - 1][0] if lines else 0


def _blank(m: re.Match[str]) -> str:
    return re.sub(r"[^\n]", " ", m.group())


def _tokens(code: str) -> list[str]:
    tokens = []
    for raw in code.split():
        token = raw.split("=")[-1].lstrip(EDGES).rstrip(EDGES + ".")
        if token:
            tokens.append(token)
    return tokens


def _is_path(token: str, tops: set[str]) -> bool:
    if "/" not in token or "://" in token or token.startswith(("/", "~", "$", "-")):
        return False
    if any(c in token for c in "{}$<>|@"):
        return False
    if token.startswith("../"):
        return True
    path = token.split("::")[0]
    return path.split("/")[0] in tops or path.endswith(SUFFIXES)


def quotes(doc: Path, root: Path) -> list[Quote]:
    """The repository paths and relative links `doc` quotes."""
    tops = top_level(root)
    name = doc.relative_to(root).as_posix()
    prose, code = _split(doc.read_text())
    prose_text = "\n".join(line for _, line in prose)
    line_of = _line_numbers(prose)
    found = []
    for pattern in (LINK, REFERENCE):
        for m in pattern.finditer(prose_text):
            target = m.group(1)
            if not SCHEME.match(target):
                found.append(Quote(name, line_of(m.start()), "link", target))
    spans = [(line_of(m.start()), m.group(2)) for m in CODE_SPAN.finditer(prose_text)]
    bare = LINK.sub(_blank, CODE_SPAN.sub(_blank, prose_text))  # offsets kept: line numbers
    words = [(line_of(m.start()), m.group()) for m in re.finditer(r"\S+", bare)]
    for number, text in [*spans, *code]:
        for token in _tokens(text):
            if _is_path(token, tops):
                found.append(Quote(name, number, "path", token))
    for number, word in words:  # prose: only unmistakable paths (`engine/...py`, `../...`)
        for token in _tokens(word):
            ours = token.split("/")[0] in tops and token.split("::")[0].endswith(SUFFIXES)
            if _is_path(token, tops) and (ours or token.startswith("../")):
                found.append(Quote(name, number, "path", token))
    return found


def anchors(doc: Path) -> set[str]:
    """The fragments GitHub gives `doc`'s headings: lower case, punctuation dropped, spaces
    to hyphens, a repeated one numbered."""
    found: set[str] = set()
    for _, line in _split(doc.read_text())[0]:
        if heading := re.match(r"^ {0,3}#{1,6}\s+(.+?)\s*#*\s*$", line):
            slug = re.sub(r"[^\w\- ]", "", heading.group(1).lower()).replace(" ", "-")
            n = 0
            while (numbered := slug if n == 0 else f"{slug}-{n}") in found:
                n += 1
            found.add(numbered)
    return found


def problem(quote: Quote, root: Path) -> str | None:
    """Why `quote` is wrong, or None when it names something in the repository."""
    text, anchor = quote.text, ""
    if quote.kind == "link":
        text, _, anchor = text.partition("#")
        text = text or Path(quote.doc).name
    base = (root / quote.doc).parent if quote.kind == "link" else root
    relative = Path(os.path.relpath(os.path.normpath(base / text), root)).as_posix()
    if text.startswith("/") or relative.split("/")[0] == "..":
        return "points outside the repository"
    if relative.startswith(GENERATED):
        return None
    path, _, test = relative.partition("::")
    if any(c in path for c in "*?["):
        return None if any(root.glob(path)) else "the glob matches no file"
    if not (root / path).exists():
        return "no such file or folder"
    if anchor and path.endswith(".md") and anchor not in anchors(root / path):
        return f"{path} has no heading #{anchor}"
    if test and not re.search(rf"def {re.escape(test.split('[')[0])}\(", (root / path).read_text()):
        return f"{path} defines no {test}"
    return None


def problems(root: Path) -> list[str]:
    return [
        f"{q.doc}:{q.line}: {q.text}: {why}"
        for doc in documents(root)
        for q in quotes(doc, root)
        if (why := problem(q, root))
    ]


def test_every_path_the_docs_quote_exists() -> None:
    assert problems(REPO) == []


def test_the_docs_quote_paths_at_all() -> None:
    quoted = {q.text for doc in documents(REPO) for q in quotes(doc, REPO)}
    assert {"engine/contract.py", "docs/architecture.md", "hack/demo.sh"} <= quoted


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    for name in ("engine/contract.py", "hack/demo.sh", "docs/images/a.png", "docker/x.txt"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("def test_one():\n    pass\n")
    return tmp_path


def _check(repo: Path, readme: str, doc: str = "") -> list[str]:
    (repo / "README.md").write_text(readme)
    (repo / "docs" / "guide.md").write_text(doc)
    return problems(repo)


def test_what_is_not_a_repository_path_passes(repo: Path) -> None:
    readme = """\
See `engine/contract.py` (and hack/demo.sh), [a guide](docs/guide.md#the-top), `docker/*.txt`,
`tests/../engine/contract.py`, ![a](docs/images/a.png), `engine/contract.py::test_one`.
Not paths: `.cache/demo/demo.md`, `.local/bin/kubectl`, `~/.cache/spectune/tools`,
`REGISTRY/spectune-operator:0.1.0`, `nvidia.com/gpu`, `spectune.io/simulate-gpu: "true"`,
`app.kubernetes.io/name=spectune-engine`, `GET /metrics`, `/tmp/x.py`, `spec/plain`,
[a site](https://example.com/x.md), [here](#layout-ab), `{tiny,bench}-target/x`, `$PWD/x.py`,
and prose like engine/serving or 1/2 of the k8s.io/kubernetes module.

## Layout: `a/b`

```sh
export KUBECONFIG=$PWD/.local/kubeconfig
bash hack/demo.sh --out .cache/x   # see (engine/contract.py)
curl http://127.0.0.1:8000/v1/models
```
"""
    doc = "# The top\n\n![a](images/a.png) and [up](../README.md#layout-ab)"
    assert _check(repo, readme, doc) == []


def test_a_missing_or_outside_path_fails(repo: Path) -> None:
    readme = """\
`engine/contrakt.py`, [gone](docs/nothing.md), `docker/*.yaml`, `../shared/DESIGN.md`,
![b](docs/images/b.png), `engine/contract.py::test_two`, prose engine/missing.py, `x/y.py`,
[no such heading](docs/guide.md#nowhere).

```sh
bash hack/demo2.sh
```
"""
    assert _check(repo, readme, "[out](../../DESIGN.md)") == [
        "README.md:1: docs/nothing.md: no such file or folder",
        "README.md:2: docs/images/b.png: no such file or folder",
        "README.md:3: docs/guide.md#nowhere: docs/guide.md has no heading #nowhere",
        "README.md:1: engine/contrakt.py: no such file or folder",
        "README.md:1: docker/*.yaml: the glob matches no file",
        "README.md:1: ../shared/DESIGN.md: points outside the repository",
        "README.md:2: engine/contract.py::test_two: engine/contract.py defines no test_two",
        "README.md:2: x/y.py: no such file or folder",
        "README.md:6: hack/demo2.sh: no such file or folder",
        "README.md:2: engine/missing.py: no such file or folder",
        "docs/guide.md:1: ../../DESIGN.md: points outside the repository",
    ]
