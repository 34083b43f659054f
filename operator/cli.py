"""`spectune-operator`: run the operator, or print the CRD generated from the models."""

from __future__ import annotations

import argparse
import os
import re
import socket
import sys
import zlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from spectune.operator.prometheus import LabelNames
    from spectune.operator.render import PodMonitorSettings

# The target labels naming an engine's namespace, pod and SpecDeployment (LabelNames' fields).
LABELS = ("namespace", "pod", "instance")
# A Kubernetes label (an optional DNS-subdomain prefix, a name of up to 63 characters) and a
# Prometheus duration, as the PodMonitor schema takes them.
_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
LABEL_KEY = re.compile(rf"([a-z0-9]([-a-z0-9.]{{0,251}}[a-z0-9])?/)?{_NAME}")
LABEL_VALUE = re.compile(rf"({_NAME})?")
DURATION = re.compile(r"([0-9]+(ms|s|m|h))+")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="spectune-operator", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("crd", help="print the SpecDeployment CRD (YAML)")
    run = sub.add_parser("run", help="run the operator (in-cluster credentials, else $KUBECONFIG)")
    run.add_argument("--namespace", action="append", help="watch only these (default: all)")
    run.add_argument(
        "--peering",
        default="spectune",
        help="ClusterKopfPeering to meet other replicas in (created when missing)",
    )
    run.add_argument(
        "--peering-owner",
        metavar="CLUSTERROLE",
        help="the peering's owner: deleting this ClusterRole (the chart's) deletes the peering",
    )
    run.add_argument(
        "--priority",
        type=_priority,
        default=0,
        help="the highest-priority replica acts; `auto`: one derived from the host (pod) name, "
        "so that replicas of one Deployment differ",
    )
    run.add_argument(
        "--liveness", default="http://127.0.0.1:8080/healthz", help="kopf's liveness endpoint"
    )
    run.add_argument(
        "--metrics-address",
        metavar="HOST:PORT",
        help="serve the operator's Prometheus metrics here (default: off)",
    )
    run.add_argument(
        "--prometheus-url",
        default=os.environ.get("SPECTUNE_PROMETHEUS_URL", "http://127.0.0.1:9090"),
        help="the Prometheus that scrapes the engines (handlers get it as memo.prometheus_url)",
    )
    for target in LABELS:
        run.add_argument(
            f"--prometheus-{target}-label",
            dest=f"{target}_label",
            default=os.environ.get(f"SPECTUNE_PROMETHEUS_{target.upper()}_LABEL"),
            help=f"the engines' {target} target label in that Prometheus "
            f"(env SPECTUNE_PROMETHEUS_{target.upper()}_LABEL; default: the local cluster's)",
        )
    run.add_argument(
        "--no-engine-pod-monitors",
        dest="engine_pod_monitors",
        action="store_false",
        help="make no PodMonitor per SpecDeployment (one for all engines exists, e.g. the "
        "chart's monitoring.podMonitor: engines would be scraped twice)",
    )
    run.add_argument(
        "--scrape-annotations",
        action="store_true",
        help="annotate engine pods with prometheus.io/scrape, -port and -path even where the "
        "cluster serves PodMonitors (by default only where it does not, so that engines are "
        "scraped once): for a Prometheus that discovers pods by annotation",
    )
    run.add_argument(
        "--pod-monitor-label",
        dest="pod_monitor_labels",
        action="append",
        type=_label,
        default=[],
        metavar="KEY=VALUE",
        help="a label on each PodMonitor the operator makes, one a Prometheus selects them by "
        "(kube-prometheus-stack: release=<its release name>); repeatable",
    )
    run.add_argument(
        "--pod-monitor-interval",
        type=_duration,
        default="15s",
        help="the scrape interval those PodMonitors ask for (default: 15s, which gives the "
        "default 120 s calibration window the 8 scrapes it needs)",
    )
    run.add_argument(
        "--exploration-lease",
        type=_positive_seconds,
        default=60.0,
        metavar="SECONDS",
        help="raised exploration expires on the engines this long after the operator last "
        "renewed it, should the operator stop (default: 60)",
    )
    run.add_argument(
        "--log-level",
        default="INFO",
        choices=["DEBUG", "INFO", "WARNING"],
        help="DEBUG also shows every handler run",
    )
    args = parser.parse_args(argv)
    if args.command == "crd":
        from spectune.operator.crd import crd_yaml

        sys.stdout.write(crd_yaml())
        return 0
    return _run(args)


