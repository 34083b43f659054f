"""`spectune-sim`: run a scenario (every policy under every seed) and write its report, compare
its one pool with split fleets, print sim.json's JSON Schema, or check a scenario file. Bad
input (a scenario that does not check, a trace that cannot be read, a bad argument) is one line
on stderr starting `spectune-sim: ` and exit code 2, never a traceback.

Every number the simulator writes is SIMULATED (a roofline model of each GPU SKU), not measured.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path

from spectune.engine.bench.workload import BenchError
from spectune.sim.results import SimResult
from spectune.sim.scenario import Scenario, ScenarioError, SyntheticSource, load_scenario

PROG = "spectune-sim"
USAGE_ERROR = 2


class UsageError(Exception):
    """Bad input, said in one line: main prints it after `spectune-sim: ` and exits 2."""


class Parser(argparse.ArgumentParser):
    """argparse that raises instead of printing usage and exiting, so that a bad argument is
    one line like every other bad input."""

    def error(self, message: str) -> None:  # type: ignore[override]
        command = self.prog.removeprefix(PROG).strip()
        where = f"{command}: " if command else ""
        raise UsageError(f"{where}{message} (see {self.prog} --help)")


def policy(text: str) -> str | int:
    """A policy as given on the command line: auto, never, always or a threshold >= 1."""
    if text in ("auto", "never", "always"):
        return text
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"unknown policy {text!r} (auto, never, always or a threshold >= 1)"
        ) from None
    if value < 1:
        raise argparse.ArgumentTypeError(
            f"a fixed threshold must be >= 1 (use 'never' for 0), got {value}"
        )
    return value


def parser() -> Parser:
    about = "Simulate a fleet of engine pods and the spectune operator in virtual time."
    p = Parser(prog=PROG, description=f"{about} Every number it writes is SIMULATED.")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = sub.add_parser("run", help="simulate a scenario and write its report")
    run.add_argument("scenario", type=Path, help="scenario YAML file")
    run.add_argument("--out", type=Path, help="report folder (default .cache/sim/<name>)")
    run.add_argument("--seeds", type=int, nargs="+", help="seeds (default: the scenario's)")
    run.add_argument(
        "--policies",
        type=policy,
        nargs="+",
        metavar="POLICY",
        help="auto, never, always or thresholds (default: the scenario's)",
    )
    run.add_argument(
        "--per-iteration",
        action="store_true",
        help="write every sequence every iteration, as the engine does (slower: the "
        "reference the default is held to)",
    )
    split = sub.add_parser(
        "split", help="compare one pool with split fleets (the scenario's bulk and split)"
    )
    split.add_argument("scenario", type=Path, help="scenario YAML file with bulk: and split:")
    split.add_argument("--out", type=Path, help="report folder (default .cache/sim/<name>-split)")
    split.add_argument("--seeds", type=int, nargs="+", help="seeds (default: the scenario's)")
    sub.add_parser("schema", help="print sim.json's JSON Schema")
    check = sub.add_parser("check", help="validate a scenario file and summarize it")
    check.add_argument("scenario", type=Path, help="scenario YAML file")
    return p


def main(argv: list[str] | None = None) -> int:
    """The command line: 0 on success, 2 with one line on stderr on bad input."""
    try:
        args = parser().parse_args(argv)
        return COMMANDS[args.command](args)
    except (UsageError, ScenarioError, BenchError) as err:
        return fail(str(err))
    except SystemExit as exit_:  # --help
        return exit_.code if isinstance(exit_.code, int) else 0
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130


def fail(message: str) -> int:
    """One line, whatever the message holds."""
    line = " ".join(message.split())
    print(f"{PROG}: {line}", file=sys.stderr)
    return USAGE_ERROR


def run_command(args: argparse.Namespace) -> int:
    """Load, simulate every policy x seed (progress to stderr), write the report, print its
    path."""
    scenario = load_scenario(args.scenario)
    policies = check_policies(args.policies)
    check_seeds("run", args.seeds)
    from spectune.sim.report import write_report
    from spectune.sim.run import simulate

    out = args.out or Path(".cache") / "sim" / folder_name(scenario.name)
    result = simulate(scenario, progress, policies, args.seeds, per_iteration=args.per_iteration)
    return written(lambda: write_report(result, out), out)


def split_command(args: argparse.Namespace) -> int:
    """One pool against each split of it (progress to stderr); print split.md's path."""
    scenario = load_scenario(args.scenario)
    if scenario.split is None:
        raise UsageError(f"split: {args.scenario} has no split: section (and a bulk: class)")
    check_seeds("split", args.seeds)
    from spectune.sim.split import compare, write

    out = args.out or Path(".cache") / "sim" / f"{folder_name(scenario.name)}-split"
    result = compare(scenario, seeds=args.seeds, progress=progress)
    return written(lambda: write(result, out), out)


