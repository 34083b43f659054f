"""Engine pods as a GPU cluster needs them, against the real API server and the pod runner:
weights from a PersistentVolumeClaim (a checkpoint transformers wrote, served token for token
as transformers generates it), Pod Security `restricted` admission, an engine without usable
CUDA saying so in its pod's status, and the examples a user applies."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from openai import OpenAI

from spectune.engine.zoo.training import byte_tokenizer
from spectune.operator import render
from spectune.operator.models import parse_spec
from tests.cluster.support import REPO
from tests.support.hf_checkpoints import hf_checkpoint
from tests.support.waiting import wait_until

from .support import PORT, all_ready, create, kubectl, specdeployment

pytestmark = pytest.mark.cluster
RESTRICTED = {"pod-security.kubernetes.io/enforce": "restricted"}
PROMPT = "def main():\n"
NEW_TOKENS = 24


@pytest.fixture
def restricted(admin: client.ApiClient) -> Iterator[str]:
    """A namespace where Pod Security admission enforces the `restricted` profile."""
    name = f"psa-{uuid.uuid4().hex[:8]}"
    core = client.CoreV1Api(admin)
    core.create_namespace({"metadata": {"name": name, "labels": RESTRICTED}})
    yield name
    core.delete_namespace(name)


def engine_pod(spec: dict[str, Any]) -> dict[str, Any]:
    """The pod the operator's Deployment for `spec` would have made."""
    parsed = parse_spec(spec)
    deployment = render.deployment("llm", "ns", parsed, render.engine_config(parsed, 8, 2))
    template = deployment["spec"]["template"]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "llm-0", **template["metadata"]},
        "spec": template["spec"],
    }


def test_engine_pods_pass_pod_security_restricted(admin, restricted) -> None:
    core = client.CoreV1Api(admin)
    claim = {"persistentVolumeClaim": {"claimName": "weights"}}
    spec = specdeployment("x", model={"name": "llama", "volume": claim})["spec"]
    core.create_namespaced_pod(restricted, engine_pod(spec), dry_run="All")
    # the same admission refuses a pod whose template allows privilege escalation: it bites
    spec["engine"]["template"] = {
        "spec": {
            "containers": [
                {"name": "engine", "securityContext": {"allowPrivilegeEscalation": True}}
            ]
        }
    }
    with pytest.raises(ApiException) as refused:
        core.create_namespaced_pod(restricted, engine_pod(spec), dry_run="All")
    assert refused.value.status == 403 and "violates PodSecurity" in refused.value.body


def claimed_volume(admin: client.ApiClient, namespace: str, directory: Path) -> str:
    """A PersistentVolume over `directory` and a claim bound to it; the claim's name."""
    core = client.CoreV1Api(admin)
    pv = f"weights-{namespace}"
    core.create_persistent_volume(
        {
            "metadata": {"name": pv},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadOnlyMany"],
                "persistentVolumeReclaimPolicy": "Retain",
                "storageClassName": "",
                "hostPath": {"path": str(directory), "type": "Directory"},
            },
        }
    )
    core.create_namespaced_persistent_volume_claim(
        namespace,
        {
            "metadata": {"name": "weights"},
            "spec": {
                "accessModes": ["ReadOnlyMany"],
                "storageClassName": "",
                "volumeName": pv,
                "resources": {"requests": {"storage": "1Gi"}},
            },
        },
    )
    wait_until(
        "the claim to be bound",
        lambda: (
            core.read_namespaced_persistent_volume_claim("weights", namespace).status.phase
            == "Bound"
        ),
    )
    return "weights"


