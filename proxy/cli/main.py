"""The ``context-proxy`` command: ``serve``, ``check-config``, ``migrate``, ``replay``, ``models``,
``admin``, ``demo-upstream``."""

from __future__ import annotations

import argparse
import asyncio
import errno
import os
import sys
from collections.abc import Sequence

from proxy.cli import admin as admin_cli
from proxy.cli import migrate as migrate_cli
from proxy.cli import models as models_cli
from proxy.config.environment import (
    admin_tokens_from_env,
    config_path_from_env,
    store_password_from_env,
)
from proxy.config.schema import ConfigError
from proxy.config.settings import load_config
from proxy.logs import formatting as log_format


def _setup_logging(level: str, fmt: str = "text") -> None:
    log_format.setup(level, fmt)


def _cmd_serve(args: argparse.Namespace) -> int:
    from proxy.server.http.runner import serve
    from proxy.store import SchemaTooNew

    if args.demo:
        return _serve_demo(args)
    try:
        config = load_config(config_path_from_env(args.config), env=True)
        config = config.with_admin_tokens(admin_tokens_from_env())
        config = config.with_store_password(store_password_from_env())
        config = config.with_listen(args.host, args.port, args.admin_port)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    too_new = migrate_cli.newer_schema(config.store_url)
    if too_new is not None:  # before anything starts: one line, no traceback
        print(migrate_cli.too_new_line(too_new), file=sys.stderr)
        return 2
    _setup_logging(config.logging.level, config.logging.format)
    # The one-time console link goes to a terminal only: a redirected stderr is a log stream.
    terminal = sys.stderr if sys.stderr.isatty() else None
    try:
        asyncio.run(serve(config, terminal=terminal))
    except ConfigError as exc:  # invalid tenant policies: refuse to start
        print(exc, file=sys.stderr)
        return 2
    except SchemaTooNew as exc:  # migrated by a newer release since the check above
        print(migrate_cli.too_new_line(exc), file=sys.stderr)
        return 2
    except OSError as exc:
        if exc.errno not in _LISTEN_ERRORS:
            raise
        print(f"serve: cannot listen: {exc.strerror or exc}", file=sys.stderr)
        return 2
    return 0


# the address is taken, not this machine's, or a privileged port
_LISTEN_ERRORS = (errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.EACCES)


def _serve_demo(args: argparse.Namespace) -> int:
    """``serve --demo``: its own settings (``proxy.demo.serve``); only the listener is chosen."""
    from proxy.demo import serve as demo

    if args.config:
        print("serve --demo: runs on the demo's own settings; drop --config", file=sys.stderr)
        return 2
    try:
        tokens = admin_tokens_from_env()
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    _setup_logging("INFO")
    try:
        demo.run(args.host, args.port, args.admin_port, tokens)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    except OSError as exc:
        if exc.errno not in _LISTEN_ERRORS:
            raise
        print(
            f"serve --demo: cannot listen: {exc.strerror or exc} (another proxy on the port?"
            " choose one with --port)",
            file=sys.stderr,
        )
        return 2
    return 0


def _cmd_check_config(args: argparse.Namespace) -> int:
    """Every problem at once: the config file's, then its tenant policies' (read with the file's
    valid keys, unless ``auth``, ``policies_dir`` or ``state_dir`` is wrong)."""
    from proxy.config.schema import bounded_lines
    from proxy.config.settings import check_config_file
    from proxy.tenancy.policies import load_tenancy

    config, problems, policies = check_config_file(args.path)
    in_file = len(problems)
    tenancy = None
    if config is not None and policies:
        try:
            tenancy = load_tenancy(config, source=args.path)
        except ConfigError as exc:
            problems = problems + exc.errors
    elif config is not None:
        problems.append(f"{args.path}: tenant policies not checked: fix the keys above first")
    if problems:
        print(bounded_lines(problems), file=sys.stderr)
        if in_file and len(problems) > in_file and policies:
            print(
                f"{args.path}: {in_file} problem(s) in the file,"
                f" {len(problems) - in_file} in the tenant policies",
                file=sys.stderr,
            )
        return 1
    assert tenancy is not None
    count = len(tenancy.tenants)
    print(f"{args.path}: ok (auth.mode {tenancy.mode}, {count} tenant{'' if count == 1 else 's'})")
    return 0


