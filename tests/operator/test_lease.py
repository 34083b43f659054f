"""Leader election's pure decisions (operator/lease.py): when a candidate may take the Lease,
how long an unrenewed leader may go on, and the Lease each write leaves."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from spectune.operator.lease import (
    ABSENT,
    Record,
    Sighting,
    Timing,
    may_take,
    released,
    renewed,
    sight,
    taken,
)

NOW = datetime(2026, 12, 4, 10, 0, 0, 123456, tzinfo=UTC)
T = Timing()


def lease(holder: str, version: str = "7", transitions: int = 2) -> dict:
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "sd", "namespace": "ops", "resourceVersion": version, "uid": "u"},
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15,
                 "renewTime": "2026-12-04T09:59:00.000000Z", "leaseTransitions": transitions},
    }  # fmt: skip


def test_timing_defaults_are_client_go_and_orderings_are_enforced() -> None:
    assert (T.lease_s, T.renew_s, T.retry_s, T.deadline_s, T.exit_s) == (15, 5, 2, 10, 13)
    for bad in ({"exit_s": 15.0}, {"deadline_s": 4.0}, {"retry_s": 6.0}, {"retry_s": 0.0}):
        with pytest.raises(ValueError, match="retry <= renew < deadline < exit < lease"):
            Timing(**bad)


def test_a_renewal_attempt_never_outlasts_the_deadline() -> None:
    assert T.attempt_timeout(renewed_at=100.0, now=105.0) == 2.0  # retry_s
    assert T.attempt_timeout(renewed_at=100.0, now=109.5) == pytest.approx(0.5)
    assert T.attempt_timeout(renewed_at=100.0, now=110.0) is None  # stop acting


def test_the_clock_restarts_on_every_change_of_the_lease() -> None:
    first = sight(None, Record.of(lease("a", "7")), now=1.0)
    assert first == Sighting("7", 1.0)
    assert sight(first, Record.of(lease("a", "7")), now=9.0) is first
    assert sight(first, Record.of(lease("a", "8")), now=9.0) == Sighting("8", 9.0)


def test_who_may_take_the_lease() -> None:
    held = Record.of(lease("a"))
    seen = Sighting(held.version, 100.0)
    assert not may_take("b", held, seen, now=115.0, lease_s=15)  # exactly the duration: not yet
    assert may_take("b", held, seen, now=115.01, lease_s=15)
    assert may_take("b", Record.of(lease("")), seen, now=100.0, lease_s=15)  # released: at once
    assert may_take("a", held, seen, now=100.0, lease_s=15)  # this identity's earlier process


def test_a_missing_lease_is_taken_only_a_lease_duration_after_it_went_missing() -> None:
    """Deleted under a leader, a Lease taken at once let two replicas act while the leader
    counted its exit from its last renewal (issue 59, L): a missing Lease waits lease_s from
    the moment this candidate first found it missing, as a held one does from its last change."""
    held = sight(None, Record.of(lease("a", "7")), now=1.0)
    gone = sight(held, None, now=3.0)
    assert gone == Sighting(ABSENT, 3.0) and sight(gone, None, now=9.0) is gone
    assert not may_take("b", None, gone, now=18.0, lease_s=15)
    assert may_take("b", None, gone, now=18.01, lease_s=15)
    back = sight(gone, Record.of(lease("c", "9")), now=10.0)
    assert back == Sighting("9", 10.0)


@pytest.mark.parametrize("seen_after", [0.0, 0.05, 1.0, 4.9])
def test_a_candidate_takes_over_only_after_the_leader_has_exited(seen_after: float) -> None:
    """The leader counts from sending its last renewal (t0); a candidate from seeing it, no
    earlier. The first moment the candidate may take the Lease comes after the leader's forced
    exit, by at least lease_s - exit_s."""
    t0 = 50.0
    record = Record.of(lease("leader"))
    seen = sight(None, record, now=t0 + seen_after)
    first = next(
        t0 + i / 100 for i in range(3000) if may_take("c", record, seen, t0 + i / 100, T.lease_s)
    )
    assert T.attempt_timeout(t0, t0 + T.deadline_s) is None  # the leader stopped kopf by then
    assert first - (t0 + T.exit_s) >= T.lease_s - T.exit_s


def test_taking_a_new_lease_and_one_held_before() -> None:
    new = taken(None, "ops", "sd", "me", T, NOW)
    assert new["metadata"] == {"name": "sd", "namespace": "ops"}  # create: no version
    assert new["spec"] == {
        "holderIdentity": "me", "leaseDurationSeconds": 15, "leaseTransitions": 0,
        "acquireTime": "2026-12-04T10:00:00.123456Z", "renewTime": "2026-12-04T10:00:00.123456Z",
    }  # fmt: skip
    other = taken(lease("old", "7", transitions=2), "ops", "sd", "me", T, NOW)
    assert other["metadata"]["resourceVersion"] == "7"  # fails if anyone wrote since the read
    assert other["spec"]["leaseTransitions"] == 3
    assert taken(lease("me"), "ops", "sd", "me", T, NOW)["spec"]["leaseTransitions"] == 2


def test_renewing_and_releasing_change_only_their_fields() -> None:
    held = lease("me", "9")
    again = renewed(held, NOW)
    assert again["metadata"] == {"name": "sd", "namespace": "ops", "resourceVersion": "9"}
    assert again["spec"] == held["spec"] | {"renewTime": "2026-12-04T10:00:00.123456Z"}
    gone = released(held, NOW)
    assert Record.of(gone | {"metadata": held["metadata"]}).holder == ""
    assert gone["spec"]["leaseTransitions"] == 2 and gone["metadata"]["resourceVersion"] == "9"
