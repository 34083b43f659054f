"""Built-in model names (tiny-*, bench-*) and where their checkpoints live.

Nothing can be downloaded, so the project trains its own pairs (see `training`). The
names resolve wherever a model path is accepted, and are built on first use.
"""

from __future__ import annotations

import os
from pathlib import Path

from spectune.engine.checkpoint import ModelNotFound, checkpoint_dir

SIZES = {"tiny": ("tiny-target", "tiny-draft"), "bench": ("bench-target", "bench-draft")}
BUILTIN = {name: size for size, names in SIZES.items() for name in names}


def cache_dir() -> Path:
    """$SPECTUNE_CACHE, else .cache/models in the working directory (ignored by git)."""
    return Path(os.environ.get("SPECTUNE_CACHE", ".cache/models")).resolve()


def resolve_model(name: str) -> Path:
    """A checkpoint directory for `name`: a built-in name (built if missing, or rebuilt when
    its recipe changed since it was cached) or a path."""
    if name in BUILTIN:
        from spectune.engine.zoo.training import build_pair, is_current

        path = cache_dir() / name
        if not is_current(path, BUILTIN[name]):
            build_pair(BUILTIN[name], cache_dir())
        return path
    try:
        return checkpoint_dir(name)
    except ModelNotFound as e:
        raise ModelNotFound(f"{e}, and not a built-in name ({', '.join(BUILTIN)})") from None
