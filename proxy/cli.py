"""The ``context-proxy`` command: ``serve``, ``check-config``, ``replay``."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Sequence

from proxy import redact
from proxy.config import ConfigError, config_path_from_env, load_config


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
        stream=sys.stderr,
    )
    redact.install()


def _cmd_serve(args: argparse.Namespace) -> int:
    from proxy.server.runner import serve

    try:
        config = load_config(config_path_from_env(args.config))
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    config = config.with_listen(args.host, args.port)
    _setup_logging(config.logging.level)
    asyncio.run(serve(config))
    return 0


def _cmd_check_config(args: argparse.Namespace) -> int:
    try:
        load_config(args.path)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 1
    print(f"{args.path}: ok")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="context-proxy",
        description="A compacting reverse proxy for the Anthropic Messages API.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the proxy")
    serve.add_argument("--config", help="YAML config file (default: $CONTEXT_PROXY_CONFIG, else built-in defaults)")
    serve.add_argument("--host", help="listen address (overrides listen.host)")
    serve.add_argument("--port", type=int, help="listen port (overrides listen.port; 0 = any free port)")
    serve.set_defaults(func=_cmd_serve)
    check = sub.add_parser("check-config", help="validate a config file; non-zero exit on errors")
    check.add_argument("path")
    check.set_defaults(func=_cmd_check_config)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    code: int = args.func(args)
    return code
