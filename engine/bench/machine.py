"""The machine a number was measured on, and its memory roofline.

A decode step at batch 1 has to read every weight once, so weight bytes over the
machine's copy bandwidth is the fastest it could possibly be; the measured step over
that bound says how far from the memory roofline the engine runs.
"""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path

import torch

from spectune.engine.bench.schema import Machine


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def describe(device: str) -> Machine:
    return Machine(
        cpu=cpu_name(),
        cores=os.cpu_count() or 1,
        torch_threads=torch.get_num_threads(),
        torch=torch.__version__,
        python=platform.python_version(),
        device=torch.cuda.get_device_name(device) if device.startswith("cuda") else device,
        load_average=[round(x, 2) for x in os.getloadavg()],
    )


def copy_bandwidth(device: torch.device, size_bytes: int = 256 << 20, repeats: int = 5) -> float:
    """Bytes moved per second (read + write) by the best of `repeats` large copies; the
    buffer is far larger than any cache, so this is memory bandwidth."""
    src = torch.ones(size_bytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(repeats + 1):  # the first copy faults pages in
        _sync(device)
        start = time.perf_counter()
        dst.copy_(src)
        _sync(device)
        best = min(best, time.perf_counter() - start)
    return 2 * size_bytes / best


def weight_bytes(model: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def default_device() -> str:
    """Where the engine runs when no device is given (its own rule)."""
    return "cuda" if torch.cuda.is_available() else "cpu"
