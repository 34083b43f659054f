"""`spectune-operator`: run the operator, or print the CRD generated from the models."""

from __future__ import annotations

import argparse
import os
import re
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import kopf

    from spectune.operator.prometheus import LabelNames
    from spectune.operator.prometheus_access import PrometheusAccess
    from spectune.operator.render import PodMonitorSettings

# The target labels naming an engine's namespace and pod (LabelNames' fields).
LABELS = ("namespace", "pod")
# A Kubernetes label (an optional DNS-subdomain prefix, a name of up to 63 characters) and a
# Prometheus duration, as the PodMonitor schema takes them.
_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
LABEL_KEY = re.compile(rf"([a-z0-9]([-a-z0-9.]{{0,251}}[a-z0-9])?/)?{_NAME}")
LABEL_VALUE = re.compile(rf"({_NAME})?")
DURATION = re.compile(r"([0-9]+(ms|s|m|h))+")
# An HTTP header name (RFC 9110's token).
HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")


def main(argv: list[str] | None = None) -> int:
    cli = parser()
    args = cli.parse_args(argv)
    if args.command == "run" and (problems := prometheus_access(args).problems()):
        cli.error("; ".join(problems))
    if args.command == "crd":
        from spectune.operator.crd import crd_yaml

        sys.stdout.write(crd_yaml())
        return 0
    return _run(args)


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="spectune-operator", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("crd", help="print the SpecDeployment CRD (YAML)")
    run = sub.add_parser("run", help="run the operator (in-cluster credentials, else $KUBECONFIG)")
    run.add_argument("--namespace", action="append", help="watch only these (default: all)")
    run.add_argument(
        "--leader-election-namespace",
        help="the namespace of the Lease replicas elect the one acting replica by (default: the "
        "pod's, from POD_NAMESPACE or its ServiceAccount; outside a pod, the kubeconfig's)",
    )
    run.add_argument(
        "--leader-election-lease",
        default="spectune-operator",
        help="that Lease's name: replicas sharing it act one at a time (default: %(default)s)",
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
    _access_flags(run)
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
        "--engine-image",
        default=None,
        help="the engine image of SpecDeployments that name none (default: "
        "ghcr.io/spectune/spectune-engine at this operator's version); the chart sets it",
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
    return parser


def _access_flags(run: argparse.ArgumentParser) -> None:
    """How to reach a Prometheus that is not open (PrometheusAccess: files read per request)."""
    files = {
        "bearer-token-file": "a file holding a bearer token (a mounted Secret, or the "
        "ServiceAccount's token for Thanos Querier or OpenShift's Prometheus)",
        "basic-auth-password-file": "a file holding the basic auth password",
        "ca-file": "a CA bundle to verify the Prometheus server with (default: the system's)",
        "cert-file": "a client certificate to present (with --prometheus-key-file)",
        "key-file": "the client certificate's key",
    }
    for flag, help_ in files.items():
        run.add_argument(f"--prometheus-{flag}", metavar="PATH", help=help_)
    run.add_argument("--prometheus-basic-auth-user", metavar="USER", help="the basic auth user")
    run.add_argument(
        "--prometheus-header",
        dest="prometheus_headers",
        action="append",
        type=_header,
        default=[],
        metavar="NAME=VALUE",
        help="a header sent with every request, e.g. X-Scope-OrgID=tenant-1 for Grafana Mimir "
        "or Cortex; repeatable (values are never logged)",
    )


def prometheus_access(args: argparse.Namespace) -> PrometheusAccess:
    """The reader's TLS, credentials and headers, from the flags."""
    from spectune.operator.prometheus_access import PrometheusAccess

    return PrometheusAccess(
        bearer_token_file=args.prometheus_bearer_token_file,
        basic_auth_user=args.prometheus_basic_auth_user,
        basic_auth_password_file=args.prometheus_basic_auth_password_file,
        ca_file=args.prometheus_ca_file,
        cert_file=args.prometheus_cert_file,
        key_file=args.prometheus_key_file,
        headers=tuple(args.prometheus_headers),
    )


def _header(value: str) -> tuple[str, str]:
    name, eq, header = value.partition("=")
    if not eq or not HEADER_NAME.fullmatch(name) or "\n" in header or "\r" in header:
        raise argparse.ArgumentTypeError(f"not a header NAME=VALUE: {value.partition('=')[0]!r}")
    return name, header


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


def handler_memo(args: argparse.Namespace) -> kopf.Memo:
    """What the handlers get from the flags (kopf's memo)."""
    import kopf

    return kopf.Memo(
        prometheus_url=args.prometheus_url,
        prometheus_access=prometheus_access(args),
        prometheus_labels=label_names(args),
        pod_monitors=pod_monitor_settings(args),
        scrape_annotations=args.scrape_annotations,
        exploration_lease=args.exploration_lease,
        engine_image=args.engine_image,
    )


def _run(args: argparse.Namespace) -> int:
    import asyncio
    import logging

    import kopf

    from spectune.operator import handlers, leadership

    labels = label_names(args)

    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    lease_namespace = args.leader_election_namespace or leadership.own_namespace()
    logging.getLogger("spectune.operator").info(
        "starting: namespaces=%s leader-election=%s/%s resync=%.0fs exploration-lease=%.0fs "
        "prometheus=%s (%s) %s metrics=%s",
        args.namespace or "all",
        lease_namespace,
        args.leader_election_lease,
        handlers.RESYNC_SECONDS,
        args.exploration_lease,
        args.prometheus_url,
        prometheus_access(args).describe(),
        labels,
        args.metrics_address or "off",
    )
    if args.metrics_address:
        from spectune.operator import metrics

        metrics.serve(args.metrics_address, args.namespace)

    # Standalone: no kopf peering; the Lease makes this the one acting replica.
    settings = kopf.OperatorSettings()
    memo = handler_memo(args)

    async def operate(stop: asyncio.Event) -> None:
        ready = asyncio.Event()
        signals = asyncio.create_task(leadership.take_signals_back(stop, ready))
        try:
            await kopf.operator(
                clusterwide=not args.namespace,
                namespaces=args.namespace or [],
                standalone=True,
                liveness_endpoint=args.liveness,
                settings=settings,
                stop_flag=stop,
                ready_flag=ready,
                memo=memo,
            )
        finally:
            signals.cancel()
        # Sync handlers may still be finishing in kopf's threads: the Lease is held until then.
        await asyncio.to_thread(settings.execution.executor.shutdown, wait=True)

    leases = leadership.Leases(lease_namespace, args.leader_election_lease)
    elector = leadership.Elector(leases, handlers.reporting_instance())
    return leadership.run_elected(elector, args.liveness, operate, handlers.TURNS.wait_idle)


if __name__ == "__main__":
    sys.exit(main())
