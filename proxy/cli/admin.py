"""``context-proxy admin ...``: a thin client of the admin API (``proxy.server.admin``).

Standard library only. Every command is one or two HTTP calls; answers are printed as JSON on
stdout (``usage``: tables, :mod:`proxy.cli.usage_table`; ``--json`` for the figures). Exit status: 0 success, 1 the API answered with an error (its JSON body goes to stderr),
2 usage errors, a missing token or an unreachable proxy.

The admin token is read from an environment variable (``--token-env``, default
``CONTEXT_PROXY_ADMIN_TOKEN``) or a file (``--token-file``), never from the command line: argv is
visible to every user of the machine (``ps``). The client never follows redirects (the token would go along) and ignores
``*_proxy`` environment variables: it talks to the proxy it was pointed at, directly.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

from proxy.cli import usage_table

__all__ = ["DEFAULT_TOKEN_ENV", "DEFAULT_URL", "AdminClient", "configure", "run"]

DEFAULT_URL = "http://127.0.0.1:8080"
DEFAULT_TOKEN_ENV = "CONTEXT_PROXY_ADMIN_TOKEN"
URL_ENV = "CONTEXT_PROXY_ADMIN_URL"
KINDS = {"fact": "facts", "facts": "facts", "pending": "pending", "evidence": "evidence"}


class ApiError(Exception):
    def __init__(self, status: int, body: object) -> None:
        super().__init__(status)
        self.status = status
        self.body = body


class UsageError(Exception):
    pass


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None  # a 3xx is then an HTTPError, reported like any other answer


class AdminClient:
    """``request(method, path, body)`` against ``<base_url>/admin/v1``; JSON in, JSON out."""

    def __init__(self, base_url: str, token: str, timeout: float = 30.0) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise UsageError("--url: expected http://host:port or https://host:port")
        self.base = base_url.rstrip("/") + "/admin/v1"
        self._token = token
        self.timeout = timeout
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirects)

    def request(
        self,
        method: str,
        path: tuple[str, ...],
        body: object = None,
        query: Mapping[str, str] | None = None,
    ) -> Any:
        url = self.base + "".join("/" + quote(part, safe="") for part in path)
        if query:
            url += "?" + urlencode(query)
        data = None if body is None else json.dumps(body).encode()
        headers = {"Authorization": f"Bearer {self._token}", "Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = "application/json"
        req = urllib.request.Request(url, data=data, method=method, headers=headers)
        try:
            with self._opener.open(req, timeout=self.timeout) as response:
                return _decode(response.read())
        except urllib.error.HTTPError as exc:
            with exc:
                raise ApiError(exc.code, _decode(exc.read())) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise UsageError(f"cannot reach the proxy at {self.base}: {reason}") from None


def _decode(raw: bytes) -> Any:
    try:
        return json.loads(raw) if raw else None
    except ValueError:
        return raw.decode("utf-8", "replace")


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _kind_path(kind: str) -> str:
    try:
        return KINDS[kind]
    except KeyError:
        raise UsageError("kind: expected fact, pending or evidence") from None


def _read_changes(path: str) -> object:
    try:
        if path == "-":
            text = sys.stdin.read()
        else:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        data = json.loads(text)
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from None
    except ValueError:
        raise UsageError(f"{path}: not valid JSON") from None
    return {"changes": data} if isinstance(data, list) else data


def _token_from_file(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            token = f.read(4096).strip()
    except OSError as exc:
        raise UsageError(f"--token-file: cannot read {path}: {exc.strerror or exc}") from None
    if not token:
        raise UsageError(f"--token-file: {path} is empty")
    return token


def _query(**fields: str | None) -> dict[str, str]:
    return {name: value for name, value in fields.items() if value is not None}


def _given(**fields: object) -> dict[str, object]:
    return {name: value for name, value in fields.items() if value is not None}


# --- commands: each returns what to print ------------------------------------------------------

Command = Callable[[AdminClient, argparse.Namespace], Any]


def _sessions(c: AdminClient, a: argparse.Namespace) -> Any:
    return c.request("GET", ("sessions",))


def _state(c: AdminClient, a: argparse.Namespace) -> Any:
    return c.request("GET", ("sessions", a.session, "state"))


def _history(c: AdminClient, a: argparse.Namespace) -> Any:
    return c.request("GET", ("sessions", a.session, "history"))


def _item(c: AdminClient, a: argparse.Namespace) -> Any:
    return c.request("GET", ("sessions", a.session, _kind_path(a.kind), a.id))


def _changes(c: AdminClient, a: argparse.Namespace) -> Any:
    return c.request("POST", ("sessions", a.session, "changes"), _read_changes(a.file))


def _add_fact(c: AdminClient, a: argparse.Namespace) -> Any:
    body = {
        "id": a.id,
        "content": a.content,
        "source": a.source,
        "last_confirmed_at": a.confirmed_at or _now(),
    }
    return c.request("POST", ("sessions", a.session, "facts"), body)


def _update_fact(c: AdminClient, a: argparse.Namespace) -> Any:
    body = _given(content=a.content, source=a.source, last_confirmed_at=a.confirmed_at)
    if not body:
        raise UsageError("update-fact: give --content, --source or --confirmed-at")
    return c.request("PATCH", ("sessions", a.session, "facts", a.id), body)


def _add_pending(c: AdminClient, a: argparse.Namespace) -> Any:
    body = {
        "id": a.id,
        "content": a.content,
        "status": a.status,
        "source": a.source,
        "last_confirmed_at": a.confirmed_at or _now(),
    }
    return c.request("POST", ("sessions", a.session, "pending"), body)


def _set_pending_status(c: AdminClient, a: argparse.Namespace) -> Any:
    if a.status == "done" and not a.source:
        raise UsageError("set-pending-status done: --source (the confirming pointer) is required")
    body = _given(status=a.status, source=a.source, last_confirmed_at=a.confirmed_at or _now())
    return c.request("PATCH", ("sessions", a.session, "pending", a.id), body)


def _add_evidence(c: AdminClient, a: argparse.Namespace) -> Any:
    body: dict[str, object] = {
        "id": a.id,
        "title": a.title,
        "source": a.source,
        "captured_at": a.captured_at,
        "score": a.score,
        "rank": a.rank,
        "last_confirmed_at": a.confirmed_at or _now(),
    }
    if a.conflict_key is not None:
        body["conflict_key"] = a.conflict_key
    return c.request("POST", ("sessions", a.session, "evidence"), body)


def _retire(c: AdminClient, a: argparse.Namespace) -> Any:
    body = {"source": a.source, "retired_at": a.retired_at or _now()}
    return c.request("POST", ("sessions", a.session, _kind_path(a.kind), a.id, "retire"), body)


def _preview(c: AdminClient, a: argparse.Namespace) -> Any:
    answer = c.request("GET", ("sessions", a.session, "preview"))
    if a.block and isinstance(answer, dict):
        return _Text(answer.get("block") or "")
    return answer


def _transcript(c: AdminClient, a: argparse.Namespace) -> Any:
    query = {"after": str(a.after), "limit": str(a.limit)}
    return c.request("GET", ("sessions", a.session, "transcript"), query=query)


def _manifest(c: AdminClient, a: argparse.Namespace) -> Any:
    return c.request("GET", ("manifests", a.compaction_id))


def _when(option: str, text: str | None, now: datetime) -> str | None:
    if text is None:
        return None
    try:
        return usage_table.iso(usage_table.parse_when(text, now))
    except ValueError as exc:
        raise UsageError(f"{option}: {exc}") from None


def _usage(c: AdminClient, a: argparse.Namespace) -> Any:
    """The usage ledger's totals over a range (one bucket), and the most recent sessions."""
    now = datetime.now(UTC)
    since = _when("--since", a.since, now) or usage_table.iso(now - timedelta(days=1))
    until = _when("--until", a.until, now) or usage_table.iso(now)
    if since >= until:
        raise UsageError(f"--since: expected a time before --until ({since} is not before {until})")
    span = datetime.fromisoformat(until) - datetime.fromisoformat(since)
    if not 0 <= a.sessions <= 500:
        raise UsageError("--sessions: expected 0 to 500")
    query = _query(
        since=since, until=until, session=a.session, model=a.model,
        bucket=str(max(1, int(span.total_seconds()))),
    )
    summary = c.request("GET", ("usage", "summary"), query=query)
    tenant = summary.get("tenant") if isinstance(summary, dict) else None
    if a.tenant is not None and tenant != a.tenant:
        raise UsageError(
            f"--tenant {a.tenant}: the admin token is tenant {tenant or '(unknown)'}'s (a token"
            " reads its own tenant only: choose the token with --token-env or --token-file)"
        )
    sessions = None
    if a.session is None and a.sessions > 0:
        listed = _query(since=since, until=until, model=a.model, limit=str(a.sessions))
        sessions = c.request("GET", ("usage", "sessions"), query=listed)
    if a.json:
        answer = {"tenant": tenant, "since": since, "until": until}
        answer["totals"] = summary.get("totals") if isinstance(summary, dict) else None
        if sessions is not None:
            answer["sessions"] = sessions
        return answer
    return _Text(usage_table.render(summary, sessions, a.session))


