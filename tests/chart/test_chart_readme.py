"""The chart's README is hack/chart_readme.py's rendering of values.yaml's `# --` comments:
the committed one is the current output, so a value cannot change without its documentation."""

from __future__ import annotations

import yaml

from tests.cluster.support import load_script

from .support import CHART

chart_readme = load_script("chart_readme")


def test_the_committed_readme_is_the_generated_one() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    want = chart_readme.render((CHART / "values.yaml").read_text(), chart)
    assert (CHART / "README.md").read_text() == want, (
        "charts/spectune/README.md is stale: run `make chart-readme`"
    )


def test_rows_take_the_comment_above_each_key() -> None:
    values = """\
# A header, not a key's documentation.

# -- The first line
# and its continuation.
image:
  repository: r  # no comment: a row without a description
  # -- Pipes | escaped.
  tag: ""
  # A plain comment documents nothing.
  pullPolicy: IfNotPresent
section:
  # -- A documented leaf mapping.
  inline: {a: 1}

# -- Lost to the blank line.

after: [x]
"""
    got = [(r.key, r.section, r.description) for r in chart_readme.rows(values)]
    assert got == [
        ("image", True, "The first line and its continuation."),
        ("image.repository", False, ""),
        ("image.tag", False, "Pipes | escaped."),
        ("image.pullPolicy", False, ""),
        ("section", True, ""),
        ("section.inline", False, "A documented leaf mapping."),
        ("after", False, ""),
    ]
    table = chart_readme.render(values, {"name": "c", "description": "d", "version": "1",
                                         "appVersion": "1"}).split("| Key |")[1]  # fmt: skip
    assert table.splitlines()[2:] == [
        "| `image` | object |  | The first line and its continuation. |",
        '| `image.repository` | string | `"r"` |  |',
        '| `image.tag` | string | `""` | Pipes \\| escaped. |',
        '| `image.pullPolicy` | string | `"IfNotPresent"` |  |',
        '| `section.inline` | object | `{"a": 1}` | A documented leaf mapping. |',
        '| `after` | list | `["x"]` |  |',
    ]
