"""`spectune-engine`: generate text, and build the project's own model pairs."""

from __future__ import annotations

import argparse
import json
import sys
import time

from spectune.engine.checkpoint import ModelNotFound
from spectune.engine.config import METHODS, EngineConfig
from spectune.engine.model import UnsupportedArchitecture
from spectune.engine.sequence import InvalidRequest, SamplingParams
from spectune.engine.zoo import SIZES, cache_dir, resolve_model

USER_ERRORS = (ModelNotFound, UnsupportedArchitecture, InvalidRequest, ValueError)


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
        "--exploration", type=float, help="share of iterations run in the other mode"
    )
    serve.add_argument("--ttft-ms", type=int, help="SLO target for time to first token")
    serve.add_argument("--tpot-ms", type=int, help="SLO target for mean time per output token")
    serve.add_argument("--max-batch-size", type=int)
    serve.add_argument("--max-queue", type=int, help="requests waiting for admission before 429")
    serve.add_argument("--max-model-len", type=int)
    serve.add_argument("--kv-cache-bytes", type=int)
    serve.add_argument("--device")
    serve.add_argument("--dtype", choices=("float32", "float16", "bfloat16"))
    serve.add_argument("--host")
    serve.add_argument("--port", type=int)
    serve.add_argument("--admin-token-file", help="file holding the admin bearer token (a Secret)")
    serve.add_argument(
        "--drain-timeout-s", type=float, help="SIGTERM: wait this long for running requests"
    )
    serve.add_argument("--seed", type=int)

    models = sub.add_parser("models", help="the project's own model pairs")
    models_sub = models.add_subparsers(dest="models_command", required=True)
    build = models_sub.add_parser("build", help="train a target and its distilled draft (cached)")
    build.add_argument("--size", choices=tuple(SIZES), default="tiny")
    build.add_argument("--force", action="store_true", help="rebuild even when cached")
    return parser


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
    engine = LLMEngine(config)
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
    from spectune.engine.training import build_pair

    paths = (
        build_pair(args.size, cache_dir()) if args.force else map(resolve_model, SIZES[args.size])
    )
    for path in paths:
        print(path)
    return 0


def _serve(args: argparse.Namespace) -> int:
    import logging

    import uvicorn

    from spectune.engine.serve_settings import load_settings
    from spectune.engine.server import create_app

    flags = {k: v for k, v in vars(args).items() if k != "command" and v is not None}
    settings = load_settings(flags)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    shown = settings.model_dump(mode="json", exclude={"admin_token_file"})
    logging.getLogger("spectune.engine").info("settings: %s", json.dumps(shown))
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level="warning",
        timeout_graceful_shutdown=max(1, int(settings.drain_timeout_s)),
    )
    return 0


COMMANDS = {"generate": _generate, "serve": _serve, "models": _build}


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except USER_ERRORS as err:
        print(f"spectune-engine: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
