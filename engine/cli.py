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


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return _generate(args) if args.command == "generate" else _build(args)
    except USER_ERRORS as err:
        print(f"spectune-engine: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
