"""Generate the SpecDeployment CustomResourceDefinition from the pydantic models.

pydantic writes JSON Schema; Kubernetes wants a structural OpenAPI v3 schema: no $ref,
no anyOf over types, no titles. This module translates one into the other and adds
what only a CRD has (subresources, printer columns, names).
"""

from __future__ import annotations

from typing import Any

import yaml
from pydantic import BaseModel

from spectune.operator import models as m

KEPT = {
    "type",
    "description",
    "default",
    "enum",
    "minimum",
    "maximum",
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "format",
    "x-kubernetes-validations",
    "x-kubernetes-preserve-unknown-fields",
}

PRINTER_COLUMNS = [
    {"name": "Replicas", "type": "integer", "jsonPath": ".spec.replicas"},
    {"name": "Ready", "type": "integer", "jsonPath": ".status.readyReplicas"},
    {"name": "Threshold", "type": "integer", "jsonPath": ".status.threshold.current"},
    {"name": "Crossover", "type": "integer", "jsonPath": ".status.crossover.batchSize"},
    {"name": "Goodput", "type": "string", "jsonPath": ".status.goodput"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def structural(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """One JSON Schema node → a structural OpenAPI node (recursively)."""
    if "$ref" in node:
        target = defs[node["$ref"].rsplit("/", 1)[-1]]
        return structural({**target, **{k: v for k, v in node.items() if k != "$ref"}}, defs)
    if "anyOf" in node:
        variants = [v for v in node["anyOf"] if v.get("type") != "null"]
        rest = {k: v for k, v in node.items() if k != "anyOf"}
        if {v.get("type") for v in variants} == {"integer", "string"}:
            return {"x-kubernetes-int-or-string": True} | _describe(rest)
        (only,) = variants
        return structural({**only, **rest}, defs)
    if "const" in node:
        node = {**node, "enum": [node["const"]]}
    out = {k: v for k, v in node.items() if k in KEPT and not (k == "default" and v is None)}
    if "properties" in out:
        required = set(out.get("required", []))
        out["properties"] = {
            name: structural(child, defs) for name, child in out["properties"].items()
        }
        for name, child in out["properties"].items():
            # An optional section defaults to {} so the API server fills in its defaults; one
            # with required fields cannot (and must stay absent until it is written whole).
            if (
                name not in required
                and child.get("type") == "object"
                and "properties" in child
                and not child.get("required")
            ):
                child.setdefault("default", {})
    if out.get("additionalProperties") is False or out.get("x-kubernetes-preserve-unknown-fields"):
        # structural schemas prune unknown fields, or keep them all
        out.pop("additionalProperties", None)
    if isinstance(out.get("additionalProperties"), dict):
        out["additionalProperties"] = structural(out["additionalProperties"], defs)
    if "items" in out:
        out["items"] = structural(out["items"], defs)
    return out


def _describe(node: dict[str, Any]) -> dict[str, Any]:
    return {"description": node["description"]} if "description" in node else {}


def schema_of(model: type[BaseModel]) -> dict[str, Any]:
    raw = model.model_json_schema(mode="validation")
    return structural(raw, raw.get("$defs", {}))


def with_section_defaults(node: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    """Give every optional object section its full default (the API server checks a default
    against the section's CEL rules as it stands, so `{}` would not do)."""
    required = set(node.get("required", []))
    for name, child in node.get("properties", {}).items():
        if child.get("type") == "object" and "properties" in child and name in defaults:
            if name not in required:
                child["default"] = defaults[name]
            with_section_defaults(child, defaults[name])
    return node


def crd() -> dict[str, Any]:
    minimal = m.SpecDeploymentSpec.model_validate({"model": {"name": "-"}})
    spec = with_section_defaults(
        schema_of(m.SpecDeploymentSpec), minimal.model_dump(exclude_none=True)
    )
    status = schema_of(m.SpecDeploymentStatus)
    root = {
        "type": "object",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec,
            "status": status,
        },
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{m.PLURAL}.{m.GROUP}"},
        "spec": {
            "group": m.GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": m.KIND,
                "listKind": f"{m.KIND}List",
                "plural": m.PLURAL,
                "singular": m.KIND.lower(),
                "shortNames": ["sd"],
                "categories": ["spectune"],
            },
            "versions": [
                {
                    "name": m.VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": root},
                    "subresources": {
                        "status": {},
                        "scale": {
                            "specReplicasPath": ".spec.replicas",
                            "statusReplicasPath": ".status.replicas",
                            "labelSelectorPath": ".status.selector",
                        },
                    },
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                }
            ],
        },
    }


def crd_yaml() -> str:
    header = "# Generated from operator/models.py by `make crds`; do not edit.\n"
    return header + yaml.dump(crd(), Dumper=_NoAliases, sort_keys=False, width=100)


class _NoAliases(yaml.SafeDumper):
    """A default that repeats a section's schema is written out again, not as a YAML alias:
    kubectl and helm read aliases, but a reader of the CRD should not have to."""

    def ignore_aliases(self, data: Any) -> bool:
        return True
