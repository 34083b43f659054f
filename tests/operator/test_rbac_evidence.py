"""Least privilege from evidence (issue 61, item 7): the API server's audit log of this run's
operator end-to-end tests lists every (group, resource, verb) an operator called, and the
chart grants exactly that set. A verb no code uses fails here; a missing one fails the e2e
test that needed it (the API server refuses it: RBAC is on).

Run after the other lanes (`make test` puts it in the restart lane): it reads what their
operators did since `hack/test.sh` started them (SPECTUNE_TESTS_SINCE)."""

from __future__ import annotations

import os
from datetime import datetime

import pytest
import yaml

from tests.cluster.support import load_script

from .support import LEASE_RULES, OPERATOR_NS, RULES

pytestmark = pytest.mark.cluster
audit = load_script("audit")  # hack/audit.py: the API server's audit log
OPERATORS = f"system:serviceaccount:{OPERATOR_NS}:spectune-operator-"
# Checked by admission, not called: OwnerReferencesPermissionEnforcement (the local API server
# enables it, as OpenShift does) refuses an owner reference with blockOwnerDeletion, which
# kopf.adopt sets, from a user who cannot update the owner's finalizers.
ADMISSION_ONLY = {("spectune.io", "specdeployments/finalizers", "update")}


def granted(*rules_files) -> set[tuple[str, str, str]]:
    return {
        (group, resource, verb)
        for path in rules_files
        for rule in yaml.safe_load(path.read_text())
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def test_the_chart_grants_exactly_what_the_operators_called(cluster) -> None:
    since = os.environ.get("SPECTUNE_TESTS_SINCE")
    assert since, (
        "SPECTUNE_TESTS_SINCE is unset: this test reads what the other lanes' operators did, "
        "so run it through `make test` (hack/test.sh), after them"
    )
    start = datetime.fromisoformat(since)
    # the restart test moves the log to logs.prev when it brings the cluster up again
    logs = (audit.LOG.parent.with_name("logs.prev") / audit.LOG.name, audit.LOG)
    calls = [
        c
        for log in logs
        for c in audit.calls(log)
        if c.at >= start and c.user.startswith(OPERATORS) and c.resource
    ]
    # a server-side apply that made the object (201) was authorized as a create
    used = {(c.group, c.resource, c.verb) for c in calls} | {
        (c.group, c.resource, "create") for c in calls if c.verb == "patch" and c.code == 201
    }
    assert used, f"no operator call in the audit log since {since}"
    rules = granted(RULES, LEASE_RULES)
    assert sorted(rules - used - ADMISSION_ONLY) == [], "granted, never used since " + since
    assert sorted(used - rules) == [], "used, not granted (a test bound more than the chart)"
