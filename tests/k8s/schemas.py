"""The schemas the manifests of ``multigpu k8s`` must pass: the operators' published CRDs (kept
gzipped in ``crds/``, see its README) and NetworkPolicy's, validated with ``jsonschema``.

Kubernetes' structural schemas do not forbid unknown fields (the API server drops them, or
refuses them with ``kubectl apply --validate=strict``); ``strict`` adds
``additionalProperties: false`` wherever a schema lists its properties and does not keep unknown
fields, so that a misspelt field fails here as it would under strict validation.
"""

from __future__ import annotations

import copy
import gzip
import re
from functools import cache
from pathlib import Path
from typing import Any

import yaml

CRDS = Path(__file__).resolve().parent / "crds"
FILES = {
    ("trainer.kubeflow.org/v1alpha1", "TrainJob"): "trainer.kubeflow.org_trainjobs.v2.3.0.yaml.gz",
    ("kubeflow.org/v1", "PyTorchJob"): "kubeflow.org_pytorchjobs.v1.9.2.yaml.gz",
}

_LABELS = {"type": "object", "additionalProperties": {"type": "string"}}
_SELECTOR = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "matchLabels": _LABELS,
        "matchExpressions": {"type": "array", "items": {"type": "object"}},
    },
}
_PEER = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "podSelector": _SELECTOR,
        "namespaceSelector": _SELECTOR,
        "ipBlock": {"type": "object", "required": ["cidr"]},
    },
}
_PORT = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "protocol": {"enum": ["TCP", "UDP", "SCTP"]},
        "port": {"anyOf": [{"type": "integer"}, {"type": "string"}]},
        "endPort": {"type": "integer"},
    },
}
NETWORK_POLICY: dict[str, Any] = {
    # networking.k8s.io/v1 NetworkPolicy, from the Kubernetes API reference (NetworkPolicySpec,
    # NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicyPort, LabelSelector).
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "networking.k8s.io/v1"},
        "kind": {"const": "NetworkPolicy"},
        "metadata": {"type": "object", "required": ["name"]},
        "spec": {
            "type": "object",
            "required": ["podSelector"],
            "additionalProperties": False,
            "properties": {
                "podSelector": _SELECTOR,
                "policyTypes": {"type": "array", "items": {"enum": ["Ingress", "Egress"]}},
                "ingress": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {
                            "from": {"type": "array", "items": _PEER},
                            "ports": {"type": "array", "items": _PORT},
                        },
                    },
                },
                "egress": {"type": "array", "items": {"type": "object"}},
            },
        },
    },
}


def strict(schema: Any) -> Any:
    """A copy of ``schema`` in which every object that lists its properties refuses others."""
    schema = copy.deepcopy(schema)

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if (
                "properties" in node
                and "additionalProperties" not in node
                and not node.get("x-kubernetes-preserve-unknown-fields")
            ):
                node["additionalProperties"] = False
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema)
    return schema


@cache
def crd(api_version: str, kind: str) -> dict[str, Any]:
    """The published CRD of ``kind`` (the whole YAML document)."""
    with gzip.open(CRDS / FILES[(api_version, kind)], "rt") as fh:
        loaded: dict[str, Any] = yaml.safe_load(fh)
    return loaded


@cache
def object_schema(api_version: str, kind: str) -> dict[str, Any]:
    """The strict JSON schema of a whole object of ``kind`` at ``api_version``."""
    if kind == "NetworkPolicy":
        return NETWORK_POLICY
    definition = crd(api_version, kind)
    group, version = api_version.split("/")
    assert definition["spec"]["group"] == group and definition["spec"]["names"]["kind"] == kind
    served = {v["name"]: v for v in definition["spec"]["versions"] if v.get("served")}
    schema = strict(served[version]["schema"]["openAPIV3Schema"])
    schema["properties"]["apiVersion"] = {"const": api_version}
    schema["properties"]["kind"] = {"const": kind}
    schema["required"] = sorted({*schema.get("required", []), "apiVersion", "kind", "metadata"})
    return schema


def errors(document: dict[str, Any]) -> list[str]:
    """Every schema error of one manifest document (empty: valid)."""
    import jsonschema

    validator = jsonschema.Draft7Validator(object_schema(document["apiVersion"], document["kind"]))
    found = [
        f"{'/'.join(map(str, e.absolute_path)) or '.'}: {e.message}"
        for e in validator.iter_errors(document)
    ]
    # The TrainJob CRD's own CEL rules (x-kubernetes-validations, which jsonschema does not
    # run) and the PyTorchJob webhook's NameIsDNS1035Label: an RFC 1035 label, <= 63 characters.
    name = str(document.get("metadata", {}).get("name", ""))
    if not re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name) or len(name) > 63:
        found.append(f"metadata/name: {name!r} is not an RFC 1035 DNS label of <= 63 characters")
    return found