def _positive_seconds(value: str) -> float:
    seconds = float(value)
    if not 20 <= seconds <= 86_400:  # two resyncs at least (handlers.RESYNC_SECONDS)
        raise argparse.ArgumentTypeError(f"must be between 20 and 86400 seconds, got {value}")
    return seconds


def _label(value: str) -> tuple[str, str]:
    key, eq, label = value.partition("=")
    if not eq or not LABEL_KEY.fullmatch(key) or not LABEL_VALUE.fullmatch(label):
        raise argparse.ArgumentTypeError(f"not a Kubernetes label KEY=VALUE: {value!r}")
    return key, label


def _duration(value: str) -> str:
    if not DURATION.fullmatch(value):
        raise argparse.ArgumentTypeError(f"not a Prometheus duration such as 15s or 1m: {value!r}")
    return value


def _priority(value: str) -> int:
    """An integer, or `auto`: a stable hash of the host name (a pod's name) in [1, 2**30], so
    replicas of one Deployment get distinct priorities (kopf lets equal ones both act)."""
    if value == "auto":
        return 1 + zlib.crc32(socket.gethostname().encode()) % (2**30)
    return int(value)


def label_names(args: argparse.Namespace) -> LabelNames:
    """The reader's LabelNames: those given, the defaults for the rest."""
    from spectune.operator.prometheus import LabelNames

    given = {t: getattr(args, f"{t}_label") for t in LABELS}
    return LabelNames(**{t: name for t, name in given.items() if name})


def pod_monitor_settings(args: argparse.Namespace) -> PodMonitorSettings | None:
    """What the PodMonitor per SpecDeployment carries; None: make none."""
    from spectune.operator.render import PodMonitorSettings

    if not args.engine_pod_monitors:
        return None
    return PodMonitorSettings(args.pod_monitor_interval, dict(args.pod_monitor_labels))


def _run(args: argparse.Namespace) -> int:
    import logging

    import kopf

    from spectune.operator import handlers, peering

    labels = label_names(args)

    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("spectune.operator").info(
        "starting: namespaces=%s peering=%s priority=%d resync=%.0fs lease=%.0fs prometheus=%s %s "
        "metrics=%s",
        args.namespace or "all",
        args.peering,
        args.priority,
        handlers.RESYNC_SECONDS,
        args.exploration_lease,
        args.prometheus_url,
        labels,
        args.metrics_address or "off",
    )
    if args.metrics_address:
        from spectune.operator import metrics

        metrics.serve(args.metrics_address, args.namespace)

    @kopf.on.startup()
    def cluster_peering(settings: kopf.OperatorSettings, **_: Any) -> None:
        # kopf meets namespaced replicas in per-namespace KopfPeerings; ours meet in the one
        # ClusterKopfPeering whichever namespaces they watch.
        settings.peering.clusterwide = True
        peering.ensure(args.peering, args.peering_owner)

    kopf.run(
        clusterwide=not args.namespace,
        namespaces=args.namespace or [],
        peering_name=args.peering,
        priority=args.priority,
        liveness_endpoint=args.liveness,
        memo=kopf.Memo(
            prometheus_url=args.prometheus_url,
            prometheus_labels=labels,
            pod_monitors=pod_monitor_settings(args),
            scrape_annotations=args.scrape_annotations,
            exploration_lease=args.exploration_lease,
        ),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