def _cmd_replay(args: argparse.Namespace) -> int:
    """Replay a recorded conversation through the compaction engine, offline by default."""
    import os

    from proxy.replay.readers import ReaderError, load_conversation
    from proxy.replay.report import PlotUnavailable, format_report, plot_tokens, write_json
    from proxy.replay.runner import policy_from_config, run_replay, with_overrides
    from proxy.replay.summarisers import ExtractiveSummariser, Summariser, UpstreamSummariser

    try:
        config = load_config(config_path_from_env(args.config))
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    if args.plot:  # fail before the replay, not after it
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            print("replay: --plot needs matplotlib: pip install 'context-proxy[plot]'", file=sys.stderr)
            return 2
    key = os.environ.get("ANTHROPIC_API_KEY", "")
    if args.upstream and not key:
        print("replay: --upstream needs ANTHROPIC_API_KEY in the environment", file=sys.stderr)
        return 2
    try:
        conversation = load_conversation(args.file)
    except (ReaderError, ValueError, OSError) as exc:  # one line, never a traceback
        line = " ".join(str(exc).split()) or type(exc).__name__
        print(f"replay: {line}", file=sys.stderr)
        return 2
    from proxy.config.compaction import limits_for
    from proxy.config.models import catalogue_of
    from proxy.core.catalogue_data import REPLAY_MODEL

    # the limits of the conversation's model, as the edge resolves them per request
    limits = limits_for(
        config.compaction,
        conversation.model or REPLAY_MODEL,
        [b.strip() for b in (args.betas or "").split(",") if b.strip()],
        args.max_tokens,
        catalogue_of(config),
    )
    try:
        policy = with_overrides(
            policy_from_config(config.compaction, limits), args.threshold, args.hard_limit
        )
    except ValueError as exc:
        hint = " (pass --hard-limit as well)" if args.threshold and args.hard_limit is None else ""
        print(f"replay: {exc}{hint}", file=sys.stderr)
        return 2

    from proxy.core.tokens import TokenCounter

    counter = TokenCounter()
    upstream: UpstreamSummariser | None = None
    summariser: Summariser
    if args.upstream:
        upstream = UpstreamSummariser(args.upstream, key, config.compaction.summary)
        summariser = upstream
    else:
        summariser = ExtractiveSummariser(counter.count_text)
    try:
        result = run_replay(
            conversation,
            policy,
            summariser,
            offline=upstream is None,
            counter=counter,
            progress=not args.no_progress,
            max_plans=config.compaction.max_plans,
        )
    finally:
        if upstream is not None:
            upstream.close()
    if not config.compaction.enabled:
        print("note: compaction is disabled in this config; the proxy would forward every request unchanged", file=sys.stderr)
    print(format_report(result))
    if args.json:
        write_json(result, args.json)
        print(f"figures written to {args.json}")
    if args.plot:
        try:
            plot_tokens(result, args.plot)
        except PlotUnavailable as exc:
            print(f"replay: {exc}", file=sys.stderr)
            return 2
        print(f"plot written to {args.plot}")
    return 1 if result.invalid_views else 0


