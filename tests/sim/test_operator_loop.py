"""The operator in the simulation commits status as the API server would apply it."""

from __future__ import annotations

from spectune.sim.operator_loop import merge


def test_a_merge_patch_deletes_merges_and_replaces() -> None:
    status = {"a": 1, "nested": {"keep": 1, "drop": 2}, "list": [1, 2]}
    patch = {"a": None, "nested": {"drop": None, "new": 3}, "list": [3]}
    assert merge(status, patch) == {"nested": {"keep": 1, "new": 3}, "list": [3]}
    assert status["a"] == 1  # the committed dict is not changed in place
