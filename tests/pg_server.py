"""PostgreSQL for the tests: a fresh schema per test on the server that ``.ci/pg start`` started.

``CONTEXT_PROXY_TEST_PG`` (exported by ``.ci/pg.env``) names that server's test database. Nothing
here starts or assumes a server: without the variable, :func:`fresh_schema` skips the test.

Each test gets its own schema (``CREATE SCHEMA test_<random>``) and a URL whose ``search_path``
query parameter points at it (asyncpg passes unknown query parameters to the server as settings),
so the store creates its tables there; the schema is dropped, with everything in it, afterwards.
A schema is much cheaper than a database (``CREATE DATABASE`` copies a template and checkpoints).

:class:`PrivateServer` is for the tests that crash the server itself: their own throwaway
cluster, made with the PostgreSQL programs ``.ci/pg`` found or installed (skipped, like every
PostgreSQL test, without ``CONTEXT_PROXY_TEST_PG``).
"""

from __future__ import annotations

import asyncio
import os
import pwd
import secrets
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import asyncpg
import pytest

__all__ = [
    "PG_ENV",
    "SKIP_REASON",
    "PrivateServer",
    "fresh_schema",
    "index_problems",
    "server_url",
]

T = TypeVar("T")

PG_ENV = "CONTEXT_PROXY_TEST_PG"
SKIP_REASON = (
    f"PostgreSQL tests need {PG_ENV}: start a throwaway server with "
    "`bash .ci/pg start && . .ci/pg.env` (and `bash .ci/pg stop` after)"
)
ADMIN_LOCK_TIMEOUT = "10s"


def server_url() -> str | None:
    return os.environ.get(PG_ENV) or None


def with_search_path(url: str, schema: str) -> str:
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query) if k != "search_path"]
    query.append(("search_path", schema))
    return urlunsplit(parts._replace(query=urlencode(query)))


