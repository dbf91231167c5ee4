"""The peers for bench/bench_proxy.py: LiteLLM's proxy and Headroom's proxy, each in its own venv.

```
python bench/peers.py install litellm headroom   # once: a venv per peer under the cache dir (pip, PyPI)
python bench/peers.py check                      # each installed peer end to end, then 200 JSON + 200 SSE timed
```

The cache dir is ``~/.cache/context-proxy-bench/peers/<name>-<version>/`` (``CONTEXT_PROXY_BENCH_PEERS``
overrides the parent). Nothing here installs implicitly: :func:`start_peer` raises
:class:`PeerUnavailable` ("not installed: run python bench/peers.py install litellm") instead.

Each peer is started the way a user pointing it at the Anthropic API would, in its fastest sensible
production setting, with nothing that calls out of the machine (there is no internet on the bench
boxes, and a call that waits for DNS would be measured). bench/README.md ("Peers") says what each
is configured to do and why; :data:`PEERS` below is the same in code.

Used by bench/bench_proxy.py (``--peers litellm,headroom``) through :func:`start_peer`, :class:`Peer`
and :data:`PEER_NAMES` only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

PEER_NAMES = ("litellm", "headroom")
ENV_ROOT = "CONTEXT_PROXY_BENCH_PEERS"
INSTALLED_MARKER = ".context-proxy-bench-installed"  # written last by `install`: a half-made venv is absent
READY_TIMEOUT = 180.0  # seconds; LiteLLM takes ~10 s to import on a quiet box, much more on a busy one
# The key the peers use upstream (the fake upstream accepts any). A client's own key is never used for it.
PEER_UPSTREAM_KEY = "sk-ant-bench-peer-not-a-real-key"
CLK_TCK = os.sysconf("SC_CLK_TCK")

# Inherited variables that would change what a peer does or hand it a real credential.
_DROPPED_ENV_PREFIXES = ("ANTHROPIC_", "OPENAI_", "LITELLM_", "HEADROOM_", "PYTHON", "VIRTUAL_ENV")
# Every peer: no telemetry, no model / tokenizer / price-list download, loopback never via a proxy.
_COMMON_ENV = {
    "DO_NOT_TRACK": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # LiteLLM (also inside Headroom): no price-list download
    "NO_PROXY": "127.0.0.1,localhost",
    "no_proxy": "127.0.0.1,localhost",
    "PYTHONUNBUFFERED": "1",
}


class PeerUnavailable(Exception):
    """A peer cannot be used; ``str(exc)`` says why (not installed, failed to start, ...)."""


@dataclass(frozen=True)
class PeerSpec:
    name: str
    requirement: str  # what `install` hands pip
    version: str
    command: str  # the console script in the venv's bin/
    ready_path: str  # GET -> 200 once it serves traffic
    # (venv, upstream_url, port, workdir) -> (argv, extra environment)
    launch: Callable[[Path, str, int, Path], tuple[list[str], dict[str, str]]] = field(repr=False)

    def venv(self) -> Path:
        return peers_root() / f"{self.name}-{self.version}"


def peers_root() -> Path:
    """Where the peers' venvs live: ``$CONTEXT_PROXY_BENCH_PEERS`` or ~/.cache/context-proxy-bench/peers."""
    configured = os.environ.get(ENV_ROOT, "")
    return Path(configured).expanduser() if configured else Path.home() / ".cache/context-proxy-bench/peers"


def _site_packages(venv: Path) -> Path:
    found = sorted(venv.glob("lib/python3*/site-packages"))
    return found[0] if found else venv / "lib" / "site-packages"


