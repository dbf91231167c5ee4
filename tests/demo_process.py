"""``context-proxy serve --demo`` as a child process, read as a person reads it: the banner it
prints on stdout (the proxy's address, the one-time console link, the admin token's file, what
to run next). Used by the quick-start test, the console's session-page test and
``docs/screenshots.py``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# the variables a newcomer's shell does not have (a fresh install: nothing set up)
SCRUBBED = ("CONTEXT_PROXY_", "ANTHROPIC_")


def clean_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(SCRUBBED)}
    return {**env, **(extra or {})}


@dataclass
class Banner:
    url: str
    console_link: str
    token_file: str
    next_commands: list[str] = field(default_factory=list)


class DemoServe:
    """``argv`` (a ``serve --demo`` command) in ``cwd``; ``banner`` once it listens."""

    def __init__(self, argv: list[str], cwd: Path, env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(
            argv,
            cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
            text=True, env=env or clean_env(),
        )
        self.out: list[str] = []
        self.err: list[str] = []
        self._done = threading.Event()
        self._pumps = [
            threading.Thread(target=self._pump, args=(self.proc.stdout, self.out, True), daemon=True),
            threading.Thread(target=self._pump, args=(self.proc.stderr, self.err, False), daemon=True),
        ]
        for pump in self._pumps:
            pump.start()

    def _pump(self, stream: object, into: list[str], stdout: bool) -> None:
        for line in stream:  # type: ignore[attr-defined]
            into.append(line)
            if stdout and line.startswith("Ctrl-C stops the demo"):
                self._done.set()

    def banner(self, timeout: float = 60) -> Banner:
        deadline = time.monotonic() + timeout
        while not self._done.wait(0.1):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(
                    "serve --demo did not start:\n" + "".join(self.out) + "".join(self.err)
                )
        text = "".join(self.out)
        url = re.search(r"^  proxy +(http://\S+)", text, re.M)
        link = re.search(r"^  console +(http://\S+/console/signin#token=\S+)", text, re.M)
        token = re.search(r"^  admin token +(\S+)", text, re.M)
        assert url and link and token, text
        after = text.split("Next, in another terminal (same folder):\n", 1)[1]
        commands = [line.strip() for line in after.split("\n\n", 1)[0].splitlines() if line.strip()]
        return Banner(url.group(1), link.group(1), token.group(1), commands)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            code = self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait(10)
        for pump in self._pumps:
            pump.join(5)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()
        return code


def run_agent(
    python: str, cwd: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """``python examples/demo_agent_loop.py [args]`` (the repository's, from ``cwd``)."""
    script = cwd / "examples" / "demo_agent_loop.py"
    if not script.exists():
        script = ROOT / "examples" / "demo_agent_loop.py"
    return subprocess.run(
        [python, str(script), *args], cwd=cwd, capture_output=True, text=True,
        timeout=timeout, env=env or clean_env(),
    )


SAVINGS_LINE = re.compile(
    r"^Saved (?P<tokens>[\d,]+) tokens \((?P<share>[\d.]+)% of input\) and \$(?P<usd>[\d,.]+)"
    r" over (?P<requests>\d+) requests; (?P<compactions>\d+) compactions\.$",
    re.M,
)


def serve_demo(*args: str) -> list[str]:
    """``serve --demo`` with this interpreter (the package as installed for the tests)."""
    return [sys.executable, "-m", "proxy", "serve", "--demo", *args]
