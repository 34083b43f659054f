"""`spectune-operator`: run the operator, or print the CRD generated from the models."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="spectune-operator", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("crd", help="print the SpecDeployment CRD (YAML)")
    run = sub.add_parser("run", help="run the operator (in-cluster credentials, else $KUBECONFIG)")
    run.add_argument("--namespace", action="append", help="watch only these (default: all)")
    run.add_argument(
        "--peering", default="spectune", help="ClusterKopfPeering to meet other replicas in"
    )
    run.add_argument("--priority", type=int, default=0, help="the highest-priority replica acts")
    run.add_argument(
        "--liveness", default="http://127.0.0.1:8080/healthz", help="kopf's liveness endpoint"
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


def _run(args: argparse.Namespace) -> int:
    import logging

    import kopf

    from spectune.operator import handlers

    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("spectune.operator").info(
        "starting: namespaces=%s peering=%s priority=%d resync=%.0fs",
        args.namespace or "all",
        args.peering,
        args.priority,
        handlers.RESYNC_SECONDS,
    )
    kopf.run(
        clusterwide=not args.namespace,
        namespaces=args.namespace or [],
        peering_name=args.peering,
        priority=args.priority,
        liveness_endpoint=args.liveness,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
