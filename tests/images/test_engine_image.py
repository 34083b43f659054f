"""The engine image, built as users build it and run as a pod runs it (podman: the image's
user, a read-only root, tmpfs /tmp and /dev/shm, the models read-only): it serves the tiny pair
on the CPU and the `openai` client gets the text the engine outside the image gives; with
compiled attention and small ops too, which needs the C/C++ compiler the image carries."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from openai import OpenAI

from spectune.operator.render import ENGINE_IMAGE
from tests.cluster.support import REPO
from tests.server.support import Served, start_server, stop_server
from tests.support.containers import podman, user_and_root

pytestmark = pytest.mark.images

CONFIG = {
    "model": "tiny-target",
    "draft": "tiny-draft",
    "max_model_len": 256,
    "speculation": {"k": 4, "threshold": None},
}
PROMPTS = ["def add(a, b):", "class A:\n", "import os\n"]


def texts(served: Served) -> list[str]:
    """Each prompt's completion, sampled under a seed (the greedy tiny model soon repeats one
    token), streamed, as the official client reads it."""
    client = OpenAI(base_url=served.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    out = []
    for prompt in PROMPTS:
        stream = client.completions.create(
            model="tiny-target", prompt=prompt, max_tokens=24, temperature=1, seed=7, stream=True
        )
        out.append("".join(chunk.choices[0].text for chunk in stream if chunk.choices))
    return out


def served_inside_and_outside(
    images: dict[str, str], tmp_path: Path, *flags: str
) -> tuple[list[str], list[str], Served]:
    """The prompts' texts from the engine in the image and outside it (same settings, `flags`);
    the image's server is left running for the caller to inspect, and stopped at the end."""
    outside = start_server(_dir(tmp_path, "outside"), CONFIG, *flags)
    try:
        expected = texts(outside)
    finally:
        stop_server(outside)
    inside = start_server(_dir(tmp_path, "inside"), CONFIG, *flags, image=images["engine"])
    return texts(inside), expected, inside


def _dir(tmp_path: Path, name: str) -> Path:
    path = tmp_path / name
    path.mkdir()
    return path


def test_the_engine_image_serves_the_text_the_engine_outside_it_serves(
    images: dict[str, str], tiny_pair, tmp_path: Path
) -> None:
    got, expected, inside = served_inside_and_outside(images, tmp_path)
    try:
        assert inside.container is not None
        uid, write = user_and_root(inside.container)
        assert uid == "10001"
        assert "Read-only file system" in write, write
        assert all(expected) and got == expected
    finally:
        stop_server(inside)


def test_the_engine_image_serves_with_compiled_attention_and_small_ops(
    images: dict[str, str], tiny_pair, tmp_path: Path
) -> None:
    """Inductor builds C++ kernels for Flex and the small ops on the CPU, as Triton builds its
    launchers on CUDA: an image without a compiler and Python's headers fails to start here."""
    got, expected, inside = served_inside_and_outside(
        images, tmp_path, "--attention", "flex", "--compile"
    )
    try:
        assert inside.container is not None
        built = podman("exec", inside.container, "find", "/tmp", "-name", "*.so")
        assert built.stdout.strip(), f"no compiled kernel under /tmp: {built.stderr}"
        assert all(expected) and got == expected
    finally:
        stop_server(inside)


def test_the_weights_job_runs_what_the_engine_image_has(images: dict[str, str]) -> None:
    """examples/download-weights-job.yaml downloads with `hf download` in the chart's engine
    image, installing nothing at run time: every option it passes is one the image's pinned
    huggingface_hub knows (huggingface_hub 1.0 removed `huggingface-cli`)."""
    example = REPO / "examples" / "download-weights-job.yaml"
    job = next(d for d in yaml.safe_load_all(example.read_text()) if d["kind"] == "Job")
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["image"] == ENGINE_IMAGE == images["engine"]
    script = container["args"][0].replace("\\\n", " ")
    downloads = [line for line in script.splitlines() if line.strip().startswith("hf download")]
    assert len(downloads) == 2 and "pip" not in script
    shown = podman("run", "--rm", "--entrypoint", "hf", images["engine"], "download", "--help")
    assert shown.returncode == 0, shown.stderr
    for line in downloads:
        for option in re.findall(r"(--[a-z-]+)", line):
            assert option in shown.stdout, f"hf download has no {option}"
