"""Runs the fake upstream and the proxy on a background event loop, so that tests can drive them
with the official SDK's sync and async clients alike.

Both servers are real: aiohttp on 127.0.0.1, port 0.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import pty
import re
import subprocess
import sys
import threading
import time
from collections.abc import Coroutine
from concurrent.futures import Future
from typing import Any, TypeVar

import httpx2 as httpx
from aiohttp import web

from proxy.config.settings import Config, parse_config
from proxy.server.app import build_app
from proxy.server.http.runner import make_runner

T = TypeVar("T")


class LoopThread:
    """An event loop in a daemon thread; ``run`` executes a coroutine on it and waits."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="servers", daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 30) -> T:
        future: Future[T] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return future.result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)
        self.loop.close()


class ProxyServer:
    """The proxy app on its own AppRunner, exactly as ``serve`` builds it."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.app: web.Application = build_app(config)
        self.runner = make_runner(self.app, config, access_log=False)
        self.url = ""

    async def start(self) -> str:
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}"
        return self.url

    async def stop(self) -> None:
        await self.runner.cleanup()


def proxy_config(upstream_url: str, state_dir: str, **sections: Any) -> Config:
    data: dict[str, Any] = {"upstream": {"base_url": upstream_url}, "state_dir": state_dir}
    for key, value in sections.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    return parse_config(data, "<test>")


def replace(config: Config, **changes: Any) -> Config:
    return dataclasses.replace(config, **changes)


class ListeningProcess:
    """``python -m proxy <args>`` as a child process, its address read from its
    "listening on http://..." log line; every stderr line is kept in ``lines``."""

    def __init__(self, args: list[str], env: dict[str, str] | None = None, what: str = "proxy") -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "proxy", *args],
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
            env={**os.environ, **(env or {})},
        )
        self.lines: list[str] = []
        self.url = ""
        ready = threading.Event()

        def pump() -> None:
            assert self.proc.stderr is not None
            for line in self.proc.stderr:
                self.lines.append(line)
                match = re.search(r"listening on (http://[\d.]+:\d+)", line)
                if match:
                    self.url = match.group(1)
                    ready.set()

        self._pump = threading.Thread(target=pump, daemon=True)
        self._pump.start()
        if not ready.wait(20):
            self.proc.kill()
            raise AssertionError(f"{what} did not start:\n" + "".join(self.lines))

    def stop(self, *, graceful: bool = False) -> int:
        """Kill (or, ``graceful``, SIGTERM first) and reap; returns the exit code."""
        if self.proc.poll() is None:
            (self.proc.terminate if graceful else self.proc.kill)()
        try:
            code = self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait(10)
        self._pump.join(5)
        if self.proc.stderr is not None:
            self.proc.stderr.close()
        return code


class OnTerminal:
    """``python -m proxy serve <args>`` with its stderr on a pty (a real terminal, as a person
    starts it: the one-time console link is printed there); ``text`` is everything it wrote,
    ``url`` the client listener's address. The environment is this one's without the variables
    named in ``drop``, plus ``env``."""

    def __init__(
        self, args: list[str], env: dict[str, str] | None = None, drop: tuple[str, ...] = ()
    ) -> None:
        master, slave = pty.openpty()
        clean = {k: v for k, v in os.environ.items() if k not in drop}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "proxy", "serve", *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=slave,
            env={**clean, **(env or {})},
        )
        os.close(slave)
        self._master = master
        self.text = ""
        self._lock = threading.Lock()
        self._pump = threading.Thread(target=self._read, daemon=True)
        self._pump.start()
        self.url = self.wait_for(r"listening on (http://[\d.]+:\d+)").group(1)

    def _read(self) -> None:
        while True:
            try:
                chunk = os.read(self._master, 65536)
            except OSError:
                return
            if not chunk:
                return
            with self._lock:
                self.text += chunk.decode("utf-8", "replace")

    def wait_for(self, pattern: str, timeout: float = 20) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                match = re.search(pattern, self.text)
            if match:
                return match
            time.sleep(0.02)
        raise AssertionError(f"{pattern!r} not in:\n{self.text}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self._pump.join(5)
        os.close(self._master)


async def serve_local(app: web.Application) -> tuple[web.AppRunner, str]:
    """``app`` served on 127.0.0.1, a port the system picks: its runner and base URL."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"


def cache_figures(url: str) -> dict[str, dict[str, float]]:
    """Per cache, from the proxy's ``/metrics`` as an operator reads them: ``entries``,
    ``max_entries``, ``weight_bytes``, ``max_weight_bytes``, ``bound_bytes``, ``evictions``,
    ``expired``."""
    out: dict[str, dict[str, float]] = {}
    for line in httpx.get(url + "/metrics").text.splitlines():
        m = re.fullmatch(r'context_proxy_cache_(\w+)\{cache="(\w+)"\} (\S+)', line)
        if m:
            out.setdefault(m[2], {})[m[1].removesuffix("_total")] = float(m[3])
    return out
