"""What a steady fleet costs the API server, and the operator's CPU and memory over time (issue 59,
J): the operator as a ServiceAccount of its own with the chart's rules, watching one namespace
of N SpecDeployments x P pods on the local cluster's fake nodes, nothing changing, for a given
time. Its calls come from the API server's audit log (hack/audit.py), its CPU and memory from
/proc. The pods never get engines (labelled `spectune.io/pod-runner: none`: hundreds of real
engines do not fit this machine) and so never become Ready: each deployment's status settles,
and from then on nothing changes. Every object it makes is deleted at the end; it stops by
itself after `--minutes`.

    make cluster-up
    .venv/bin/python benchmarks/operator_load.py --minutes 30                     # this tree
    .venv/bin/python benchmarks/operator_load.py --minutes 30 --python /tmp/before/bin/python
        # another tree's operator: docker/install-operator.sh TREE VENV, then VENV/bin/python

The steady state is everything after `--settle` minutes (the first turns write every status
and child once). The numbers are requests per second by verb and resource, writes per
SpecDeployment per minute, and the operator's CPU share and resident memory every minute.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config

from spectune.operator.launch import bind_operator
from spectune.operator.leadership import Leases
from spectune.operator.models import GROUP, PLURAL, VERSION

REPO = Path(__file__).resolve().parents[1]
CHART_FILES = REPO / "charts" / "spectune" / "files"
sys.path.insert(0, str(REPO / "hack"))
import audit  # noqa: E402  (hack/audit.py, a script folder)

TICKS = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


def spec(replicas: int) -> dict[str, Any]:
    """An Auto deployment of CPU engines whose pods no engine serves."""
    return {
        "replicas": replicas,
        "model": {"name": "tiny-target"},
        "engine": {
            "gpus": 0,
            "template": {"metadata": {"labels": {"spectune.io/pod-runner": "none"}}},
        },
        "speculation": {"method": "ngram", "threshold": {"mode": "Auto"}},
    }


def sample(pid: int) -> tuple[float, float]:
    """(CPU seconds so far, resident MiB) of a process and its threads."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime
    rss = int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE / 2**20
    return cpu, rss


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--specdeployments", type=int, default=100)
    parser.add_argument("--pods", type=int, default=2, help="replicas of each")
    parser.add_argument("--minutes", type=float, default=30.0, help="how long it runs")
    parser.add_argument("--settle", type=float, default=3.0, help="minutes not counted")
    parser.add_argument("--python", default=sys.executable, help="whose operator runs")
    parser.add_argument("--out", type=Path, default=REPO / ".cache" / "bench" / "operator_load")
    args = parser.parse_args()
    kubeconfig = REPO / ".local" / "kubeconfig"
    config.load_kube_config(str(kubeconfig))
    admin = client.ApiClient()
    core, custom = client.CoreV1Api(admin), client.CustomObjectsApi(admin)
    run = uuid.uuid4().hex[:6]
    namespace, account = f"opload-{run}", f"opload-{run}"
    args.out.mkdir(parents=True, exist_ok=True)
    # The CRD, as the chart installs it: a fresh cluster has none.
    crd = REPO / "crds" / "specdeployments.spectune.io.yaml"
    kubectl = [str(REPO / ".local" / "bin" / "kubectl"), "--kubeconfig", str(kubeconfig)]
    subprocess.run([*kubectl, "apply", "--server-side", "-f", str(crd)], check=True)
    subprocess.run([*kubectl, "wait", "--for=condition=Established", "-f", str(crd)], check=True)
    core.create_namespace({"metadata": {"name": namespace}})
    rules = yaml.safe_load((CHART_FILES / "operator-rules.yaml").read_text())
    lease_rules = yaml.safe_load((CHART_FILES / "leader-election-rules.yaml").read_text())
    bind_operator(admin, namespace, account, rules, lease_rules)
    Leases(namespace, "spectune-operator", admin).create_released()
    token = args.out / f"{account}.kubeconfig"
    subprocess.run(
        [str(REPO / "hack" / "sa-kubeconfig.sh"), namespace, account, str(token), "4h"],
        check=True, capture_output=True,
    )  # fmt: skip
    log = args.out / f"{account}.log"
    prometheus = os.environ.get("SPECTUNE_PROMETHEUS_URL", "http://127.0.0.1:19090")
    operator = subprocess.Popen(
        [args.python, "-m", "spectune.operator.cli", "run", "--namespace", namespace,
         "--leader-election-namespace", namespace, "--prometheus-url", prometheus,
         "--liveness", "http://127.0.0.1:8297/healthz"],
        env=os.environ | {"KUBECONFIG": str(token)},
        cwd="/", stdout=log.open("w"), stderr=subprocess.STDOUT,
    )  # fmt: skip
    user = audit.service_account(namespace, account)
    started = datetime.now(UTC)
    timeline: list[dict[str, float]] = []
    try:
        for i in range(args.specdeployments):
            body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "SpecDeployment",
                    "metadata": {"name": f"sd-{i:03d}"}, "spec": spec(args.pods)}  # fmt: skip
            custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
        print(f"{args.specdeployments} SpecDeployments x {args.pods} pods in {namespace}; "
              f"operator {args.python} (pid {operator.pid}), log {log}", flush=True)  # fmt: skip
        end = time.monotonic() + args.minutes * 60
        last_cpu, last_at = sample(operator.pid)[0], time.monotonic()
        while time.monotonic() < end:
            time.sleep(min(60.0, max(0.0, end - time.monotonic())))
            if operator.poll() is not None:
                raise SystemExit(f"operator_load: the operator exited ({operator.returncode})")
            cpu, rss = sample(operator.pid)
            now = time.monotonic()
            minute = (datetime.now(UTC) - started).total_seconds() / 60
            share = (cpu - last_cpu) / (now - last_at)
            timeline.append({"minute": round(minute, 1), "cpu": round(share, 3),
                             "rss_mib": round(rss, 1)})  # fmt: skip
            last_cpu, last_at = cpu, now
            print(f"  {minute:5.1f} min: operator CPU {share:.1%} of a core, "
                  f"RSS {rss:.0f} MiB", flush=True)  # fmt: skip
    finally:
        operator.terminate()
        try:
            operator.wait(30)
        except subprocess.TimeoutExpired:
            operator.kill()
        finished = datetime.now(UTC)
        core.delete_namespace(namespace)
        rbac = client.RbacAuthorizationV1Api(admin)
        rbac.delete_cluster_role(account)
        rbac.delete_cluster_role_binding(account)
    steady_from = started + timedelta(minutes=args.settle)
    mine = [c for c in audit.calls() if c.user == user and steady_from <= c.at <= finished]
    seconds = (finished - steady_from).total_seconds()
    by = audit.by_verb_and_resource(mine)
    writes = sum(n for (verb, _), n in by.items() if verb in audit.WRITES)
    per_sd_minute = writes / args.specdeployments / (seconds / 60)
    steady = [t for t in timeline if t["minute"] >= args.settle]
    report = {
        "tree": args.python,
        "specdeployments": args.specdeployments,
        "pods": args.pods,
        "steady_seconds": round(seconds),
        "requests_per_second": round(len(mine) / seconds, 3),
        "writes_per_second": round(writes / seconds, 3),
        "writes_per_specdeployment_per_minute": round(per_sd_minute, 4),
        "by_verb_and_resource_per_second": {
            f"{verb} {resource}": round(n / seconds, 3) for (verb, resource), n in by.most_common()
        },
        "cpu_share_median": statistics.median(t["cpu"] for t in steady) if steady else None,
        "rss_mib_first_last": [steady[0]["rss_mib"], steady[-1]["rss_mib"]] if steady else None,
        "timeline": timeline,
    }
    out = args.out / f"{run}.json"
    out.write_text(json.dumps(report, indent=2))
    print(f"\nsteady state ({seconds / 60:.0f} min after {args.settle:g}): "
          f"{report['requests_per_second']} requests/s, {report['writes_per_second']} writes/s, "
          f"{per_sd_minute:.3f} writes per SpecDeployment per minute")  # fmt: skip
    for key, rate in Counter(report["by_verb_and_resource_per_second"]).most_common(15):
        print(f"  {rate:8.3f}/s  {key}")
    print(f"operator CPU (median share of a core) {report['cpu_share_median']}, "
          f"RSS first and last {report['rss_mib_first_last']} MiB; {out}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
