"""The engine image, built as users build it and run as a pod runs it (podman: the image's
user, a read-only root, tmpfs /tmp and /dev/shm, the models read-only): it serves the tiny pair
on the CPU and the `openai` client gets the text the engine outside the image gives; with
compiled attention and small ops too, which needs the C/C++ compiler the image carries."""

from __future__ import annotations

from pathlib import Path

import pytest
from openai import OpenAI

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
