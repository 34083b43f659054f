"""The engine's one validated settings object."""

from __future__ import annotations

from dataclasses import dataclass, field

from spectune.engine.gate import GateSettings
from spectune.engine.sequence import MIN_ACCEPTANCE, PAUSE_ITERATIONS

METHODS = ("draft", "ngram", "none")
ATTENTION = ("auto", "flex", "gather")


class InvalidConfig(ValueError):
    """Engine settings that cannot work together."""


@dataclass(frozen=True)
class EngineConfig:
    model: str
    draft: str | None = None
    method: str = "auto"  # auto: "draft" when a draft is given, else "none"
    k: int = 4  # drafted tokens per sequence per iteration
    gate: GateSettings = field(default_factory=GateSettings)
    max_batch_size: int = 64
    max_model_len: int | None = None  # default: the target's max_position_embeddings
    block_size: int = 16
    kv_cache_bytes: int | None = None  # default: 512 MiB on the CPU, 85% of free memory on CUDA
    max_prefill_tokens: int = 8192
    device: str | None = None  # default: cuda when available
    dtype: str | None = None  # default: float32 on the CPU, bfloat16 on CUDA
    cuda_graphs: bool = True
    # How graphed decode shapes read the paged KV cache: "flex" in place (FlexAttention),
    # "gather" into a new tensor for SDPA; auto: flex on CUDA (0.2-0.7x the gather's time on
    # an H200), gather on the CPU (eager FlexAttention there is a slow reference).
    attention: str = "auto"
    compile: bool = False  # torch.compile the small ops between the matmuls (C++ on the CPU)
    ngram_min: int = 1
    ngram_max: int = 3
    min_acceptance: float = MIN_ACCEPTANCE  # a sequence below this recent acceptance pauses
    pause_iterations: int = PAUSE_ITERATIONS  # ...speculation for this many of its iterations
    seed: int = 0
    simulate_device: str | None = None  # a GPU SKU (device_time.SKUS): real tokens, its clock
    simulate_time_scale: float = 1.0  # modelled seconds x this = the simulated iteration's time
    simulate_extra_context: int = 0  # cached tokens per sequence the simulated SKU adds
    simulate_context_scale: float = 1.0  # modelled cached tokens per real one

    def __post_init__(self) -> None:
        method = self.method if self.method != "auto" else ("draft" if self.draft else "none")
        object.__setattr__(self, "method", method)
        if method not in METHODS:
            raise InvalidConfig(f"method must be one of {', '.join(METHODS)}, got {method!r}")
        if method == "draft" and not self.draft:
            raise InvalidConfig("method 'draft' needs a draft model")
        if method != "draft" and self.draft:
            raise InvalidConfig(f"a draft model was given but method is {method!r}")
        if self.k < 1:
            raise InvalidConfig(f"k must be at least 1, got {self.k}")
        for name in ("max_batch_size", "block_size", "max_prefill_tokens", "ngram_min"):
            if getattr(self, name) < 1:
                raise InvalidConfig(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.ngram_max < self.ngram_min:
            raise InvalidConfig("ngram_max must be >= ngram_min")
        if not self.simulate_time_scale > 0:
            raise InvalidConfig(f"simulate_time_scale must be > 0, got {self.simulate_time_scale}")
        if self.simulate_extra_context < 0:
            raise InvalidConfig("simulate_extra_context must be >= 0")
        if not self.simulate_context_scale > 0:
            raise InvalidConfig(
                f"simulate_context_scale must be > 0, got {self.simulate_context_scale}"
            )
        if self.attention not in ATTENTION:
            raise InvalidConfig(
                f"attention must be one of {', '.join(ATTENTION)}, got {self.attention!r}"
            )
        if self.dtype not in (None, "float32", "float16", "bfloat16"):
            raise InvalidConfig(f"dtype must be float32, float16 or bfloat16, got {self.dtype!r}")

    @property
    def speculative(self) -> bool:
        return self.method != "none"
