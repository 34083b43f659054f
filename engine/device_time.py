"""How long an iteration would take on a GPU SKU: a roofline per forward, and from it the
analytic crossover where speculation stops paying.

No GPU is at hand for tests, CI or the demo, and every fake node is the same CPU. This model
is the device clock of the simulated SKUs (DESIGN.md, "Simulated GPU SKUs") and the ground
truth that measured crossovers are compared with. One forward over a batch costs
max(bytes / achievable bandwidth, FLOPs / achievable FLOP/s) plus a fixed per-forward cost;
bytes are the weights plus the KV cache the batch's contexts read, FLOPs are 2 x parameters
x positions plus attention. Torch-free: the operator imports it too.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Sku:
    """A GPU as its spec sheet has it, with the shares of it a serving engine achieves."""

    product: str  # the nvidia.com/gpu.product label the GPU operator puts on its nodes
    bandwidth: float  # HBM bytes/s
    flops: float  # dense bf16 FLOP/s
    bandwidth_share: float = 0.8
    flops_share: float = 0.6
    forward_overhead: float = 30e-6  # seconds per forward: launches, synchronisation

    @property
    def ridge(self) -> float:
        """FLOPs per byte above which a forward is compute-bound: the higher, the later
        speculation runs out of spare compute as the batch grows."""
        return (self.flops * self.flops_share) / (self.bandwidth * self.bandwidth_share)


SKUS = {
    "H100": Sku("NVIDIA-H100-80GB-HBM3", bandwidth=3.35e12, flops=989e12),
    "A100": Sku("NVIDIA-A100-SXM4-40GB", bandwidth=1.555e12, flops=312e12),
    "L4": Sku("NVIDIA-L4", bandwidth=0.3e12, flops=121e12),
    "H200": Sku("NVIDIA-H200", bandwidth=4.8e12, flops=989e12),
}


def sku_named(name: str) -> Sku:
    """A SKU by its short name (H100) or its nvidia.com/gpu.product label, any case."""
    for key, sku in SKUS.items():
        if name.lower() in (key.lower(), sku.product.lower()):
            return sku
    known = ", ".join(f"{k} ({s.product})" for k, s in SKUS.items())
    raise ValueError(f"unknown GPU SKU {name!r}; simulated SKUs: {known}")


@dataclass(frozen=True)
class VirtualModel:
    """The size of the model the simulated device serves (not the one computing tokens)."""

    params: float
    layers: int
    hidden: int
    kv_bytes_per_token: int  # K and V of one token over all layers
    dtype_bytes: int = 2

    def forward(
        self, sku: Sku, positions: int, kv_tokens: int, attended: int, gpus: int = 1
    ) -> float:
        """Seconds for one forward over `positions` new tokens that reads `kv_tokens` cached
        tokens, where `attended` sums each position's context; `gpus` share the load
        (tensor parallel), not the fixed cost."""
        nbytes = self.params * self.dtype_bytes + kv_tokens * self.kv_bytes_per_token
        flops = 2 * self.params * positions + 4 * self.layers * self.hidden * attended
        memory = nbytes / (sku.bandwidth * sku.bandwidth_share)
        compute = flops / (sku.flops * sku.flops_share)
        return max(memory, compute) / gpus + sku.forward_overhead


LLAMA_8B = VirtualModel(8.0e9, layers=32, hidden=4096, kv_bytes_per_token=2 * 32 * 8 * 128 * 2)
LLAMA_1B = VirtualModel(1.24e9, layers=16, hidden=2048, kv_bytes_per_token=2 * 16 * 8 * 64 * 2)


def plain_step(sku: Sku, target: VirtualModel, contexts: list[int], gpus: int = 1) -> float:
    """One position per sequence."""
    read = sum(contexts)
    return target.forward(sku, len(contexts), read, read, gpus)


def spec_step(
    sku: Sku,
    target: VirtualModel,
    draft: VirtualModel | None,
    k: int,
    contexts: list[int],
    gpus: int = 1,
    verified: float | None = None,
) -> float:
    """k sequential draft forwards (none for n-gram lookup: `draft` None), then one verify
    forward over 1 + `verified` positions per sequence (default k: every sequence got k
    drafted tokens; n-gram lookup often finds fewer), which reads each context once."""
    n, read = len(contexts), sum(contexts)
    v = k if verified is None else verified
    drafting = sum(
        draft.forward(sku, n, read + i * n, read + i * n, gpus)
        for i in range(k)
        if draft is not None
    )
    attended = (v + 1) * read + n * v * (v + 1) / 2
    return drafting + target.forward(sku, n * (v + 1), read, attended, gpus)


def expected_tokens(acceptance: float, k: int) -> float:
    """Tokens a spec step commits per sequence when each drafted token is accepted with
    probability `acceptance`, independently: the accepted prefix plus one from the target."""
    if not 0 <= acceptance <= 1:
        raise ValueError(f"acceptance must be in [0, 1], got {acceptance}")
    return float(k + 1) if acceptance == 1 else (1 - acceptance ** (k + 1)) / (1 - acceptance)


@dataclass(frozen=True)
class Setting:
    """Everything the crossover depends on."""

    sku: Sku
    target: VirtualModel
    draft: VirtualModel | None  # None: n-gram lookup
    k: int
    acceptance: float
    context: int  # tokens each sequence has in its KV cache
    gpus: int = 1
    # Where measured: a spec step's tokens per sequence (else from acceptance, iid) and its
    # drafted tokens per sequence (else k).
    tokens: float | None = None
    verified: float | None = None
    # (prompt, output) tokens per request: the draft reads each prompt once before it first
    # drafts for it (its prefill), a cost spread over the request's spec steps. None: left out.
    requests: tuple[int, int] | None = None

    def speedup(self, batch: int) -> float:
        """Spec tokens/s over plain tokens/s at this batch size."""
        contexts = [self.context] * batch
        tokens = expected_tokens(self.acceptance, self.k) if self.tokens is None else self.tokens
        step = spec_step(
            self.sku, self.target, self.draft, self.k, contexts, self.gpus, self.verified
        )
        if self.requests is not None and self.draft is not None:
            prompt, output = self.requests
            prefill = self.draft.forward(
                self.sku, prompt * batch, 0, batch * prompt * (prompt - 1) // 2, self.gpus
            )
            step += prefill * tokens / output  # a batch's prefills, once per `output` tokens
        return tokens / step * plain_step(self.sku, self.target, contexts, self.gpus)


def analytic_crossover(setting: Setting, max_batch: int = 4096) -> float | None:
    """The batch size where the speedup falls through 1.0, interpolated between the integers
    around it (1.0 when speculation never pays); None when it pays up to `max_batch`."""
    before = setting.speedup(1)
    if before < 1:
        return 1.0
    for batch in range(2, max_batch + 1):
        now = setting.speedup(batch)
        if now < 1:
            return batch - 1 + (before - 1) / (before - now)
        before = now
    return None
