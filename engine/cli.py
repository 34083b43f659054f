"""`spectune-engine`: generate text, and build the project's own model pairs."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from spectune.engine.checkpoint import ModelNotFound
from spectune.engine.config import ATTENTION, METHODS, EngineConfig
from spectune.engine.model import UnsupportedArchitecture
from spectune.engine.sequence import InvalidRequest, SamplingParams
from spectune.engine.zoo.registry import SIZES, cache_dir, resolve_model

if TYPE_CHECKING:
    from spectune.engine.bench.trace import TraceSettings


class EngineDidNotStart(RuntimeError):
    """`serve` stopped because its engine could not be built (a missing model, bad config)."""


USER_ERRORS = (
    ModelNotFound,
    UnsupportedArchitecture,
    InvalidRequest,
    ValueError,
    EngineDidNotStart,
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="spectune-engine", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="complete one prompt and print speed and acceptance")
    gen.add_argument("--model", required=True, help="checkpoint directory or a built-in name")
    gen.add_argument("--draft", help="draft checkpoint (implies --method draft)")
    gen.add_argument(
        "--method", choices=METHODS, help="speculation method (default: draft if --draft)"
    )
    gen.add_argument("--prompt", required=True)
    gen.add_argument("--max-tokens", type=int, default=64)
    gen.add_argument("--k", type=int, default=4, help="drafted tokens per iteration")
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--seed", type=int)
    gen.add_argument("--device", help="cpu or cuda (default: cuda when available)")
    gen.add_argument("--json", action="store_true", help="print one JSON object")

    serve = sub.add_parser(
        "serve", help="run the OpenAI-compatible server (settings: file < env < flags)"
    )
    serve.add_argument(
        "--config", dest="config_file", help="YAML settings file, watched for changes"
    )
    serve.add_argument("--model")
    serve.add_argument("--draft")
    serve.add_argument("--method", choices=(*METHODS, "auto"))
    serve.add_argument("--k", type=int)
    serve.add_argument("--threshold", type=int, help="batch size at/above which speculation is off")
    serve.add_argument("--hysteresis", type=float)
    serve.add_argument(
        "--exploration",
        type=float,
        help="share of iterations run plain where the gate speculates",
    )
    serve.add_argument("--ttft-ms", type=int, help="SLO target for time to first token")
    serve.add_argument("--tpot-ms", type=int, help="SLO target for mean time per output token")
    serve.add_argument("--max-batch-size", type=int)
    serve.add_argument("--max-queue", type=int, help="requests waiting for admission before 429")
    serve.add_argument("--max-model-len", type=int)
    serve.add_argument("--kv-cache-bytes", type=int)
    serve.add_argument("--device")
    serve.add_argument("--dtype", choices=("float32", "float16", "bfloat16"))
    serve.add_argument(
        "--attention", choices=ATTENTION, help="auto: Flex in place on CUDA, gather on the CPU"
    )
    serve.add_argument(
        "--compile",
        action="store_true",
        default=None,
        help="torch.compile the small ops between the matmuls: needs a C/C++ compiler",
    )
    serve.add_argument("--host")
    serve.add_argument("--port", type=int)
    serve.add_argument("--admin-token-file", help="file holding the admin bearer token (a Secret)")
    serve.add_argument(
        "--drain-timeout-s", type=float, help="SIGTERM: wait this long for running requests"
    )
    serve.add_argument("--seed", type=int)
    _simulation_flags(serve)

    _bench_parser(sub)

    models = sub.add_parser("models", help="the project's own model pairs")
    models_sub = models.add_subparsers(dest="models_command", required=True)
    build = models_sub.add_parser("build", help="train a target and its distilled draft (cached)")
    build.add_argument("--size", choices=tuple(SIZES), default="tiny")
    build.add_argument("--force", action="store_true", help="rebuild even when cached")
    return parser


def _simulation_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--simulate-device",
        help="run on a simulated GPU SKU (H100, A100, L4, H200 or its nvidia.com/gpu.product "
        "label): real tokens, the SKU's modelled clock",
    )
    parser.add_argument(
        "--simulate-time-scale",
        type=float,
        help="the simulated clock runs this many times slower than the SKU (default 1)",
    )
    parser.add_argument(
        "--simulate-extra-context",
        type=int,
        help="cached tokens each sequence holds on the simulated SKU beyond its real ones",
    )
    parser.add_argument(
        "--simulate-context-scale",
        type=float,
        help="each real cached token counts as this many on the simulated SKU (default 1)",
    )


def _numbers(kind: type) -> Callable[[str], tuple]:
    def parse(text: str) -> tuple:
        try:
            return tuple(kind(x) for x in text.split(",") if x.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected comma-separated numbers, got {text!r}"
            ) from None

    return parse


def _bench_parser(sub: argparse._SubParsersAction) -> None:
    bench = sub.add_parser(
        "bench",
        help="measure the crossover, gate at it, compare never/always/gated speculation",
        description="Batch sweep: per batch size, spec vs plain decode steps -> crossover and "
        "recommended threshold. Load sweep: load levels x policies -> goodput. Writes "
        "bench.json, bench.md and PNG plots to --out.",
    )
    bench.add_argument("--model", default="tiny-target")
    bench.add_argument(
        "--draft", help="draft model (default: a built-in target's own draft; '' for none)"
    )
    bench.add_argument("--method", choices=(*METHODS, "auto"), default="auto")
    bench.add_argument("--k", type=int, default=4, help="drafted tokens per iteration")
    bench.add_argument("--device")
    bench.add_argument("--kv-cache-bytes", type=int)
    bench.add_argument("--url", help="an OpenAI-compatible server instead of the in-process engine")
    bench.add_argument("--served-model", help="model name to request (default: /v1/models)")
    bench.add_argument("--admin-token-file", help="spectune admin token, to switch policies")
    bench.add_argument(
        "--sweep", choices=("both", "batch", "load"), help="default: both; load with --url"
    )
    bench.add_argument(
        "--batch-sizes", type=_numbers(int), help="batch buckets to sweep (default: 1..32)"
    )
    bench.add_argument("--iterations", type=int, default=16, help="timed steps per mode and size")
    bench.add_argument(
        "--stop-after", type=int, default=2, help="stop after speculation lost at N sizes (0: no)"
    )
    loads = bench.add_mutually_exclusive_group()
    loads.add_argument("--concurrency", type=_numbers(int), help="closed-loop levels (clients)")
    loads.add_argument("--rate", type=_numbers(float), help="open-loop levels (requests/s)")
    bench.add_argument("--requests", type=int, help="requests per level")
    bench.add_argument("--duration-s", type=float, default=120.0, help="max time per level")
    bench.add_argument(
        "--rounds", type=int, default=1, help="policies take turns N times per load level"
    )
    bench.add_argument("--request-timeout-s", type=float, default=300.0)
    bench.add_argument("--prompts", type=Path, help='JSONL file: {"prompt": ..., "max_tokens"?}')
    bench.add_argument("--prompt-len", type=int, default=64, help="bytes of shipped text")
    bench.add_argument("--output-tokens", default="64", help="N | uniform:LOW-HIGH | exp:MEAN")
    bench.add_argument("--ttft-ms", type=int, default=1000)
    bench.add_argument("--tpot-ms", type=int, default=100)
    bench.add_argument("--threshold", type=int, help="gate here instead of the measured crossover")
    bench.add_argument(
        "--policies",
        type=lambda t: tuple(x for x in t.split(",") if x),
        default=("never", "always", "gated"),
        help="never,always,gated (default) or current (a server as configured)",
    )
    bench.add_argument(
        "--temperature",
        type=float,
        default=0.0,
        help="sampling temperature of every request, a trace's too (default 0: greedy)",
    )
    bench.add_argument("--seed", type=int, default=0)
    _simulation_flags(bench)
    _trace_flags(bench)
    bench.add_argument("--out", type=Path, default=Path("bench-report"))


def _trace_flags(bench: argparse.ArgumentParser) -> None:
    trace = bench.add_argument_group(
        "trace replay", "replay recorded traffic under each policy instead of load levels"
    )
    trace.add_argument(
        "--trace",
        help="CSV with TIMESTAMP, ContextTokens, GeneratedTokens (.gz too), or azure-conv: "
        "the Azure LLM conversation trace that ships with spectune (CC BY 4.0)",
    )
    trace.add_argument(
        "--trace-speed", type=float, help="trace seconds per second of replay (default 1)"
    )
    trace.add_argument(
        "--trace-scale",
        type=float,
        help="factor on context and output lengths (default 1); what then does not fit the "
        "model is clipped, counted and reported",
    )
    trace.add_argument(
        "--trace-max-len",
        type=int,
        help="context + output limit, for a URL whose /v1/models does not report max_model_len",
    )


def _generate(args: argparse.Namespace) -> int:
    from spectune.engine.engine import LLMEngine

    config = EngineConfig(
        model=args.model,
        draft=args.draft,
        method=args.method or "auto",
        k=args.k,
        device=args.device,
    )
    params = SamplingParams(
        max_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed
    )
    engine = LLMEngine(config, resolve_model=resolve_model)
    start = time.perf_counter()
    completion = engine.generate([args.prompt], params)[0]
    seconds = time.perf_counter() - start
    spec = [it for it in engine.iterations if it.mode == "spec"]
    drafted = sum(it.drafted for it in spec)
    accepted = sum(it.accepted for it in spec)
    result = {
        "text": completion.text,
        "completion_tokens": len(completion.token_ids),
        "prompt_tokens": completion.prompt_tokens,
        "finish_reason": completion.finish_reason,
        "seconds": round(seconds, 4),
        "tokens_per_second": round(len(completion.token_ids) / seconds, 2),
        "method": config.method,
        "acceptance_rate": round(accepted / drafted, 4) if drafted else None,
        "mean_accepted_length": round(sum(it.tokens for it in spec) / len(spec), 3)
        if spec
        else None,
    }
    if args.json:
        print(json.dumps(result))
    else:
        print(completion.text)
        stats = {k: v for k, v in result.items() if k != "text"}
        print(" ".join(f"{k}={v}" for k, v in stats.items()), file=sys.stderr)
    return 0


def _build(args: argparse.Namespace) -> int:
    from spectune.engine.zoo.training import build_pair

    paths = (
        build_pair(args.size, cache_dir()) if args.force else map(resolve_model, SIZES[args.size])
    )
    for path in paths:
        print(path)
    return 0


def _bench(args: argparse.Namespace) -> int:
    import shlex

    from spectune.engine.bench.report import describe_crossover
    from spectune.engine.bench.runner import run

    settings = _bench_settings(args)
    result = run(settings, shlex.join(["spectune-engine", *sys.argv[1:]]), _stderr)
    if result.batch_sweep:
        print(f"crossover: {describe_crossover(result.batch_sweep.crossover)}")
    if result.load_sweep:
        for level in result.load_sweep.levels:
            print(f"goodput {level.policy} at load {level.load:g}: {level.goodput_rps:.3f} req/s")
    for replayed in result.trace.runs if result.trace else []:
        total = replayed.total
        print(f"goodput {total.policy} over the trace: {total.goodput_rps:.3f} req/s")
    if result.verdict:
        print(
            f"gate claim holds: {'yes' if result.verdict.holds else 'no'}"
            f" (lowest gated/best ratio {result.verdict.min_ratio})"
        )
    print(f"report: {settings.out / 'bench.md'}")
    return 0


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _bench_settings(args: argparse.Namespace):
    from spectune.engine.bench.batch_sweep import SweepSettings
    from spectune.engine.bench.runner import DEFAULT_BATCH_SIZES, BenchSettings
    from spectune.engine.bench.schema import Slo
    from spectune.engine.contract import BATCH_BUCKETS

    sizes = args.batch_sizes or DEFAULT_BATCH_SIZES
    if sorted(set(sizes)) != list(sizes) or not set(sizes) <= set(BATCH_BUCKETS):
        raise ValueError(f"--batch-sizes must be ascending batch buckets: {BATCH_BUCKETS}")
    token = Path(args.admin_token_file).read_text().strip() if args.admin_token_file else None
    return BenchSettings(
        model=args.model,
        draft=_bench_draft(args),
        method=args.method,
        k=args.k,
        device=args.device,
        kv_cache_bytes=args.kv_cache_bytes,
        url=args.url,
        served_model=args.served_model,
        admin_token=token,
        sweep=args.sweep or ("load" if args.url else "both"),
        batch=SweepSettings(sizes, args.iterations, stop_after=args.stop_after),
        load_kind="open" if args.rate else "closed",
        loads=args.rate or args.concurrency or (1, 2, 4, 8, 16),
        requests=args.requests,
        duration_s=args.duration_s,
        rounds=args.rounds,
        request_timeout_s=args.request_timeout_s,
        prompts_file=args.prompts,
        prompt_len=args.prompt_len,
        output_lengths=args.output_tokens,
        temperature=args.temperature,
        slo=Slo(ttft_ms=args.ttft_ms, tpot_ms=args.tpot_ms),
        threshold=args.threshold,
        policies=args.policies,
        seed=args.seed,
        out=args.out,
        simulate_device=args.simulate_device,
        simulate_time_scale=args.simulate_time_scale or 1.0,
        simulate_extra_context=args.simulate_extra_context or 0,
        simulate_context_scale=args.simulate_context_scale or 1.0,
        trace=_trace_settings(args),
    )


def _trace_settings(args: argparse.Namespace) -> TraceSettings | None:
    """The trace is read here, so that a malformed one is refused before anything runs."""
    from spectune.engine.bench.trace import TraceSettings
    from spectune.engine.bench.trace_file import load_trace

    flags = ("trace_speed", "trace_scale", "trace_max_len")  # TraceSettings' fields, prefixed
    given = {f.removeprefix("trace_"): v for f in flags if (v := getattr(args, f)) is not None}
    if args.trace is None:
        if given:
            raise ValueError(f"--trace-{next(iter(given)).replace('_', '-')} needs --trace")
        return None
    if args.rate or args.concurrency:
        raise ValueError("--trace replaces load levels: no --rate or --concurrency with it")
    return TraceSettings(load_trace(args.trace), **given)


def _bench_draft(args: argparse.Namespace) -> str | None:
    """The draft given, else the built-in pair's draft when speculating with a draft model."""
    if args.draft is not None:
        return args.draft or None
    pairs = dict(SIZES.values())
    return pairs.get(args.model) if args.method in ("auto", "draft") else None


def _serve(args: argparse.Namespace) -> int:
    import logging

    import uvicorn

    from spectune.engine.cuda_check import check_cuda
    from spectune.engine.serving.server import create_app
    from spectune.engine.serving.settings import load_settings

    flags = {k: v for k, v in vars(args).items() if k != "command" and v is not None}
    settings = load_settings(flags)
    if problem := check_cuda(settings.device):
        raise EngineDidNotStart(problem)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    shown = settings.model_dump(mode="json", exclude={"admin_token_file"})
    logging.getLogger("spectune.engine").info("settings: %s", json.dumps(shown))
    # When the engine cannot start, stop serving (the lambda finds `server` when it runs).
    app = create_app(settings, on_failure=lambda: setattr(server, "should_exit", True))
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host=settings.host,
            port=settings.port,
            log_level="warning",
            timeout_graceful_shutdown=max(1, int(settings.drain_timeout_s)),
        )
    )
    server.run()
    if (failure := app.state.server.failure) is not None:
        raise EngineDidNotStart(f"the engine did not start: {failure}")
    return 0


COMMANDS = {"generate": _generate, "serve": _serve, "models": _build, "bench": _bench}


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except USER_ERRORS as err:
        print(f"spectune-engine: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