def _cmd_demo_upstream(args: argparse.Namespace) -> int:
    """A fake provider for demos (never calls out): see :mod:`proxy.demo.upstream`."""
    from proxy.demo.upstream import serve as serve_demo

    _setup_logging("INFO")
    asyncio.run(serve_demo(args.host, args.port))
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
    serve.add_argument(
        "--admin-port",
        type=int,
        help="serve /admin, /console and /metrics on this port only (overrides listen.admin_port;"
        " 0 = any free port)",
    )
    serve.add_argument(
        "--demo",
        action="store_true",
        help="try it without a key: the proxy in front of the built-in demo provider, with"
        " settings that compact within a few turns and a store under ./state/demo",
    )
    serve.set_defaults(func=_cmd_serve)
    check = sub.add_parser(
        "check-config",
        help="validate a config file and the tenant policies of its policies_dir; non-zero exit on errors",
    )
    check.add_argument("path")
    check.set_defaults(func=_cmd_check_config)
    migrate = sub.add_parser(
        "migrate",
        help="apply the store's pending schema migrations; --check: only list them",
        description="Bring the store (store.url, else state_dir's SQLite file) to this release's "
        "schema, as the proxy does at start, saying each migration and how long it took; with "
        "--check, report the store's schema and the pending migrations without changing "
        "anything (exit 1 when some are pending, 2 when the store is newer than this release).",
    )
    migrate_cli.configure(migrate)
    migrate.set_defaults(func=migrate_cli.run)
    replay = sub.add_parser(
        "replay",
        help="show what the proxy would do to a recorded conversation, turn by turn (offline)",
        description="Replay a conversation (Messages JSON, or a raw Claude Code session .jsonl) "
        "request by request through the compaction engine and report tokens, compactions, "
        "validity and prompt-cache prefix stability. Offline: summaries come from a deterministic "
        "extractive stand-in unless --upstream is given.",
    )
    replay.add_argument("file", help="Messages JSON ({system, tools, messages}) or Claude Code .jsonl")
    replay.add_argument("--config", help="YAML config file for the compaction policy (default: $CONTEXT_PROXY_CONFIG, else built-in defaults)")
    replay.add_argument("--threshold", type=int, help="override compaction.threshold (tokens)")
    replay.add_argument("--hard-limit", type=int, help="override compaction.hard_limit (tokens)")
    replay.add_argument("--max-tokens", type=int, default=32_000, help="the max_tokens each replayed request asks for (default 32000; an 'auto' hard limit is the model's window minus it)")
    replay.add_argument("--betas", metavar="LIST", help="anthropic-beta values the requests carry, comma-separated (context-1m-2025-08-07: the 1M window where the model has it)")
    replay.add_argument("--upstream", metavar="URL", help="make real summary calls to this upstream (key from $ANTHROPIC_API_KEY); without it nothing touches the network")
    replay.add_argument("--json", metavar="OUT", help="write every figure, per request and totals, as JSON")
    replay.add_argument("--plot", metavar="OUT.png", help="draw tokens per request before/after (needs matplotlib)")
    replay.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    replay.set_defaults(func=_cmd_replay)
    models = sub.add_parser(
        "models",
        help="what the proxy knows of each model (ids per platform, windows, prices, thinking"
        " binding) and whether each value is built in or from the config",
        description="Print the model catalogue as this config makes it: the built-in rows and"
        " the config's models: entries (and the older model_ids:/prices: keys). With MODEL"
        " names (any platform's spelling), every value of those models with its origin and source.",
    )
    models_cli.configure(models)
    models.set_defaults(func=models_cli.run)
    admin = sub.add_parser(
        "admin",
        help="read and change durable state through the admin API (token from an env var)",
        description="A client of the proxy's admin API (/admin/v1): sessions, durable state and "
        "its history, facts / pending items / evidence, the injected block preview, transcripts "
        "and compaction manifests. Prints JSON. The admin token is read from the environment "
        "variable named by --token-env, never from the command line.",
    )
    admin_cli.configure(admin)
    admin.set_defaults(func=admin_cli.run)
    demo = sub.add_parser(
        "demo-upstream",
        help="run a fake provider for demos: deterministic answers, no key, never calls out",
        description="A tiny stand-in for the Messages API (/v1/messages, JSON or SSE; "
        "/v1/messages/count_tokens; /v1/models) answering deterministically, so the proxy can be "
        "tried without a provider key. Point upstream.base_url at it.",
    )
    demo.add_argument("--host", default="127.0.0.1", help="listen address (default 127.0.0.1)")
    demo.add_argument("--port", type=int, default=9000, help="listen port (default 9000; 0 = any free port)")
    demo.set_defaults(func=_cmd_demo_upstream)
    return parser


# the shell's status for a command whose reader went away (128 + SIGPIPE), as `yes | head` gets
CLOSED_PIPE_STATUS = 141


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code: int = args.func(args)
        sys.stdout.flush()  # a closed pipe shows here, not as a traceback when Python exits
    except BrokenPipeError:
        # The reader left (`... | head`): stop quietly. What is still buffered must not be
        # flushed again at exit, so stdout now goes nowhere.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return CLOSED_PIPE_STATUS
    return code
