"""Config reloader: the local Prometheus runs the configuration the Prometheus Operator generates.

In a cluster the Prometheus Operator writes the configuration it generates from a Prometheus
object and the PodMonitors/ServiceMonitors it selects into the Secret `prometheus-<name>`
(gzipped), and its rules into ConfigMaps `prometheus-<name>-rulefiles-<n>`; the
prometheus-config-reloader sidecar in the Prometheus pod writes them out and makes Prometheus
reload. kwok runs no containers, so this plays that sidecar for a Prometheus running on this
machine. What it changes, and only because Prometheus runs outside a pod:

- each `kubernetes_sd_configs` entry gets `kubeconfig_file` (in a pod, discovery uses the pod's
  ServiceAccount);
- `$(POD_NAME)` and `$(SHARD)` become `prometheus-<name>-0` and `0`, as the sidecar's
  substitution from the pod's environment makes them (the first pod of shard 0);
- `rule_files` under /etc/prometheus/rules/ point at the rule ConfigMaps written under
  --state-dir (in a pod they are mounted there);
- each scrape job ends with a keep rule on loopback addresses: the network rule of this machine
  (only 127.0.0.0/8) holds whatever a monitor's relabeling yields.

Everything else is the operator's. It polls every --interval seconds, writes the files only
when something changed, then POSTs /-/reload to --prometheus and touches --ready-file after the
first reload that Prometheus accepted.
"""

from __future__ import annotations

import argparse
import base64
import gzip
import hashlib
import logging
import signal
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config
from kubernetes.client.rest import ApiException

RULES_IN_POD = "/etc/prometheus/rules/"
LOOPBACK_KEEP = {
    "source_labels": ["__address__"],
    "regex": r"127\.\d+\.\d+\.\d+(:\d+)?",
    "action": "keep",
}

log = logging.getLogger("config-reloader")


def substitute(text: str, name: str) -> str:
    """The sidecar's `$(VAR)` substitution, with the environment of pod 0 of shard 0."""
    env = {"POD_NAME": f"prometheus-{name}-0", "SHARD": "0"}
    for var, value in env.items():
        text = text.replace(f"$({var})", value)
    return text


def adapt(generated: dict[str, Any], kubeconfig: Path, rules_dir: Path) -> dict:
    """The operator's configuration, changed only where Prometheus runs outside its pod."""
    out = dict(generated)
    out["rule_files"] = [
        str(rules_dir / f[len(RULES_IN_POD) :]) if f.startswith(RULES_IN_POD) else f
        for f in out.get("rule_files") or []
    ]
    jobs = []
    for job in out.get("scrape_configs") or []:
        job = dict(job)
        if "kubernetes_sd_configs" in job:
            job["kubernetes_sd_configs"] = [
                {**sd, "kubeconfig_file": str(kubeconfig)} for sd in job["kubernetes_sd_configs"]
            ]
        job["relabel_configs"] = [*(job.get("relabel_configs") or []), LOOPBACK_KEEP]
        jobs.append(job)
    out["scrape_configs"] = jobs
    return out


class Reloader:
    def __init__(self, args: argparse.Namespace) -> None:
        self.core = client.CoreV1Api(config.new_client_from_config(str(args.kubeconfig)))
        self.namespace, self.name = args.namespace, args.name
        self.state = args.state_dir
        self.prometheus_kubeconfig = args.prometheus_kubeconfig
        self.prometheus = args.prometheus
        self.ready_file = args.ready_file
        self.last: str | None = None

    def generated(self) -> tuple[dict[str, Any], dict[str, dict[str, str]]] | None:
        """The operator's configuration and rule files, or None while it has written none."""
        try:
            secret = self.core.read_namespaced_secret(f"prometheus-{self.name}", self.namespace)
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        raw = gzip.decompress(base64.b64decode(secret.data["prometheus.yaml.gz"])).decode()
        prefix = f"prometheus-{self.name}-rulefiles-"
        maps = self.core.list_namespaced_config_map(self.namespace).items
        rules = {m.metadata.name: m.data or {} for m in maps if m.metadata.name.startswith(prefix)}
        return yaml.safe_load(substitute(raw, self.name)) or {}, rules

    def sync(self) -> None:
        found = self.generated()
        if found is None:
            return
        generated, rules = found
        rules_dir = self.state / "rules"
        adapted = adapt(generated, self.prometheus_kubeconfig, rules_dir)
        text = yaml.safe_dump(adapted, sort_keys=False)
        digest = hashlib.sha256(yaml.safe_dump([text, rules]).encode()).hexdigest()
        if digest == self.last:
            return
        for folder in rules_dir.glob("*"):
            if folder.name not in rules:
                for f in folder.glob("*"):
                    f.unlink()
                folder.rmdir()
        for folder, files in rules.items():
            (rules_dir / folder).mkdir(parents=True, exist_ok=True)
            for file, content in files.items():
                (rules_dir / folder / file).write_text(content)
        target = self.state / "prometheus.yml"
        target.with_suffix(".tmp").write_text(text)
        target.with_suffix(".tmp").replace(target)
        request = urllib.request.Request(f"{self.prometheus}/-/reload", method="POST")
        with urllib.request.urlopen(request, timeout=10):
            pass  # an error status raises: Prometheus refused the configuration
        self.last = digest
        log.info("reloaded Prometheus with %d scrape jobs", len(adapted["scrape_configs"]))
        self.ready_file.touch()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kubeconfig", type=Path, required=True, help="to read the Secret with")
    parser.add_argument("--namespace", required=True, help="the Prometheus object's namespace")
    parser.add_argument("--name", required=True, help="the Prometheus object's name")
    parser.add_argument(
        "--prometheus-kubeconfig", type=Path, required=True,
        help="what Prometheus' Kubernetes discovery authenticates with",
    )  # fmt: skip
    parser.add_argument("--prometheus", required=True, help="the Prometheus to reload (its URL)")
    parser.add_argument("--state-dir", type=Path, required=True, help="its config goes here")
    parser.add_argument("--ready-file", type=Path, required=True)
    parser.add_argument("--interval", type=float, default=1.0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    args.state_dir.mkdir(parents=True, exist_ok=True)
    reloader = Reloader(args)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    while True:
        try:
            reloader.sync()
        except Exception as e:  # the API server or Prometheus briefly away: try again
            log.warning("sync failed: %s", e)
        time.sleep(args.interval)


if __name__ == "__main__":
    sys.exit(main())
