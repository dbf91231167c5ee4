"""``context-proxy serve --demo``: the proxy in front of the demo provider, in one process.

Nothing needs a key and nothing leaves the machine: the demo provider (:mod:`proxy.demo.upstream`,
model ``claude-demo-1``, priced in the model catalogue as the demo's own) listens on a free port of
127.0.0.1 in the same event loop, and the proxy forwards to it with settings that make a demo
compact within a few turns (:data:`DEMO_SETTINGS`: a threshold of 30,000 tokens instead of
80,000). The store is SQLite under ``./state/demo`` (relative to the working directory, kept
between runs: delete the folder to start over), apart from a real ``./state``.

Admin access without setting anything up: the demo's admin token is made once and kept in
``./state/demo/admin-token`` (mode 0600), so ``examples/demo_agent_loop.py`` and
``context-proxy admin --token-file state/demo/admin-token usage`` can read the usage ledger; the
console gets a one-time sign-in link. Both are printed, with what to run next, on stdout (the
log stays on stderr): unlike a real start, the link is printed even when stdout is not a
terminal, since a demo holds nothing but the demo's own conversations.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import secrets
import sys
from pathlib import Path
from typing import Any, TextIO

from aiohttp import web

from proxy.config.schema import ConfigError
from proxy.config.settings import Config, parse_config
from proxy.console.auth import CONSOLE_FIRST_SIGNIN
from proxy.console.first_signin import signin_link
from proxy.demo import model, upstream
from proxy.server.appkeys import TENANCY
from proxy.server.http.listeners import Listeners

__all__ = ["DEMO_SETTINGS", "STATE_DIR", "TOKEN_FILE", "admin_token", "demo_config", "run"]

STATE_DIR = Path("state") / "demo"
TOKEN_FILE = "admin-token"
# What differs from the defaults, and why: compaction starts at 30,000 tokens (not 80,000),
# cuts tool results to 2,000 tokens (not 5,000) and keeps the last 2 messages whole (not 6), so
# the demo's agent, reading one source file a turn, compacts every few turns and shows tool
# results cut, old turns summarised, and plans reused in between; the summaries are the demo
# model's own; ledger rows are written within 0.2 s, so the figures are there when the demo
# script asks for them; Ctrl-C waits at most 5 s for requests in flight.
DEMO_SETTINGS: dict[str, Any] = {
    "compaction": {
        "threshold": 30_000,
        "tool_result_cap": 2_000,
        "keep_recent": 2,
        "summary": {"model": model.MODEL},
    },
    "ledger": {"flush_seconds": 0.2},
    "shutdown": {"grace_seconds": 5},
}


def admin_token(state_dir: Path) -> tuple[str, Path]:
    """The demo's admin token, made on the first run (``state_dir/admin-token``, mode 0600)."""
    path = state_dir / TOKEN_FILE
    state_dir.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        token = path.read_text(encoding="ascii").strip()
        if len(token) >= 16:
            return token, path
        path.unlink()  # damaged: a new one
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    token = "cpa-demo-" + secrets.token_urlsafe(24)
    with os.fdopen(fd, "w", encoding="ascii") as f:
        f.write(token + "\n")
    return token, path


def demo_config(
    upstream_url: str, state_dir: Path, token: str, extra_tokens: tuple[bytes, ...] = ()
) -> Config:
    """The demo's settings; its admin token (and those of ``CONTEXT_PROXY_ADMIN_TOKEN``, as
    hashes) sign in to the admin API and the console."""
    config = parse_config(
        {**DEMO_SETTINGS, "upstream": {"base_url": upstream_url}, "state_dir": str(state_dir)},
        "<demo>",
    )
    digest = hashlib.sha256(token.encode("ascii")).digest()
    return config.with_admin_tokens((digest, *extra_tokens))


def banner(
    app: web.Application,
    listeners: Listeners,
    *,
    upstream_url: str,
    state_dir: Path,
    token_file: Path,
) -> str:
    """What ``serve --demo`` prints once listening: where everything is, and what to run next."""
    host, port = listeners.client[0]
    url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{port}"
    console_host, console_port = (listeners.admin or listeners.client)[0]
    tenant = app[TENANCY].current.default
    first = app.get(CONSOLE_FIRST_SIGNIN)
    if first is not None and tenant is not None:
        console = signin_link(console_host, console_port, first.issue(tenant.name))
        console += "  (a one-time link)"
    else:
        console = "off (console.enabled: false)"
    script = "python examples/demo_agent_loop.py"
    if url != "http://127.0.0.1:8080":
        script += f" --url {url}"
    threshold = DEMO_SETTINGS["compaction"]["threshold"]
    return "\n".join(
        [
            "",
            "context-proxy demo: no API key needed, nothing leaves this machine.",
            f"  proxy        {url}   (clients point their base URL here)",
            f"  provider     the demo provider at {upstream_url}, model {model.MODEL}",
            f"  compaction   from {threshold:,} tokens a request (the default is 80,000)",
            f"  store        SQLite {state_dir / 'context-proxy.db'} (delete {state_dir} to start over)",
            f"  admin token  {token_file}",
            f"  console      {console}",
            "",
            "Next, in another terminal (same folder):",
            f"  {script}",
            f"  context-proxy admin --url {url} --token-file {token_file} usage",
            "",
            "Ctrl-C stops the demo.",
            "",
        ]
    )


async def _serve(
    host: str | None,
    port: int | None,
    admin_port: int | None,
    extra_tokens: tuple[bytes, ...],
    token: tuple[str, Path],
    out: TextIO,
) -> None:
    from proxy.server.http.runner import serve

    state_dir = STATE_DIR
    token_text, token_file = token
    provider, upstream_url = await upstream.start("127.0.0.1", 0)
    try:
        config = demo_config(upstream_url, state_dir, token_text, extra_tokens)
        config = config.with_listen(host, port, admin_port)

        def announce(app: web.Application, listeners: Listeners) -> None:
            text = banner(
                app, listeners, upstream_url=upstream_url, state_dir=state_dir,
                token_file=token_file,
            )
            print(text, file=out, flush=True)

        await serve(config, announce=announce)
    finally:
        await provider.cleanup()


def run(
    host: str | None,
    port: int | None,
    admin_port: int | None,
    extra_tokens: tuple[bytes, ...] = (),
    out: TextIO = sys.stdout,
) -> None:
    """Run the demo until SIGTERM/SIGINT (``extra_tokens``: the environment's admin tokens).
    :class:`ConfigError` when its folder cannot be made or its token file read."""
    try:
        token = admin_token(STATE_DIR)
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ConfigError("serve --demo", [f"cannot use {STATE_DIR} for the demo's store and token: {why}"]) from None
    asyncio.run(_serve(host, port, admin_port, extra_tokens, token, out))
