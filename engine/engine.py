"""The engine loop: schedule, run one iteration (prefill, plain decode or speculative
decode), commit tokens, record what the iteration did.

The gate picks the mode per decode iteration. A plain iteration is the same code an
engine without a draft runs: one position per sequence, no draft forward.
"""

from __future__ import annotations

import random
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

from spectune.engine.block_manager import BlockManager, plan_blocks
from spectune.engine.checkpoint import Checkpoint, checkpoint_dir, load_checkpoint
from spectune.engine.config import EngineConfig, InvalidConfig
from spectune.engine.contract import gpu_product
from spectune.engine.draft_lag import CatchUp
from spectune.engine.drafting import ModelDrafter, NgramDrafter
from spectune.engine.gate import Decision, GateSettings, SpeculationGate
from spectune.engine.model_runner import Feed, ModelRunner, draft_shapes, target_shapes
from spectune.engine.sampling import accept_greedy, accept_sampled, choose_tokens, probabilities
from spectune.engine.scheduler import Scheduler
from spectune.engine.sequence import InvalidRequest, SamplingParams, Sequence
from spectune.engine.simulated_device import SimulatedDevice

CPU_KV_BYTES = 512 << 20
# Prompts of a few lengths for the warm-up: prefills of different widths, decodes of one.
WARM_UP_PROMPTS = ("warm up", "def main():\n    return 0", "import os", "x" * 40)


@dataclass(frozen=True)
class Iteration:
    """What one engine iteration did; the raw material of step metrics and the bench."""

    mode: str  # prefill | plain | spec
    batch_size: int
    tokens: int  # tokens committed
    # Wall time less catchup_seconds: what the mode costs, the draft's prefill included.
    seconds: float
    draft_seconds: float = 0.0  # proposing: the catch-up forward is not in it
    explored: bool = False  # ran the mode the gate did not pick, on purpose
    drafts: int = 0  # sequences that got a draft
    drafted: int = 0
    accepted: int = 0
    # The catch-up forward (drafting.CatchUp) split by tokens: the draft's prefill of what the
    # target prefilled (and of what a paused sequence skipped), a cost every speculating
    # request pays and so inside `seconds`; and the draft reading what plain iterations
    # committed, a cost of switching modes, kept out of `seconds`.
    draft_prefill_seconds: float = 0.0
    catchup_seconds: float = 0.0


@dataclass(frozen=True)
class Update:
    seq: Sequence
    new_tokens: list[int]


@dataclass(frozen=True)
class Completion:
    text: str
    token_ids: list[int]
    prompt_tokens: int
    finish_reason: str


