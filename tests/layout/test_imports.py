"""The layout's import directions hold, the checker catches a forbidden import, the
modules the operator may import load no torch, and no test module imports another."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from .import_rules import TORCH_FREE, imported_test_modules, module_imports, violations

REPO = Path(__file__).resolve().parents[2]


def test_the_repository_follows_the_import_directions() -> None:
    imports = module_imports(REPO)
    assert {"spectune.engine.engine", "spectune.operator.handlers"} <= imports.keys()
    assert violations(imports) == []


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_the_checker_names_each_forbidden_import(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "engine/__init__.py": "",
            "engine/gate.py": "from spectune.engine.serving.server import create_app\n",
            "engine/model.py": "def f():\n    import hack.pod_runner\n",
            "engine/sampling.py": "from .zoo import registry\n",
            "engine/cli.py": "from spectune.engine.bench.runner import run\n",
            "engine/serving/__init__.py": "",
            "engine/serving/server.py": "from spectune.engine.engine import LLMEngine\n",
            "engine/zoo/__init__.py": "",
            "engine/zoo/training.py": "from ..model import Transformer\n",
            "operator/__init__.py": "",
            "operator/handlers.py": (
                "from spectune.engine import contract\n"
                "from spectune.engine.crossover import speedup_curve\n"
                "import spectune.engine.engine\n"
            ),
            "operator/autotune.py": (
                "import kopf\nfrom spectune.operator.prometheus import FleetWindow\n"
            ),
            "hack/pod_runner.py": "import spectune.operator.kube\n",
        },
    )
    imports = module_imports(root)
    assert imports["spectune.engine.zoo.training"] == {"spectune.engine.model.Transformer"}
    assert violations(imports) == [
        "spectune.engine.gate imports spectune.engine.serving.server.create_app: "
        "the core imports nothing of the server, the bench or the zoo",
        "spectune.engine.sampling imports spectune.engine.zoo.registry: "
        "the core imports nothing of the server, the bench or the zoo",
        "spectune.engine.model imports hack.pod_runner: "
        "the engine imports nothing of the operator or hack/",
        "spectune.operator.handlers imports spectune.engine.engine: "
        "the operator imports only the engine's torch-free modules",
        "spectune.operator.autotune imports kopf: "
        "the operator's decisions do no I/O: no client library, no module that does",
        "spectune.operator.autotune imports spectune.operator.prometheus.FleetWindow: "
        "the operator's decisions do no I/O: no client library, no module that does",
    ]


def test_the_torch_free_modules_load_no_torch() -> None:
    code = f"import sys\nimport {', '.join(TORCH_FREE)}\nprint(sorted(m for m in sys.modules))"
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert "'spectune.engine.crossover'" in loaded
    assert "'torch'" not in loaded and "'numpy'" not in loaded


def test_no_imported_test_modules_another_or_a_conftest() -> None:
    assert imported_test_modules(REPO) == []


def test_the_checker_names_an_imported_test_module(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "tests/__init__.py": "",
            "tests/a/__init__.py": "",
            "tests/a/support.py": "",
            "tests/a/test_x.py": "from .support import helper\nfrom .conftest import sd\n",
            "tests/a/test_y.py": "from tests.a.test_x import thing\n",
        },
    )
    assert imported_test_modules(root) == [
        "tests.a.test_x imports tests.a.conftest.sd",
        "tests.a.test_y imports tests.a.test_x.thing",
    ]


def test_the_simulator_loads_no_torch_and_no_cluster_client() -> None:
    code = (
        "import sys\nimport spectune.sim.run, spectune.sim.cli, spectune.sim.report\n"
        "print(sorted(m for m in sys.modules))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert "'spectune.operator.tuning'" in loaded and "'spectune.engine.scheduler'" in loaded
    for heavy in ("torch", "kopf", "kubernetes", "prometheus_api_client", "requests"):
        assert f"'{heavy}'" not in loaded, heavy