class _Text(str):
    """Printed as is, not as JSON."""


# --- the parser ------------------------------------------------------------------------------


def _command(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], name: str, fn: Command, help: str
) -> argparse.ArgumentParser:
    parser = sub.add_parser(name, help=help, description=help)
    parser.set_defaults(admin_func=fn)
    return parser


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the admin options and commands to ``parser`` (``context-proxy admin``)."""
    parser.add_argument(
        "--url",
        help=f"the proxy's base URL (default: ${URL_ENV}, else {DEFAULT_URL})",
    )
    parser.add_argument(
        "--token-env",
        default=DEFAULT_TOKEN_ENV,
        metavar="VAR",
        help=f"environment variable holding the admin token (default: {DEFAULT_TOKEN_ENV});"
        " the token is never taken from the command line",
    )
    parser.add_argument(
        "--token-file",
        metavar="PATH",
        help="read the admin token from this file instead (e.g. state/demo/admin-token)",
    )
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds (default: 30)")
    sub = parser.add_subparsers(dest="admin_command", required=True, metavar="COMMAND")

    _command(sub, "sessions", _sessions, "list the tenant's sessions")
    for name, fn, what in (
        ("state", _state, "the session's current durable state"),
        ("history", _history, "every change to the session's durable state, in order"),
        ("preview", _preview, "the block that would be injected, and each pointer's resolution"),
    ):
        p = _command(sub, name, fn, what)
        p.add_argument("session")
        if name == "preview":
            p.add_argument("--block", action="store_true", help="print only the block's text")

    p = _command(sub, "item", _item, "one fact, pending item or evidence (retired ones too)")
    p.add_argument("session")
    p.add_argument("kind", choices=("fact", "pending", "evidence"))
    p.add_argument("id")

    p = _command(sub, "changes", _changes, "apply a JSON list of changes, all or nothing")
    p.add_argument("session")
    p.add_argument("file", help='a JSON file: {"changes": [...]} or a bare list; - for stdin')

    p = _command(sub, "add-fact", _add_fact, "create a fact")
    p.add_argument("session")
    p.add_argument("--id", required=True)
    p.add_argument("--content", required=True)
    p.add_argument(
        "--source", required=True, help="source pointer, e.g. transcript:<session>:<seq>"
    )
    p.add_argument("--confirmed-at", help="ISO 8601 with an offset (default: now)")

    p = _command(sub, "update-fact", _update_fact, "change some fields of a fact")
    p.add_argument("session")
    p.add_argument("id")
    p.add_argument("--content")
    p.add_argument("--source")
    p.add_argument("--confirmed-at", help="ISO 8601 with an offset")

    p = _command(sub, "add-pending", _add_pending, "create a pending item")
    p.add_argument("session")
    p.add_argument("--id", required=True)
    p.add_argument("--content", required=True)
    p.add_argument("--status", choices=("open", "blocked"), default="open")
    p.add_argument("--source", required=True)
    p.add_argument("--confirmed-at", help="ISO 8601 with an offset (default: now)")

    p = _command(
        sub,
        "set-pending-status",
        _set_pending_status,
        "move a pending item between open and blocked, or to done (final; needs --source)",
    )
    p.add_argument("session")
    p.add_argument("id")
    p.add_argument("status", choices=("open", "blocked", "done"))
    p.add_argument("--source", help="the pointer that confirms the new status")
    p.add_argument("--confirmed-at", help="ISO 8601 with an offset (default: now)")

    p = _command(sub, "add-evidence", _add_evidence, "record one retrieval result as evidence")
    p.add_argument("session")
    p.add_argument("--id", required=True, help="the memory id")
    p.add_argument("--title", required=True)
    p.add_argument("--source", required=True)
    p.add_argument("--captured-at", required=True, help="ISO 8601 with an offset")
    p.add_argument("--score", type=float, required=True, help="0..1, as the selection gave it")
    p.add_argument("--rank", type=int, required=True, help="1 = first")
    p.add_argument("--conflict-key", help="the conflict this memory won, if any")
    p.add_argument("--confirmed-at", help="ISO 8601 with an offset (default: now)")

    p = _command(sub, "retire", _retire, "retire an item (its id stays taken)")
    p.add_argument("session")
    p.add_argument("kind", choices=("fact", "pending", "evidence"))
    p.add_argument("id")
    p.add_argument("--source", required=True, help="the pointer that shows it no longer holds")
    p.add_argument("--retired-at", help="ISO 8601 with an offset (default: now)")

    p = _command(sub, "transcript", _transcript, "recorded transcript events, one page")
    p.add_argument("session")
    p.add_argument("--after", type=int, default=0, help="events after this seq (default: 0)")
    p.add_argument("--limit", type=int, default=100, help="at most this many (1-1000)")

    p = _command(sub, "manifest", _manifest, "a compaction manifest, by its x-compaction-id")
    p.add_argument("compaction_id")

    p = _command(
        sub,
        "usage",
        _usage,
        "requests, tokens before/after, cost, savings and cache figures over a time range (a"
        " table; --json: the raw figures), and the most recent sessions",
    )
    p.add_argument("--tenant", help="check that the admin token is this tenant's")
    p.add_argument("--session", help="one session only")
    p.add_argument("--model", help="one model only")
    p.add_argument("--since", help=f"from ({usage_table.WHEN_HELP}; default: 24h)")
    p.add_argument("--until", help="to, excluded (the same forms; default: now)")
    p.add_argument(
        "--sessions", type=int, default=10, metavar="N",
        help="list the N most recent sessions (default 10; 0: none)",
    )
    p.add_argument("--json", action="store_true", help="the admin API's figures as they are")


def run(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> int:
    """Run the parsed ``admin`` command; the exit status."""
    env = os.environ if environ is None else environ
    try:
        token = _token_from_file(args.token_file) if args.token_file else env.get(args.token_env, "")
        if not token:
            raise UsageError(
                f"set ${args.token_env} to an admin token (see --token-env, --token-file)"
            )
        client = AdminClient(args.url or env.get(URL_ENV) or DEFAULT_URL, token, args.timeout)
        answer = args.admin_func(client, args)
    except UsageError as exc:
        print(f"context-proxy admin: {exc}", file=sys.stderr)
        return 2
    except ApiError as exc:
        print(json.dumps(exc.body, indent=2, ensure_ascii=False), file=sys.stderr)
        return 1
    if isinstance(answer, _Text):
        print(answer)
    else:
        print(json.dumps(answer, indent=2, ensure_ascii=False))
    return 0