def _resolve_device(config: EngineConfig) -> tuple[torch.device, torch.dtype]:
    device = torch.device(config.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    name = config.dtype or ("bfloat16" if device.type == "cuda" else "float32")
    return device, getattr(torch, name)


class LLMEngine:
    def __init__(
        self,
        config: EngineConfig,
        clock: Callable[[], float] = time.perf_counter,
        resolve_model: Callable[[str], Path] = checkpoint_dir,
    ) -> None:
        """`resolve_model` turns a model name into its checkpoint directory; entry points pass
        the zoo's, which also knows the built-in names (the core imports no zoo)."""
        self.config = config
        self.simulation: SimulatedDevice | None = None
        if config.simulate_device:
            try:
                self.simulation = SimulatedDevice.named(
                    config.simulate_device,
                    config.simulate_time_scale,
                    config.simulate_extra_context,
                    config.simulate_context_scale,
                )
            except ValueError as err:
                raise InvalidConfig(str(err)) from None
            clock = self.simulation.clock
        self.clock = clock
        self.resolve_model = resolve_model
        self.device, self.dtype = _resolve_device(config)
        self.target = self._load(config.model)
        self.draft = self._load(config.draft) if config.draft else None
        tcfg = self.target.model.config
        if self.draft and self.draft.model.config.vocab_size != tcfg.vocab_size:
            raise InvalidConfig(
                f"draft vocabulary ({self.draft.model.config.vocab_size}) differs from the "
                f"target's ({tcfg.vocab_size})"
            )
        self.max_model_len = min(
            config.max_model_len or tcfg.max_position_embeddings, tcfg.max_position_embeddings
        )
        self.num_blocks, self.admitted_concurrency = plan_blocks(
            self._kv_budget(), config.block_size, self._kv_bytes_per_token(), self.max_model_len
        )
        blocks = BlockManager(self.num_blocks, config.block_size)
        self.scheduler = Scheduler(blocks, config.max_batch_size, config.max_prefill_tokens)
        self.runner = self._runner(self.target)
        self.drafter: ModelDrafter | NgramDrafter | None = None
        if self.draft:
            self.drafter = ModelDrafter(self._runner(self.draft))
        elif config.method == "ngram":
            self.drafter = NgramDrafter(config.ngram_min, config.ngram_max)
        if self.simulation:
            sim = self.simulation
            self.runner.on_forward = lambda feeds: sim.charge(sim.target, feeds)
            if isinstance(self.drafter, ModelDrafter):
                self.drafter.runner.on_forward = lambda feeds: sim.charge(sim.draft, feeds)
        self.k = config.k
        self._rng = random.Random(config.seed)
        self.gate = SpeculationGate(config.gate, self._rng)
        self.iterations: deque[Iteration] = deque(maxlen=100_000)
        self._next_id = 0

    # --- construction -------------------------------------------------------------

    def _load(self, name: str) -> Checkpoint:
        return load_checkpoint(self.resolve_model(name), name, self.device, self.dtype)

    def _kv_bytes_per_token(self) -> list[int]:
        size = torch.finfo(self.dtype).bits // 8
        models = [self.target] + ([self.draft] if self.draft else [])
        return [m.model.config.kv_bytes_per_token * size for m in models]

    def _kv_budget(self) -> int:
        if self.config.kv_cache_bytes is not None:
            return self.config.kv_cache_bytes
        if self.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.device)
            return int(free * 0.85)
        return CPU_KV_BYTES

    def _runner(self, ckpt: Checkpoint) -> ModelRunner:
        in_place = self.config.attention == "flex" or (
            self.config.attention == "auto" and self.device.type == "cuda"
        )
        return ModelRunner(
            ckpt.model,
            self.num_blocks,
            self.config.block_size,
            self.max_model_len,
            self.config.cuda_graphs,
            static_shapes=in_place,  # Flex reads the cache in place in the padded shapes only
            in_place_attention=in_place,
            compile_layers=self.config.compile,
        )

    # --- warm-up ------------------------------------------------------------------

    def warm_up(self, fixed_shapes: bool | None = None) -> int:
        """Build now what the first requests would otherwise wait for; returns the fixed shapes
        built. With `fixed_shapes` (default: when the runners capture CUDA graphs, where each
        shape is a capture and Flex kernels to compile), every fixed shape of every batch
        bucket up to max_batch_size at today's k (a k changed at run time builds its verifies
        when first used); on the CPU a fixed shape runs eagerly, and its first use costs no
        more than any other. Then short generations at batch 1 and 4, speculating and plain,
        for what runs eagerly: prefills, and the compiled small ops, which torch.compile
        specialises for sizes 1 and above."""
        built, batch = 0, self.config.max_batch_size
        if self.runner.static_shapes and (
            self.runner.use_graphs if fixed_shapes is None else fixed_shapes
        ):
            built = self.runner.build(target_shapes(batch, self.k if self.drafter else 0))
            if isinstance(self.drafter, ModelDrafter):
                built += self.drafter.runner.build(draft_shapes(batch, self.k))
        params = SamplingParams(max_tokens=8, ignore_eos=True)
        gate = self.gate
        try:
            for threshold in (None, 0) if self.drafter else (0,):
                self.gate = SpeculationGate(GateSettings(threshold=threshold), self._rng)
                self.generate(WARM_UP_PROMPTS[:1], params)
                self.generate(WARM_UP_PROMPTS, params)
        finally:
            self.gate = gate
        if self.simulation:
            self.simulation.forget_overruns()  # the first forwards run cold by design
        return built

    @property
    def fixed_shapes(self) -> int:
        """Fixed shapes built so far, target and draft: after warm_up, a rise means a request
        waited for one (a k changed at run time, or a shape the warm-up missed)."""
        runners = [self.runner]
        if isinstance(self.drafter, ModelDrafter):
            runners.append(self.drafter.runner)
        return sum(len(r.shapes) for r in runners)

    # --- requests -----------------------------------------------------------------

    @property
    def tokenizer(self):
        return self.target.tokenizer

    def add_request(self, prompt: str | list[int], params: SamplingParams) -> Sequence:
        """Validate and queue a request. Raises InvalidRequest and changes nothing on bad input."""
        ids = self.tokenizer.encode(prompt).ids if isinstance(prompt, str) else list(prompt)
        if not ids:
            raise InvalidRequest("prompt is empty")
        vocab = self.target.model.config.vocab_size
        if min(ids) < 0 or max(ids) >= vocab:
            raise InvalidRequest(f"prompt token ids must lie in [0, {vocab})")
        if len(ids) >= self.max_model_len:
            raise InvalidRequest(
                f"prompt has {len(ids)} tokens; the context holds {self.max_model_len} "
                "including at least one generated token"
            )
        capacity = (self.num_blocks - 1) * self.config.block_size
        need = min(len(ids) + params.max_tokens, self.max_model_len) + self.k
        if need > capacity:
            raise InvalidRequest(f"request needs {need} KV slots; the whole cache holds {capacity}")
        generator = None
        if params.temperature > 0:
            seed = params.seed if params.seed is not None else self._rng.getrandbits(63)
            generator = torch.Generator(device=self.device).manual_seed(seed)
        seq = Sequence(self._next_id, ids, len(ids), params, generator)
        self._next_id += 1
        self.scheduler.add(seq)
        return seq

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    def abort(self, seq: Sequence) -> None:
        """Drop a request (client gone, stop string hit); its blocks return at once."""
        self.scheduler.abort(seq)

    @property
    def device_label(self) -> str:
        """What metrics call the device: the GPU's product (`contract.gpu_product`), "cpu", or
        the simulated SKU's label."""
        if self.simulation:
            return self.simulation.label
        if self.device.type == "cuda":
            return gpu_product(torch.cuda.get_device_name(self.device))
        return self.device.type

    @property
    def kv_usage(self) -> float:
        blocks = self.scheduler.blocks
        return 1 - blocks.num_free / blocks.usable_blocks

    # --- one iteration ------------------------------------------------------------

    def step(self) -> list[Update]:
        if self.simulation is None:
            return self._step()
        with self.simulation.iteration():
            return self._step()

    def _step(self) -> list[Update]:
        start = self.clock()
        seqs = self.scheduler.schedule_prefill()
        if seqs:
            updates, record = self._prefill(seqs)
        elif self.scheduler.running:
            decision = (
                self.gate.decide(len(self.scheduler.running))
                if self.drafter
                else Decision(False, False)
            )
            seqs = self.scheduler.schedule_decode(lookahead=self.k if decision.speculate else 0)
            if not seqs:
                return []
            if decision.speculate:
                updates, record = self._speculate(seqs)
            else:
                updates, record = self._decode(seqs)
            record["explored"] = decision.explored
        else:
            return []
        seconds = self.clock() - start - record.get("catchup_seconds", 0.0)
        self.iterations.append(Iteration(seconds=seconds, **record))
        return updates

    def _prefill(self, seqs: list[Sequence]) -> tuple[list[Update], dict]:
        """Fill the KV of newly admitted sequences; fresh ones also sample their first token
        (a resumed one already has its next token and only recomputes its cache)."""
        rows = [i for i, s in enumerate(seqs) if not s.is_resumed]
        fresh = [seqs[i] for i in rows]
        feeds = [Feed(s.token_ids[: self.scheduler.prefill_len(s)], 0, s.block_table) for s in seqs]
        logits = self.runner.forward(feeds, all_logits=False)[:, 0]
        tokens, _ = choose_tokens(
            logits[rows], [s.params.temperature for s in fresh], [s.generator for s in fresh]
        )
        updates = [self._commit(s, [t]) for s, t in zip(fresh, tokens, strict=True)]
        for s in seqs:
            s.plain_unread = 0  # the draft reads whatever a prefill covers as its own prefill
        return updates, {"mode": "prefill", "batch_size": len(seqs), "tokens": len(fresh)}

    def _decode(self, seqs: list[Sequence]) -> tuple[list[Update], dict]:
        feeds = [Feed([s.token_ids[-1]], len(s) - 1, s.block_table) for s in seqs]
        logits = self.runner.forward(feeds, all_logits=False)[:, 0]
        tokens, _ = choose_tokens(
            logits, [s.params.temperature for s in seqs], [s.generator for s in seqs]
        )
        updates = [self._commit(s, [t]) for s, t in zip(seqs, tokens, strict=True)]
        for u in updates:
            u.seq.plain_unread += len(u.new_tokens)
        return updates, {"mode": "plain", "batch_size": len(seqs), "tokens": len(seqs)}

    def _draft_len(self, seq: Sequence) -> int:
        if seq.take_pause():
            return 0
        return max(0, min(self.k, seq.remaining - 1, self.max_model_len - len(seq) - 1))

    def _speculate(self, seqs: list[Sequence]) -> tuple[list[Update], dict]:
        """Draft, verify k+1 positions per sequence in one target forward, accept."""
        assert self.drafter is not None
        ks = [self._draft_len(s) for s in seqs]
        t0 = self.clock()
        catch = CatchUp()
        if isinstance(self.drafter, ModelDrafter):
            catch = self.drafter.catch_up([s for s, k in zip(seqs, ks, strict=True) if k])
            if catch.fed:
                self._sync()
        t1 = self.clock()
        drafts = self.drafter.propose(seqs, ks)
        draft_seconds = self.clock() - t1
        forwards = max(ks, default=0)  # the proposal's sequential draft forwards
        floor = draft_seconds / forwards if forwards else 0.0
        prefill_seconds, catchup_seconds = catch.split(t1 - t0, floor)
        feeds = [
            Feed([s.token_ids[-1], *d.tokens], len(s) - 1, s.block_table)
            for s, d in zip(seqs, drafts, strict=True)
        ]
        logits = self.runner.forward(feeds, all_logits=True)  # [B, 1 + max k, V]
        choice = logits.argmax(-1).tolist()
        updates, drafted, accepted = [], 0, 0
        drafting = sum(1 for d in drafts if d.tokens)
        for i, (s, d) in enumerate(zip(seqs, drafts, strict=True)):
            n = len(d.tokens)
            if s.params.temperature == 0:
                new, acc = accept_greedy(choice[i][: n + 1], d.tokens)
            else:
                p = probabilities(logits[i, : n + 1], s.params.temperature)
                new, acc = accept_sampled(p, d.probs, d.tokens, s.generator)
            s.draft_cached = min(
                s.draft_cached, len(s) + acc
            )  # draft KV past the accepted prefix is stale
            if n:
                s.record_acceptance(
                    acc / n, self.config.min_acceptance, self.config.pause_iterations
                )
            drafted, accepted = drafted + n, accepted + acc
            updates.append(self._commit(s, new))
        record = {
            "mode": "spec",
            "batch_size": len(seqs),
            "tokens": sum(len(u.new_tokens) for u in updates),
            "draft_seconds": draft_seconds,
            "draft_prefill_seconds": prefill_seconds,
            "catchup_seconds": catchup_seconds,
            "drafts": drafting,
            "drafted": drafted,
            "accepted": accepted,
        }
        return updates, record

    def _sync(self) -> None:
        """Wait for the device, so that a forward whose output nobody reads (the catch-up)
        is timed whole, not as its kernel launches with the rest landing in drafting."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _commit(self, seq: Sequence, tokens: list[int]) -> Update:
        """Append tokens up to the first stop, the max_tokens limit or the context end."""
        room = min(seq.remaining, self.max_model_len - len(seq))
        eos = frozenset() if seq.params.ignore_eos else self.target.eos_token_ids
        taken: list[int] = []
        reason = None
        for t in tokens[:room]:
            taken.append(t)
            if t in eos:
                reason = "stop"
                break
        seq.token_ids.extend(taken)
        if reason is None and (seq.remaining == 0 or len(seq) >= self.max_model_len):
            reason = "length"
        if reason:
            self.scheduler.finish(seq, reason)
        return Update(seq, taken)

    # --- convenience --------------------------------------------------------------

    def generate(
        self, prompts: Iterable[str | list[int]], params: SamplingParams
    ) -> list[Completion]:
        """Run prompts to completion together (continuous batching) and return them in order."""
        seqs = [self.add_request(p, params) for p in prompts]
        while self.has_work():
            self.step()
        return [
            Completion(
                self.tokenizer.decode(s.output_ids),
                s.output_ids,
                s.prompt_len,
                s.finish_reason or "",
            )
            for s in seqs
        ]