def _run(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to completion in its own loop and thread (callers may be inside a loop)."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coro).result()


async def _execute(url: str, *statements: str) -> None:
    conn = await asyncpg.connect(url, server_settings={"lock_timeout": ADMIN_LOCK_TIMEOUT})
    try:
        for statement in statements:
            await conn.execute(statement)
    finally:
        await conn.close()


@contextmanager
def fresh_schema(prefix: str = "test") -> Iterator[str]:
    """The URL of a new, empty schema on the test server; dropped on exit. Skips without one."""
    base = server_url()
    if base is None:
        pytest.skip(SKIP_REASON)
    schema = f"{prefix}_{secrets.token_hex(6)}"
    _run(_execute(base, f'CREATE SCHEMA "{schema}"'))
    try:
        yield with_search_path(base, schema)
    finally:
        _run(_execute(base, f'DROP SCHEMA "{schema}" CASCADE'))


async def _index_problems(url: str) -> list[str]:
    conn = await asyncpg.connect(url)
    try:
        await conn.execute("CREATE EXTENSION IF NOT EXISTS amcheck SCHEMA public")
        tables = await conn.fetch(
            "SELECT c.oid, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = current_schema() AND c.relkind = 'r' ORDER BY c.relname"
        )
        problems: list[str] = []
        for table in tables:
            for row in await conn.fetch(
                "SELECT * FROM public.verify_heapam($1::oid::regclass)", table["oid"]
            ):
                problems.append(f"{table['relname']}: {row['msg']}")
        indexes = await conn.fetch(
            "SELECT c.oid, c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
            " JOIN pg_namespace n ON n.oid = c.relnamespace JOIN pg_am am ON am.oid = c.relam"
            " WHERE n.nspname = current_schema() AND am.amname = 'btree' ORDER BY c.relname"
        )
        for index in indexes:
            try:  # heapallindexed: every heap tuple is in the index too
                await conn.execute(
                    "SELECT public.bt_index_check($1::oid::regclass, true)", index["oid"]
                )
            except asyncpg.PostgresError as exc:
                problems.append(f"{index['relname']}: {exc}")
        return problems
    finally:
        await conn.close()


def index_problems(url: str) -> list[str]:
    """amcheck's findings on every table and B-tree index of the URL's schema (``[]`` = ok)."""
    return _run(_index_problems(url))


# -- a private server, for crashing it -----------------------------------------------------------


def postgres_bindir() -> Path | None:
    """The folder of initdb and pg_ctl, as ``.ci/pg`` finds it; ``None`` without PostgreSQL."""
    found = shutil.which("initdb")
    candidates = [Path(found).resolve().parent] if found else []
    candidates += sorted(
        Path("/usr/lib/postgresql").glob("*/bin"),
        key=lambda p: [int(x) if x.isdigit() else 0 for x in p.parent.name.split(".")],
        reverse=True,
    )
    for folder in candidates:
        if (folder / "initdb").is_file() and (folder / "pg_ctl").is_file():
            return folder
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PrivateServer:
    """A throwaway cluster on 127.0.0.1 that a test may crash (``pg_ctl stop -m immediate``).

    As root it belongs to the ``postgres`` system user (PostgreSQL refuses to run as root). It
    keeps ``fsync`` on: the durable configuration under test.
    """

    def __init__(self, password: str | None = None) -> None:
        """``password``: TCP connections must give it (SCRAM), as on a real server; without,
        every connection is trusted."""
        if server_url() is None:  # PostgreSQL tests are opted into with .ci/pg, these too
            pytest.skip(SKIP_REASON)
        bindir = postgres_bindir()
        if bindir is None:
            pytest.skip("no PostgreSQL programs: `bash .ci/pg start` installs them")
        self._bindir = bindir
        self._owner: pwd.struct_passwd | None = None
        if os.geteuid() == 0:
            try:
                self._owner = pwd.getpwnam("postgres")
            except KeyError:
                pytest.skip("running as root without a postgres system user")
        self.dir = Path(tempfile.mkdtemp(prefix="context-proxy-pg-crash."))
        if self._owner is not None:
            os.chown(self.dir, self._owner.pw_uid, self._owner.pw_gid)
        self.data = self.dir / "data"
        self.port = _free_port()
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        auth = ["-A", "trust"]
        if password is not None:
            pwfile = self.dir / "pwfile"
            pwfile.write_text(password + "\n")
            if self._owner is not None:
                os.chown(pwfile, self._owner.pw_uid, self._owner.pw_gid)
            auth = ["--auth-local=trust", "--auth-host=scram-sha-256", f"--pwfile={pwfile}"]
        self._pg(
            "initdb",
            "-D",
            str(self.data),
            "-U",
            "postgres",
            *auth,
            "-E",
            "UTF8",
            "--locale=C",
            "--no-sync",
        )

    def _pg(self, program: str, *args: str) -> None:
        command = [str(self._bindir / program), *args]
        if self._owner is not None:
            command = ["runuser", "-u", "postgres", "--", *command]
        result = subprocess.run(command, cwd="/", capture_output=True, text=True, timeout=120)
        if result.returncode != 0:
            log = self.dir / "server.log"
            tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
            raise AssertionError(f"{program} {args[-1]} failed:\n{result.stderr}\n{tail}")

    def start(self) -> None:
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -c unix_socket_directories={self.dir}"
            " -c max_connections=50"
        )
        self._pg(
            "pg_ctl",
            "-D",
            str(self.data),
            "-l",
            str(self.dir / "server.log"),
            "-w",
            "-t",
            "60",
            "-o",
            options,
            "start",
        )

    def stop(self) -> None:
        """A clean, fast shutdown (``pg_ctl stop -m fast``): sessions are ended, the server
        says so to every client, and ``start`` brings it back with nothing to recover."""
        self._pg("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "-t", "60", "stop")

    def crash(self) -> None:
        """Every server process quits at once, without a checkpoint: recovery replays the WAL."""
        self._pg("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "-t", "60", "stop")

    def remove(self) -> None:
        if (self.data / "postmaster.pid").exists():
            try:
                self._pg("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
            except AssertionError:
                pass
        shutil.rmtree(self.dir, ignore_errors=True)