def _litellm_launch(venv: Path, upstream_url: str, port: int, workdir: Path) -> tuple[list[str], dict[str, str]]:
    """LiteLLM's proxy (`litellm --config`), as its docs set it up for the Anthropic SDK / Claude Code:
    the unified `/v1/messages` endpoint, every `claude-*` model routed to `anthropic/<model>` at the
    upstream, the provider key from the environment. One worker (the default), LITELLM_LOG=ERROR
    (its production advice), no database (so no spend logs). No master key: the bench sends a new
    x-api-key for its cold rows, and a master key would add a check per request that only slows it."""
    config = {
        "model_list": [
            {
                "model_name": "claude-*",
                "litellm_params": {
                    "model": "anthropic/claude-*",
                    "api_base": upstream_url,
                    "api_key": "os.environ/ANTHROPIC_API_KEY",
                },
            }
        ],
        "litellm_settings": {"set_verbose": False, "telemetry": False},
        "general_settings": {"dangerously_permit_weak_or_unset_master_key": True},
    }
    config_path = workdir / "litellm.yaml"
    config_path.write_text(json.dumps(config, indent=2) + "\n")  # JSON is YAML
    argv = [str(venv / "bin" / "litellm"), "--config", str(config_path),
            "--host", "127.0.0.1", "--port", str(port), "--num_workers", "1"]
    return argv, {"ANTHROPIC_API_KEY": PEER_UPSTREAM_KEY, "LITELLM_LOG": "ERROR"}


def _headroom_launch(venv: Path, upstream_url: str, port: int, workdir: Path) -> tuple[list[str], dict[str, str]]:
    """Headroom's proxy (`headroom proxy`) with its default optimisation (mode `cache`, ContentRouter,
    SmartCrusher, CCR, Magika), `/v1/messages` forwarded to the upstream (`--anthropic-api-url`).
    Changed from its defaults, and why: `HEADROOM_OFFLINE=1` (its air-gap switch: no beacon, update
    check or subscription poll); `--disable-kompress` (Kompress is an ML model fetched from the
    Hugging Face hub at run time, which cannot be fetched here; the structural compressors stay on);
    `--no-rate-limit` (the default 60 requests/minute would stop the bench); `--no-cache` (its
    response cache answers a repeated identical request without the upstream: a forwarding bench
    re-sends identical bodies). tiktoken's `o200k_base`, which Headroom counts Claude tokens with,
    comes from the copy LiteLLM (a Headroom dependency) ships, as if tiktoken had downloaded it once."""
    tokenizers = _site_packages(venv) / "litellm" / "litellm_core_utils" / "tokenizers"
    argv = [str(venv / "bin" / "headroom"), "proxy", "--host", "127.0.0.1", "--port", str(port),
            "--anthropic-api-url", upstream_url, "--no-rate-limit", "--no-cache", "--disable-kompress"]
    return argv, {"HEADROOM_OFFLINE": "1", "TIKTOKEN_CACHE_DIR": str(tokenizers)}


PEERS: dict[str, PeerSpec] = {
    "litellm": PeerSpec("litellm", "litellm[proxy]==1.106.12", "1.106.12", "litellm",
                        "/health/liveliness", _litellm_launch),
    "headroom": PeerSpec("headroom", "headroom-ai[proxy]==0.42.0", "0.42.0", "headroom",
                         "/readyz", _headroom_launch),
}


# --- a running peer ----------------------------------------------------------------------------


