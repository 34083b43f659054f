"""kopf's per-run success lines are DEBUG, everything else keeps its level (no cluster needed;
test_operator_cluster.py checks a running operator's log)."""

from __future__ import annotations

import logging

import pytest

from spectune.operator import logs

SUCCESSES = ["Timer 'reconcile' succeeded.", "Handler 'reconcile' succeeded."]
KEPT = [
    "Creation is processed: 1 succeeded; 0 failed.",
    "Timer 'reconcile' failed with an exception and will try again in 60 seconds: boom",
]


def test_handler_successes_are_debug_and_nothing_else_moves(
    caplog: pytest.LogCaptureFixture,
) -> None:
    logs.demote_handler_successes()
    logs.demote_handler_successes()  # once is enough: a second call adds nothing
    kopf_objects = logging.getLogger(logs.KOPF_OBJECTS)
    assert sum(isinstance(f, logs.DemoteHandlerSuccesses) for f in kopf_objects.filters) == 1
    with caplog.at_level(logging.INFO):
        for message in [*SUCCESSES, *KEPT]:
            kopf_objects.info(message)
    assert [r.getMessage() for r in caplog.records] == KEPT
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger=logs.KOPF_OBJECTS):
        for message in SUCCESSES:
            kopf_objects.info(message)
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("DEBUG", m) for m in SUCCESSES
    ]
