"""A status patch as the API server applies it (RFC 7386): what the operator compares to skip
a write for nothing, and what the simulator commits."""

from __future__ import annotations

from spectune.operator.status import merge_patched


def test_a_merge_patch_deletes_merges_and_replaces() -> None:
    status = {"a": 1, "nested": {"keep": 1, "drop": 2}, "list": [1, 2]}
    patch = {"a": None, "nested": {"drop": None, "new": 3}, "list": [3]}
    assert merge_patched(status, patch) == {"nested": {"keep": 1, "new": 3}, "list": [3]}
    assert status["a"] == 1  # the committed dict is not changed in place
    assert merge_patched({}, {"new": {"gone": None, "kept": 1}}) == {"new": {"kept": 1}}
    assert merge_patched(status, {"a": 1, "list": [1, 2]}) == status  # no change
