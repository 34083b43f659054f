"""The committed CRD is what the pydantic models generate, and it is structural."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import yaml

from spectune.operator.crd import crd, crd_yaml

CRD_FILE = Path(__file__).parents[2] / "crds" / "specdeployments.spectune.io.yaml"


def walk(node: object, path: str = "") -> Iterator[tuple[str, dict]]:
    if isinstance(node, dict):
        yield path, node
        for key, child in node.items():
            yield from walk(child, f"{path}.{key}")
    elif isinstance(node, list):
        for i, child in enumerate(node):
            yield from walk(child, f"{path}[{i}]")


def test_committed_crd_matches_the_models() -> None:
    assert CRD_FILE.read_text() == crd_yaml(), "crds/ is stale: run `make crds`"


def test_schema_is_structural() -> None:
    schema = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for path, node in walk(schema):
        if path.endswith(".properties"):
            continue
        assert not {"$ref", "anyOf", "allOf", "oneOf", "title", "$defs"} & set(node), path
        if "properties" in node:
            assert node.get("type") == "object" and "additionalProperties" not in node, path


def test_names_subresources_and_columns() -> None:
    spec = crd()["spec"]
    assert spec["names"]["shortNames"] == ["sd"] and spec["names"]["categories"] == ["spectune"]
    version = spec["versions"][0]
    assert version["subresources"]["scale"]["labelSelectorPath"] == ".status.selector"
    columns = [c["name"] for c in version["additionalPrinterColumns"]]
    assert columns == ["Replicas", "Ready", "Threshold", "Crossover", "Goodput", "Age"]


def test_cel_rules_carry_messages() -> None:
    rules = [r for _, node in walk(crd()) for r in node.get("x-kubernetes-validations", [])]
    messages = " ".join(r["message"] for r in rules)
    assert "threshold.min must not exceed threshold.max" in messages
    assert "speculation.draft is required when method is draft" in messages
    assert yaml.safe_load(crd_yaml()) == crd()


def test_the_crd_does_not_depend_on_what_was_imported_first() -> None:
    """The engine's settings declare the same Literals; whichever module is imported first
    must not change the CRD (typing caches equal Literals regardless of their order)."""
    code = (
        "import spectune.engine.serving.settings\n"
        "from spectune.operator.crd import crd_yaml\n"
        "print(crd_yaml(), end='')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout == CRD_FILE.read_text()