@pytest.fixture
def weights(
    admin: client.ApiClient, restricted: str, tmp_path: Path
) -> Iterator[tuple[str, torch.nn.Module]]:
    """A claim holding a Llama target (llama/) and a Qwen2 draft (qwen2/) that transformers
    saved, in the restricted namespace; the claim's name and the target as transformers loads it."""
    target = hf_checkpoint("llama", tmp_path / "llama")
    hf_checkpoint("qwen2", tmp_path / "qwen2")
    name = claimed_volume(admin, restricted, tmp_path)
    yield name, target
    client.CoreV1Api(admin).delete_persistent_volume(f"weights-{restricted}")


def test_weights_from_a_claim_serve_what_transformers_generates(
    admin, operator, restricted, weights
) -> None:
    """Target and draft read from one claim in a restricted namespace; greedy speculative
    output, asked for by the model's name, is transformers' greedy generate token for token."""
    claim, target = weights
    source = {"persistentVolumeClaim": {"claimName": claim}}
    create(
        admin,
        restricted,
        specdeployment(
            "hf",
            replicas=1,
            model={"name": "llama", "volume": source},
            speculation={
                "method": "draft",
                "draft": "qwen2",
                "draftVolume": source,
                "numSpeculativeTokens": 3,
                "threshold": {"mode": "Manual", "value": 64},
            },
        ),
    )
    (pod,) = wait_until(
        "the engine serving from the claim",
        lambda: all_ready(admin, restricted, "hf", 1),
        timeout=180,
    )
    tokenizer = byte_tokenizer()
    ids = torch.tensor([tokenizer.encode(PROMPT).ids])
    target.generation_config.eos_token_id = None  # exactly NEW_TOKENS, as ignore_eos below
    with torch.no_grad():
        expected = target.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False)[
            0, ids.shape[1] :
        ]
    openai = OpenAI(
        base_url=f"http://{pod.status.pod_ip}:{PORT}/v1", api_key="unused", max_retries=0
    )
    assert [m.id for m in openai.models.list().data] == ["llama"]
    completion = openai.completions.create(
        model="llama",
        prompt=PROMPT,
        max_tokens=NEW_TOKENS,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    assert completion.usage.completion_tokens == NEW_TOKENS
    assert completion.choices[0].text == tokenizer.decode(expected.tolist())


def test_an_engine_without_usable_cuda_says_why_in_its_pod(admin, operator, restricted) -> None:
    """gpus: 1 asks the engine for CUDA; the local runner's engines run on the CPU unless the
    pod's env says otherwise, as this one does, so its engine finds no usable GPU."""
    env = [
        {"name": "SPECTUNE_DEVICE", "value": "cuda"},
        {"name": "CUDA_VISIBLE_DEVICES", "value": ""},
    ]
    template = {"spec": {"containers": [{"name": "engine", "env": env}]}}
    create(
        admin,
        restricted,
        specdeployment(
            "nocuda",
            replicas=1,
            engine={**specdeployment("-")["spec"]["engine"], "template": template},
        ),
    )
    core = client.CoreV1Api(admin)

    def said() -> str | None:
        pods = core.list_namespaced_pod(
            restricted, label_selector=render.selector_string("nocuda")
        ).items
        for pod in pods:
            for c in pod.status.conditions or []:
                if c.type == "Ready" and "asked for, but torch" in (c.message or ""):
                    return c.message
        return None

    message = wait_until("the pod to say the engine found no usable CUDA", said, timeout=120)
    assert "engine exited with code 2: spectune-engine: error: device cuda asked for" in message


@pytest.mark.parametrize(
    "example",
    [
        "specdeployment.yaml",
        "autotune-demo.yaml",
        "llama-3.1-8b-claim.yaml",
        "download-weights-job.yaml",
    ],
)
def test_the_examples_are_accepted_by_the_api_server(
    cluster, admin, namespace, example: str
) -> None:
    """Every object of each example passes the API server's validation and the CRD's rules
    (a server-side dry run: nothing is made)."""
    out = kubectl(
        cluster,
        "create",
        "--dry-run=server",
        "-n",
        namespace,
        "-f",
        str(REPO / "examples" / example),
    )
    assert "created (server dry run)" in out