def written(write: Callable[[], Path], out: Path) -> int:
    """Write a report under `out` and print its path; a folder that cannot be written is
    one line."""
    try:
        report = write()
    except OSError as err:
        raise UsageError(f"cannot write the report to {out}: {err.strerror or err}") from None
    print(report)
    return 0


def check_seeds(command: str, seeds: list[int] | None) -> None:
    """--seeds as given, refused when one is listed twice (the scenario's own rule)."""
    if seeds is not None and len(set(seeds)) != len(seeds):
        raise UsageError(f"{command}: --seeds lists a seed twice")


def check_policies(policies: list[str | int] | None) -> list[str | int] | None:
    """--policies as given, refused when one is listed twice (the scenario's own rule)."""
    if policies is not None and len(set(map(str, policies))) != len(policies):
        raise UsageError("run: --policies lists a policy twice")
    return policies


def folder_name(name: str) -> str:
    """A scenario name as one folder: anything but letters, digits, '.', '_', '-' becomes '-'."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip(".-") or "scenario"


def progress(line: str) -> None:
    """simulate's progress lines go to stderr, so that stdout is only the report's path."""
    print(line, file=sys.stderr, flush=True)


def schema_command(args: argparse.Namespace) -> int:
    """sim.json's published JSON Schema."""
    print(json.dumps(SimResult.model_json_schema(mode="serialization"), indent=2))
    return 0


def check_command(args: argparse.Namespace) -> int:
    """Validate a scenario (and read its trace, which may be a file) and summarize it."""
    scenario = load_scenario(args.scenario)
    print(f"{args.scenario}: ok: {summary(scenario)}")
    return 0


def summary(s: Scenario) -> str:
    """A scenario in one line: traffic, fleet, autoscaler, events, policies, seeds."""
    pools = ", ".join(f"{p.replicas} x {p.sku}" for p in s.fleet.pools)
    parts = [
        f"{s.name!r}",
        traffic(s),
        f"{s.replicas} pods ({pools})",
        *([f"bulk {s.bulk.share:.0%} of requests"] if s.bulk else []),
        *(
            [f"split: {', '.join(map(str, s.split.interactive_pods))} pods interactive"]
            if s.split
            else []
        ),
        f"autoscaler {s.autoscaler.min}-{s.autoscaler.max}" if s.autoscaler else "no autoscaler",
        f"events: {kinds(s)}" if s.events else "no events",
        f"policies {', '.join(map(str, s.policies))}",
        f"seeds {', '.join(map(str, s.seeds))}",
        f"{s.window_s:g} s windows",
    ]
    return "; ".join(parts)


def kinds(s: Scenario) -> str:
    """Each event as kind@time, in time order."""
    return ", ".join(f"{e.kind}@{e.at_s:g}s" for e in sorted(s.events, key=lambda e: e.at_s))


def traffic(s: Scenario) -> str:
    """The traffic in words; a trace is read, so that a missing or bad trace fails here."""
    t = s.traffic
    if isinstance(t, SyntheticSource):
        return (
            f"synthetic {t.rate:g} req/s for {t.duration_s:g} s "
            f"({t.prompt_tokens} prompt, {t.output_tokens} output tokens)"
        )
    from spectune.engine.bench.trace_file import load_trace

    recorded = load_trace(t.name).requests
    end = t.start_s + t.duration_s if t.duration_s is not None else recorded[-1].offset_s
    n = sum(t.start_s <= r.offset_s <= end for r in recorded)
    copies = "" if t.copies == 1 else f" x {t.copies} copies"
    return (
        f"trace {t.name}: {n} requests{copies} in {max(end - t.start_s, 0):.0f} s of trace "
        f"(at {t.speed:g}x speed, lengths x {t.scale:g})"
    )


COMMANDS = {
    "run": run_command,
    "split": split_command,
    "schema": schema_command,
    "check": check_command,
}


if __name__ == "__main__":
    sys.exit(main())
