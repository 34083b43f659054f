"""Which part of spectune may import which, checked by reading every module's imports
(nothing is executed), so that the engine's rooms stay rooms and the operator never pulls
torch. DESIGN.md "Layout" is the map these rules keep true."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

# Source folders and the import names they are installed as (pyproject's package-dir).
PACKAGE_DIRS = {
    "engine": "spectune.engine",
    "operator": "spectune.operator",
    "demo": "spectune.demo",
    "sim": "spectune.sim",
    "hack": "hack",
}

# The engine modules the operator may import: pure Python, no torch.
TORCH_FREE = (
    "spectune.engine.contract",
    "spectune.engine.crossover",
    "spectune.engine.device_time",
)

# What the fleet simulator runs of the engine: its scheduling, KV books and gate, the device
# model, the trace files. All torch-free.
SIMULATED_ENGINE = (
    *TORCH_FREE,
    "spectune.engine.block_manager",
    "spectune.engine.draft_lag",
    "spectune.engine.gate",
    "spectune.engine.request_timing",
    "spectune.engine.scheduler",
    "spectune.engine.sequence",
    "spectune.engine.simulated_device",
    "spectune.engine.bench.trace_file",
    "spectune.engine.bench.workload",
)

ENGINE_PARTS = ("spectune.engine.serving", "spectune.engine.bench", "spectune.engine.zoo")

# The operator's decisions: pure functions of what was observed, tested without a cluster.
DECISIONS = tuple(
    f"spectune.operator.{m}"
    for m in (
        "autotune",
        "triggers",
        "estimator",
        "damping",
        "verification",
        "observations",
        "fleet_memory",
        "scraping",
        "tuning",
        "lease",
        "applying",
    )
)
IO = (
    "kopf",
    "kubernetes",
    "prometheus_api_client",
    "requests",
    "urllib",
    "spectune.operator.engines",
    "spectune.operator.handlers",
    "spectune.operator.kube",
    "spectune.operator.prometheus",
    "spectune.operator.prometheus_access",
)


@dataclass(frozen=True)
class Rule:
    """Modules in `importers` (less `exempt`) must not import `forbidden` (less `allowed`).
    Each entry names a module or a package, which covers everything below it."""

    why: str
    importers: tuple[str, ...]
    forbidden: tuple[str, ...]
    exempt: tuple[str, ...] = ()
    allowed: tuple[str, ...] = ()


RULES = (
    Rule(
        "the core imports nothing of the server, the bench or the zoo",
        importers=("spectune.engine",),
        exempt=(*ENGINE_PARTS, "spectune.engine.cli"),
        forbidden=ENGINE_PARTS,
    ),
    Rule(
        "the engine imports nothing of the operator or hack/",
        importers=("spectune.engine",),
        forbidden=("spectune.operator", "hack"),
    ),
    Rule(
        "the operator imports only the engine's torch-free modules",
        importers=("spectune.operator",),
        forbidden=("spectune.engine", "torch"),
        allowed=TORCH_FREE,
    ),
    Rule(
        "the operator's decisions do no I/O: no client library, no module that does",
        importers=DECISIONS,
        forbidden=IO,
    ),
    Rule(
        "the simulator runs the engine's torch-free parts and the operator's decisions, "
        "never torch, a cluster client or anything that does I/O",
        importers=("spectune.sim",),
        forbidden=("spectune.engine", "spectune.operator", "torch", *IO),
        allowed=(
            *SIMULATED_ENGINE,
            *DECISIONS,
            "spectune.operator.models",
            "spectune.operator.render",
            "spectune.operator.status",
            "spectune.operator.window",
        ),
    ),
)


def _within(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _module_name(path: Path, folder: Path, package: str) -> str:
    parts = [package, *path.relative_to(folder).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(tree: ast.Module, module: str, is_package: bool) -> set[str]:
    """Absolute names of what `module` imports anywhere (a `from a import b` gives `a.b`,
    which covers both a submodule b and a name b defined in a)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = module.split(".")
                keep = len(parts) - node.level + (1 if is_package else 0)
                base = ".".join([*parts[:keep], *([base] if base else [])])
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def module_imports(root: Path) -> dict[str, set[str]]:
    """Module name -> the names it imports, for every .py file in the package folders."""
    found: dict[str, set[str]] = {}
    for folder_name, package in PACKAGE_DIRS.items():
        folder = root / folder_name
        for path in sorted(folder.rglob("*.py")):
            module = _module_name(path, folder, package)
            tree = ast.parse(path.read_text(), filename=str(path))
            found[module] = _imported(tree, module, path.name == "__init__.py")
    return found


def violations(imports: dict[str, set[str]], rules: tuple[Rule, ...] = RULES) -> list[str]:
    """One line per forbidden import: who imports what, and the rule it breaks."""
    found = []
    for rule in rules:
        for module, names in sorted(imports.items()):
            if not _within(module, rule.importers) or _within(module, rule.exempt):
                continue
            for name in sorted(names):
                if _within(name, rule.forbidden) and not _within(name, rule.allowed):
                    found.append(f"{module} imports {name}: {rule.why}")
    return found


def imported_test_modules(root: Path) -> list[str]:
    """One line per import of a test module or a conftest by a file under tests/: helpers live
    in support modules, so that importing one never collects another module's tests or runs
    its set-up, and a test module can be moved or deleted alone."""
    found = []
    tests = root / "tests"
    for path in sorted(tests.rglob("*.py")):
        module = _module_name(path, tests, "tests")
        tree = ast.parse(path.read_text(), filename=str(path))
        for name in sorted(_imported(tree, module, path.name == "__init__.py")):
            parts = name.split(".")
            if parts[0] == "tests" and any(
                p == "conftest" or p.startswith("test_") for p in parts[1:]
            ):
                found.append(f"{module} imports {name}")
    return found
