"""A pytest plugin: a test's markers say what it needs, and collection fails when they do not.

`make check` runs `pytest -m "not cluster and not tools and not slow and not images"`; that is
only safe if every test that starts the local cluster is marked `cluster`, every test that runs
a Go-built tool (helm, Prometheus) is marked `tools` and every test that builds the images is
marked `images`. The fixtures are what bring those in, so
the fixtures a test uses (its whole fixture closure) decide the markers it must carry."""

from __future__ import annotations

import pytest

# fixture -> the markers, any one of which a test using it (directly or through other
# fixtures) must carry: a cluster test needs the Go-built tools too, and is deselected either way
NEEDS = {
    "cluster": ("cluster",),
    "helm_binary": ("tools", "cluster"),
    "prometheus_binary": ("tools", "cluster"),
    "images": ("images",),
}


def missing_markers(item: pytest.Item) -> list[str]:
    """The markers `item` lacks for the fixtures it uses (alternatives joined by " or ")."""
    fixtures = getattr(item, "fixturenames", ())
    return sorted(
        {
            " or ".join(markers)
            for fixture, markers in NEEDS.items()
            if fixture in fixtures and not any(item.get_closest_marker(m) for m in markers)
        }
    )


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects anything: every test is checked
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    unmarked = [
        f"{item.nodeid} uses what needs the marker {' and '.join(missing)}"
        for item in items
        if (missing := missing_markers(item))
    ]
    if unmarked:
        raise pytest.UsageError(
            "tests lack the markers their fixtures ask for (make check would run them):\n  "
            + "\n  ".join(unmarked)
        )
