"""The metric contract between engine, Prometheus and operator. Torch-free: the operator
imports it too, so a name or a bucket is defined exactly once.

Speculation counters mean what vLLM's `spec_decode_num_drafts`, `..._num_draft_tokens`
and `..._num_accepted_tokens` mean. Per (mode, batch bucket),
rate(STEP_OUTPUT_TOKENS) / rate(STEP_SECONDS_sum) is that mode's throughput at that
batch size; the crossover is where spec/plain crosses 1.0.
"""

from __future__ import annotations

import bisect

PREFIX = "spectune_"

REQUESTS = "spectune_requests_total"  # counter, label outcome
REQUESTS_SLO_MET = "spectune_requests_slo_met_total"  # counter: goodput = rate()
# Prompt tokens of the requests answered in full (outcome ok): over REQUESTS{outcome="ok"},
# the mean prompt length, which moves the crossover (longer contexts: more KV to read).
PROMPT_TOKENS = "spectune_prompt_tokens_total"  # counter
TIME_TO_FIRST_TOKEN = "spectune_time_to_first_token_seconds"  # histogram
INTER_TOKEN_LATENCY = "spectune_inter_token_latency_seconds"  # histogram
E2E_REQUEST_LATENCY = "spectune_e2e_request_latency_seconds"  # histogram
NUM_REQUESTS_RUNNING = "spectune_num_requests_running"  # gauge
NUM_REQUESTS_WAITING = "spectune_num_requests_waiting"  # gauge
KV_CACHE_USAGE = "spectune_kv_cache_usage_ratio"  # gauge: target+draft blocks in use / total
ADMITTED_CONCURRENCY = "spectune_admitted_concurrency_limit"  # gauge
# Wall time of each decode iteration (prefills are not observed). A spec iteration's
# includes drafting, verifying and the draft's prefill of what the target prefilled (every
# speculating request pays it once); not the draft reading what plain iterations committed.
STEP_SECONDS = "spectune_step_seconds"  # histogram, labels mode, batch
STEP_OUTPUT_TOKENS = "spectune_step_output_tokens_total"  # counter, labels mode, batch
DRAFT_SECONDS = "spectune_draft_seconds_total"  # counter, label batch
# The draft's catch-up forward when a spec iteration finds it behind, split by tokens. Its
# prefill of what the target prefilled (and of what a paused sequence skipped) is in
# STEP_SECONDS and also counted here: a request run plain pays all of it at its first
# explored spec iteration, so explored spec steps carry more of it per step than steady ones,
# and this lets a reader amortize it per token instead.
DRAFT_PREFILL_SECONDS = "spectune_draft_prefill_seconds_total"  # counter, label batch
# The rest: the draft reading tokens plain iterations committed, a cost of switching modes,
# kept out of STEP_SECONDS.
DRAFT_CATCHUP_SECONDS = "spectune_draft_catchup_seconds_total"  # counter, label batch
# Decode iterations as they ran: explored="true" ran the mode the gate did not pick.
ITERATIONS = "spectune_iterations_total"  # counter, labels mode, explored
# Iterations that raised (their requests failed): a few in a row make the engine unready and
# fail its liveness probe (engine/serving/health.py).
ITERATION_FAILURES = "spectune_iteration_failures_total"  # counter
# Seconds from the server's start to Ready: loading the weights and the warm-up (compiles and
# graph captures included). A gauge, set once.
STARTUP_SECONDS = "spectune_engine_startup_seconds"
# Fixed shapes built (CUDA graphs on CUDA): the warm-up builds every batch bucket's before
# Ready, so a rise after Ready is a shape some request waited for.
FIXED_SHAPES = "spectune_engine_fixed_shapes"  # gauge
SPEC_DRAFTS = "spectune_spec_drafts_total"  # counter
SPEC_DRAFT_TOKENS = "spectune_spec_draft_tokens_total"  # counter
SPEC_ACCEPTED_TOKENS = "spectune_spec_accepted_tokens_total"  # counter
SPEC_THRESHOLD = "spectune_spec_threshold"  # gauge: +Inf when unset (always speculate)
SPEC_EXPLORATION_RATIO = "spectune_spec_exploration_ratio"  # gauge
# gauge = 1, labels device (the GPU product as `gpu_product` names it, "cpu", or a simulated
# SKU's nvidia.com/gpu.product value), simulated ("true" for a simulated SKU), model, draft,
# version
ENGINE_INFO = "spectune_engine_info"
# Iterations on a simulated SKU whose real time exceeded their modelled time: the simulation
# was not faithful there (raise the time scale).
SIMULATED_OVERRUNS = "spectune_simulated_overruns_total"  # counter

