"""Pushing run-time speculation settings to engines through their admin API.

The ConfigMap carries every SKU's threshold (durable: a restarted pod reads it); this brings
every ready pod to the same settings within one turn instead of after a kubelet's ConfigMap
sync, and leases raised exploration to the engines Prometheus scrapes. Each engine picks its
own SKU's threshold from them. Blocking HTTP (urllib): called from the daemon's thread
(operator/handlers.py), never on kopf's event loop. Engines listen on pod IPs, never through a
proxy. The token is never logged.
"""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.request
from typing import Any

from spectune.operator.tuning import Target

HTTP = urllib.request.build_opener(urllib.request.ProxyHandler({}))
TIMEOUT_SECONDS = 3.0
# Who pushes, in the engines' logs (a replica's pod name and process: handlers sets it).
USER_AGENT = ["spectune-operator"]


def in_step(live: dict[str, Any], target: Target) -> bool:
    """Whether an engine already runs the target (GET /admin/speculation's answer): its SKU's
    threshold, the base share and the lease (a renewed lease has a later expiry: it is sent
    again)."""
    return (
        live.get("threshold") == target.threshold_on(str(live.get("device", "")))
        and math.isclose(float(live.get("exploration", -1.0)), target.exploration, abs_tol=1e-9)
        and live.get("lease") == (dict(target.lease) if target.lease else None)
    )


def sync(target: Target, token: str) -> str | None:
    """Bring one engine to `target` when it differs; the error as text, None on success."""
    try:
        with HTTP.open(f"{target.url}/admin/speculation", timeout=TIMEOUT_SECONDS) as r:
            if in_step(json.load(r), target):
                return None
        body = {
            "threshold": target.threshold,
            "thresholds": dict(target.thresholds),
            "exploration": target.exploration,
            "lease": dict(target.lease) if target.lease else None,
        }
        request = urllib.request.Request(
            f"{target.url}/admin/speculation",
            data=json.dumps(body).encode(),
            method="PUT",
            headers={
                "Content-Type": "application/json",
                "Authorization": f"Bearer {token}",
                "User-Agent": USER_AGENT[0],
            },
        )
        with HTTP.open(request, timeout=TIMEOUT_SECONDS):
            return None
    except urllib.error.HTTPError as e:
        return f"{target.pod}: HTTP {e.code}"
    except (OSError, ValueError) as e:
        return f"{target.pod}: {e}"
