"""Fail fast when a server is asked for CUDA that torch cannot use.

torch falls back to nothing by itself, but an engine left to pick its device would run on the
CPU while its pod holds a GPU: slow, and silent. One line says why instead: which CUDA the
installed torch was built for and the driver that needs.
"""

from __future__ import annotations

# The oldest Linux driver each CUDA major release runs on (NVIDIA's compatibility table).
MIN_DRIVER = {11: "450.80.02", 12: "525.60.13", 13: "580.65.06"}


def cuda_problem(
    device: str | None, torch_version: str, cuda_version: str | None, available: bool
) -> str | None:
    """Why `device` cannot be used, or None when it can (or is not CUDA)."""
    if not device or not device.startswith("cuda") or available:
        return None
    if cuda_version is None:
        return (
            f"device {device} asked for, but torch {torch_version} was built without CUDA "
            "(install a CUDA build of torch, as the engine image has)"
        )
    major = int(cuda_version.split(".")[0])
    driver = MIN_DRIVER.get(major, "a newer one")
    return (
        f"device {device} asked for, but torch {torch_version} (built for CUDA {cuda_version}) "
        f"sees no usable GPU: it needs an NVIDIA driver >= {driver} and a GPU given to the "
        "container (nvidia.com/gpu)"
    )


def check_cuda(device: str | None) -> str | None:
    """cuda_problem() for the torch installed here."""
    import torch

    return cuda_problem(device, torch.__version__, torch.version.cuda, torch.cuda.is_available())