ALL_METRICS = (
    REQUESTS, REQUESTS_SLO_MET, PROMPT_TOKENS, TIME_TO_FIRST_TOKEN, INTER_TOKEN_LATENCY,
    E2E_REQUEST_LATENCY,
    NUM_REQUESTS_RUNNING, NUM_REQUESTS_WAITING, KV_CACHE_USAGE, ADMITTED_CONCURRENCY,
    STEP_SECONDS, STEP_OUTPUT_TOKENS, DRAFT_SECONDS, DRAFT_PREFILL_SECONDS,
    DRAFT_CATCHUP_SECONDS, ITERATIONS, ITERATION_FAILURES, STARTUP_SECONDS, FIXED_SHAPES,
    SPEC_DRAFTS, SPEC_DRAFT_TOKENS, SPEC_ACCEPTED_TOKENS, SPEC_THRESHOLD, SPEC_EXPLORATION_RATIO,
    ENGINE_INFO, SIMULATED_OVERRUNS,
)  # fmt: skip

# Each metric's own labels: what the engine sets (a histogram's _bucket series add `le`;
# spectune_engine_info's are its identity). Prometheus adds the target's (job, instance,
# namespace, pod, ...), so a pod that two jobs scrape (annotation discovery and a PodMonitor)
# has every series twice; a reader that keys a pod's series by these alone counts it once.
METRIC_LABELS: dict[str, tuple[str, ...]] = {
    REQUESTS: ("outcome",),
    STEP_SECONDS: ("mode", "batch"),
    STEP_OUTPUT_TOKENS: ("mode", "batch"),
    DRAFT_SECONDS: ("batch",),
    DRAFT_PREFILL_SECONDS: ("batch",),
    DRAFT_CATCHUP_SECONDS: ("batch",),
    ITERATIONS: ("mode", "explored"),
}
HISTOGRAMS = (TIME_TO_FIRST_TOKEN, INTER_TOKEN_LATENCY, E2E_REQUEST_LATENCY, STEP_SECONDS)


def own_labels(series: str) -> tuple[str, ...]:
    """The engine's labels on one series name (a histogram's _bucket, _sum or _count too)."""
    for histogram in HISTOGRAMS:
        suffix = series.removeprefix(histogram)
        if suffix in ("_bucket", "_sum", "_count"):
            return METRIC_LABELS.get(histogram, ()) + (("le",) if suffix == "_bucket" else ())
    return METRIC_LABELS.get(series, ())


# invalid: refused with a 4xx other than 429; cancelled: the client went away before the answer
# (a chat UI's stop button), which no goodput judges; error: the engine failed it.
OUTCOMES = ("ok", "error", "rejected", "invalid", "cancelled")
MODES = ("spec", "plain")

# About sqrt(2) apart so the crossover is located to within one bucket.
BATCH_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)


def batch_bucket(batch_size: int) -> int:
    """The bucket a batch size is counted in: the largest boundary not above it."""
    if batch_size < 1:
        raise ValueError(f"batch size must be >= 1, got {batch_size}")
    return BATCH_BUCKETS[bisect.bisect_right(BATCH_BUCKETS, batch_size) - 1]


# Histogram bounds (seconds): request latencies, and decode iteration times.
LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0,
                   2.5, 5.0, 10.0, 20.0, 40.0, 80.0)  # fmt: skip
STEP_BUCKETS = (0.0005, 0.001, 0.002, 0.004, 0.006, 0.008, 0.012, 0.016, 0.024, 0.032, 0.048,
                0.064, 0.096, 0.128, 0.192, 0.256, 0.5, 1.0, 2.0, 4.0)  # fmt: skip


def gpu_product(name: str) -> str:
    """A GPU's name as GPU Feature Discovery labels its node (`nvidia.com/gpu.product`): blanks
    as dashes ("NVIDIA H100 80GB HBM3" -> "NVIDIA-H100-80GB-HBM3"). The engine reports its
    device so, and per-SKU thresholds are keyed so, in the ConfigMap, the admin API and status:
    one name for a SKU whoever reads it (the node, the engine, the operator)."""
    return "-".join(name.split())
