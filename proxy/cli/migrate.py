"""``context-proxy migrate``: bring the store's schema up to this release's, or (``--check``) say
what that would do without changing anything; and the one line a release says when the store's
schema is newer than it knows (``serve`` and ``migrate`` alike).

Exit codes: 0 (up to date; with ``--check`` nothing pending), 1 (``--check``: migrations pending),
2 (the store is newer than this release, cannot be reached, or the config is invalid).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from urllib.parse import urlsplit

from proxy.config.environment import config_path_from_env, store_password_from_env
from proxy.config.schema import ConfigError
from proxy.config.settings import load_config
from proxy.store import SchemaStatus, SchemaTooNew, StoreError, open_store, schema_status
from proxy.store.migrations import LATEST

__all__ = ["configure", "newer_schema", "run", "too_new_line"]

GUIDE = "docs/operations/upgrading.md"


def too_new_line(exc: SchemaTooNew) -> str:
    """One line: what was found, what this release supports, what to do."""
    return (
        f"context-proxy: the store's schema is version {exc.found}, newer than this release"
        f" supports (up to {exc.supported}; unknown migrations: {', '.join(map(str, exc.unknown))}):"
        " a newer release migrated it. Run that release or a later one, or restore the backup"
        f" taken before the upgrade ({GUIDE}); nothing was changed"
    )


def newer_schema(url: str) -> SchemaTooNew | None:
    """``SchemaTooNew`` when a newer release migrated the store at ``url`` (read only; a store
    that cannot be read now is for the caller to find out)."""
    try:
        return asyncio.run(schema_status(url)).too_new()
    except (StoreError, ValueError):
        return None


def where(url: str) -> str:
    """The store, for people: never a password (``postgresql://host:port/db``)."""
    if url.startswith("sqlite:"):
        return url
    parts = urlsplit(url)
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{parts.hostname or ''}{port}{parts.path}"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config", help="YAML config file (default: $CONTEXT_PROXY_CONFIG, else built-in defaults)"
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="only report the schema and the pending migrations; change nothing"
        " (exit 1 when some are pending)",
    )


def _report(url: str, status: SchemaStatus) -> int:
    if not status.pending:
        print(f"{where(url)}: schema {status.version}, up to date (this release: {LATEST})")
        return 0
    found = f"schema {status.version}" if status.recorded else "no store yet"
    count = len(status.pending)
    print(
        f"{where(url)}: {found}; {count} migration{'' if count == 1 else 's'} pending"
        f" (this release: {LATEST}), applied by the next start or `context-proxy migrate`,"
        " one-way (back up first):"
    )
    for m in status.pending:
        rewrites = f" [existing rows: {m.rewrites}]" if m.rewrites else ""
        print(f"  {m.version:>3}  {m.name}{rewrites}")
    return 1


async def _migrate(url: str) -> list[int]:
    before = await schema_status(url)
    store = await open_store(url)  # migrates (its log lines say what, and how long)
    await store.close()
    return [m.version for m in before.pending]


def run(args: argparse.Namespace) -> int:
    from proxy.logs import formatting as log_format

    try:
        config = load_config(config_path_from_env(args.config), env=True)
        config = config.with_store_password(store_password_from_env())  # as serve reads it
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    url = config.store_url
    try:
        if args.check:
            status = asyncio.run(schema_status(url))
            too_new = status.too_new()
            if too_new is not None:
                raise too_new
            return _report(url, status)
        log_format.setup(config.logging.level, config.logging.format)
        applied = asyncio.run(_migrate(url))
    except SchemaTooNew as exc:
        print(too_new_line(exc), file=sys.stderr)
        return 2
    except (StoreError, ValueError) as exc:
        print(f"context-proxy migrate: {where(url)}: {exc}", file=sys.stderr)
        return 2
    if applied:
        print(f"{where(url)}: schema {LATEST}; applied {', '.join(map(str, applied))}")
    else:
        print(f"{where(url)}: schema {LATEST}, up to date")
    return 0