def _proc_stat(pid: int) -> list[bytes] | None:
    """The fields of /proc/<pid>/stat after the command name (field 3 on), or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    return stat[stat.rindex(b")") + 2 :].split()


def process_tree(root: int) -> list[int]:
    """``root`` and every live descendant (from the parent pids in /proc/*/stat)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _proc_stat(int(entry))
            if fields is not None:
                children.setdefault(int(fields[1]), []).append(int(entry))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(children.get(pid, ()))
    return tree


def tree_cpu_seconds(root: int) -> float:
    """utime+stime of ``root``'s live process tree, plus the cutime+cstime of each member (the
    workers it has already reaped). A live process is in no one's cutime, so nothing counts twice."""
    ticks = 0
    for pid in process_tree(root):
        fields = _proc_stat(pid)
        if fields is not None:  # fields 14-17 of stat(5): utime stime cutime cstime
            ticks += int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])
    return ticks / CLK_TCK


@dataclass
class Peer:
    name: str
    url: str
    proc: subprocess.Popen[bytes]
    log_path: Path

    def stop(self) -> None:
        """SIGTERM to the peer's process group (it is a session leader: its workers are in it), wait,
        then SIGKILL whatever is left of the group."""
        pgid = self.proc.pid
        if self.proc.poll() is None:
            _signal_group(pgid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                _signal_group(pgid, signal.SIGKILL)
                self.proc.wait(10)
        _signal_group(pgid, signal.SIGKILL)  # workers that outlived their parent

    def cpu_seconds(self) -> float:
        """utime+stime of the peer's process tree (peers may fork workers), from /proc."""
        return tree_cpu_seconds(self.proc.pid)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False


def _log_tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:]) or "(empty log)"


def installed(name: str) -> bool:
    spec = PEERS[name]
    venv = spec.venv()
    return (venv / INSTALLED_MARKER).is_file() and (venv / "bin" / spec.command).is_file()


def _child_env(extra: dict[str, str], home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(_DROPPED_ENV_PREFIXES)}
    env.update(_COMMON_ENV)
    env["HOME"] = str(home)  # a fresh user: no ~/.headroom or LiteLLM state from earlier runs
    env.update(extra)
    return env


def start_peer(name: str, upstream_url: str, tmp: Path, *, ready_timeout: float = READY_TIMEOUT) -> Peer:
    """Start peer ``name`` on a free loopback port, forwarding Anthropic Messages requests
    (``POST {url}/v1/messages``) to ``upstream_url``; return once it serves. Its output goes to
    ``tmp/<name>.log``. Raises :class:`PeerUnavailable` (never installs anything)."""
    spec = PEERS.get(name)
    if spec is None:
        raise PeerUnavailable(f"unknown peer {name!r} (known: {', '.join(PEER_NAMES)})")
    if not installed(name):
        raise PeerUnavailable(f"not installed: run python bench/peers.py install {name} (looked in {spec.venv()})")
    tmp.mkdir(parents=True, exist_ok=True)
    home = tmp / f"{name}-home"
    home.mkdir(exist_ok=True)
    port = free_port()
    argv, extra_env = spec.launch(spec.venv(), upstream_url.rstrip("/"), port, tmp)
    log_path = tmp / f"{name}.log"
    with open(log_path, "wb") as log:
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    cwd=tmp, env=_child_env(extra_env, home), start_new_session=True)
        except OSError as exc:
            raise PeerUnavailable(f"{name} failed to start: {exc}") from exc
    peer = Peer(name, f"http://127.0.0.1:{port}", proc, log_path)
    deadline = time.monotonic() + ready_timeout
    while not _get_ok(peer.url + spec.ready_path):
        if proc.poll() is not None:
            raise PeerUnavailable(f"{name} exited with code {proc.returncode} during start-up; "
                                  f"end of {log_path}:\n{_log_tail(log_path)}")
        if time.monotonic() > deadline:
            peer.stop()
            raise PeerUnavailable(f"{name} did not answer GET {spec.ready_path} within {ready_timeout:.0f} s; "
                                  f"end of {log_path}:\n{_log_tail(log_path)}")
        time.sleep(0.2)
    return peer


# --- install -----------------------------------------------------------------------------------


def install(name: str, *, force: bool = False) -> Path:
    """Create the peer's venv under the cache dir and pip-install it there (from PyPI)."""
    spec = PEERS[name]
    venv = spec.venv()
    if installed(name) and not force:
        print(f"{name}: already installed in {venv}")
        return venv
    marker = venv / INSTALLED_MARKER
    marker.unlink(missing_ok=True)
    print(f"{name}: creating {venv} and installing {spec.requirement} (a few minutes)", flush=True)
    venv.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", spec.requirement], check=True)
    frozen = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "freeze"],
                            check=True, capture_output=True, text=True).stdout
    marker.write_text(f"{spec.requirement}\n\n{frozen}")
    print(f"{name}: installed ({venv})")
    return venv


# --- check: each peer end to end, then a rough latency figure ----------------------------------


def _one_kb_body(stream: bool) -> bytes:
    body = {
        "model": "claude-sonnet-4-5",
        "max_tokens": 256,
        "system": "You are a careful assistant. " * 4,
        "messages": [
            {"role": "user", "content": "Summarise the file below in one sentence.\n" + "lorem ipsum " * 60},
        ],
        "stream": stream,
    }
    return json.dumps(body, separators=(",", ":")).encode()


def _pct(xs: list[float], q: float) -> float:
    ordered = sorted(xs)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _check(names: Sequence[str], n: int) -> int:
    import tempfile

    import anthropic

    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from tests.upstream import FakeUpstream

    client_key = "sk-ant-bench-client-not-a-real-key"
    failures = 0
    upstream = FakeUpstream()
    await upstream.start()
    print(f"fake upstream {upstream.url}")
    try:
        with tempfile.TemporaryDirectory(prefix="bench-peers-") as tmp_name:
            for name in names:
                print(f"\n== {name} ({PEERS[name].requirement}, {PEERS[name].venv()})")
                try:
                    peer = await asyncio.to_thread(start_peer, name, upstream.url, Path(tmp_name) / name)
                except PeerUnavailable as exc:
                    print(f"   unavailable: {exc}")
                    failures += 1
                    continue
                try:
                    print(f"   listening on {peer.url} (pid {peer.proc.pid})")
                    seen = len(upstream.requests)
                    async with anthropic.AsyncAnthropic(base_url=peer.url, api_key=client_key, max_retries=0) as sdk:
                        msg = await sdk.messages.create(
                            model="claude-sonnet-4-5", max_tokens=64,
                            messages=[{"role": "user", "content": "Say hello (é, 漢字)."}])
                        print(f"   JSON: {msg.id} stop_reason={msg.stop_reason} text={_text(msg)!r}")
                        events = 0
                        async with sdk.messages.stream(
                            model="claude-sonnet-4-5", max_tokens=64,
                            messages=[{"role": "user", "content": "Stream hello."}]) as stream:
                            async for _event in stream:
                                events += 1
                            final = await stream.get_final_message()
                        print(f"   SSE: {events} events, stop_reason={final.stop_reason} "
                              f"text={_text(final)!r}")
                    for rec in upstream.requests[seen:]:
                        shown = {k: v for k, v in rec.headers.items()
                                 if k.lower() in ("anthropic-version", "content-type", "user-agent", "anthropic-beta")}
                        print(f"   upstream got {rec.method} {rec.raw_path} {len(rec.body)} B, {_whose_key(rec.headers, client_key)}, "
                              f"body keys {sorted(rec.json())}, {shown}")
                    await _measure(peer, upstream.url, n)
                except Exception as exc:  # report and go on to the next peer
                    print(f"   FAILED: {type(exc).__name__}: {exc}\n   end of {peer.log_path}:\n{_log_tail(peer.log_path)}")
                    failures += 1
                finally:
                    peer.stop()
    finally:
        await upstream.stop()
    return 1 if failures else 0


def _text(message: Any) -> str:
    return "".join(block.text for block in message.content if block.type == "text")


def _whose_key(headers: Mapping[str, str], client_key: str) -> str:
    """Which credential reached the upstream, without printing it."""
    for header in ("x-api-key", "authorization"):
        value = headers.get(header, "")
        if value:
            key = value.removeprefix("Bearer ")
            who = ("the client's" if key == client_key else
                   "the peer's configured" if key == PEER_UPSTREAM_KEY else "some other")
            return f"{who} key in {header}"
    return "no key"


async def _measure(peer: Peer, direct: str, n: int) -> None:
    """For a 1 KB JSON request and the same request with ``"stream": true`` (read to the last
    byte): p50 of ``n`` sequential requests via the peer and direct, interleaved (the order
    alternating), after a short warm-up; the peer's CPU per request from /proc."""
    import aiohttp

    headers = {"x-api-key": "sk-ant-bench-client-not-a-real-key", "anthropic-version": "2023-06-01",
               "content-type": "application/json"}
    async with aiohttp.ClientSession() as session:
        for kind, body in (("JSON", _one_kb_body(stream=False)), ("SSE", _one_kb_body(stream=True))):

            async def once(url: str, body: bytes = body, kind: str = kind) -> float:
                started = time.perf_counter()
                async with session.post(url + "/v1/messages", data=body, headers=headers) as answer:
                    payload = await answer.read()
                    if answer.status != 200 or (kind == "SSE" and b"event: message_stop" not in payload):
                        raise RuntimeError(f"{url}: HTTP {answer.status}, {payload[:200]!r}")
                return time.perf_counter() - started

            times: dict[str, list[float]] = {"direct": [], "peer": []}
            for _ in range(20):
                await once(direct)
                await once(peer.url)
            cpu_before = peer.cpu_seconds()
            for i in range(n):
                order = (("direct", direct), ("peer", peer.url)) if i % 2 else (("peer", peer.url), ("direct", direct))
                for label, url in order:
                    times[label].append(await once(url))
            cpu = peer.cpu_seconds() - cpu_before
            added = {q: (_pct(times["peer"], q) - _pct(times["direct"], q)) * 1e3 for q in (0.5, 0.99)}
            print(f"   {n} x 1 KB {kind}, sequential: direct p50 {_pct(times['direct'], 0.5) * 1e3:.2f} ms, "
                  f"via {peer.name} p50 {_pct(times['peer'], 0.5) * 1e3:.2f} ms: added p50 +{added[0.5]:.2f} ms, "
                  f"p99 +{added[0.99]:.2f} ms; {peer.name} CPU {cpu / n * 1e3:.2f} ms per request; "
                  f"load average {os.getloadavg()[0]:.1f}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    sub = parser.add_subparsers(dest="command", required=True)
    p_install = sub.add_parser("install", help="create each peer's venv under the cache dir (pip, PyPI)")
    p_install.add_argument("names", nargs="+", choices=PEER_NAMES)
    p_install.add_argument("--force", action="store_true", help="reinstall even if installed")
    p_check = sub.add_parser("check", help="start each installed peer against a fake upstream, send one "
                             "JSON and one SSE request with the anthropic SDK, then time N of each")
    p_check.add_argument("names", nargs="*", help=f"default: every installed one of {', '.join(PEER_NAMES)}")
    p_check.add_argument("--n", type=int, default=200, help="timed requests per target (default 200)")
    sub.add_parser("status", help="where the peers are and whether they are installed")
    args = parser.parse_args(argv)
    if args.command == "install":
        for name in args.names:
            try:
                install(name, force=args.force)
            except (subprocess.CalledProcessError, OSError) as exc:
                print(f"{name}: install failed ({exc}); {PEERS[name].venv()} stays not installed", file=sys.stderr)
                return 1
        return 0
    if args.command == "status":
        for name in PEER_NAMES:
            state = "installed" if installed(name) else "not installed"
            print(f"{name:9} {PEERS[name].requirement:28} {state:14} {PEERS[name].venv()}")
        return 0
    unknown = sorted(set(args.names) - set(PEER_NAMES))
    if unknown:
        parser.error(f"unknown peer(s) {unknown}; known: {', '.join(PEER_NAMES)}")
    names = args.names or [name for name in PEER_NAMES if installed(name)]
    if not names:
        print("no peer installed: python bench/peers.py install litellm headroom")
        return 1
    return asyncio.run(_check(names, args.n))


if __name__ == "__main__":
    sys.exit(main())
