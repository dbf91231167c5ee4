"""bench/peers.py: starting the benchmark's peers (LiteLLM, Headroom) and failing clearly.

The real peers are only tested where they are installed (``python bench/peers.py install litellm
headroom``; CI does not install them). Everything else runs against a stand-in "peer" installed in a
temporary cache dir: a small aiohttp relay with the peer's command name, started by the real
``start_peer`` exactly as a peer is.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import sys
import time
from pathlib import Path

import anthropic
import orjson
import pytest

from bench import peers
from bench.peers import PEER_NAMES, PEERS, PeerUnavailable, start_peer
from tests.upstream import FakeUpstream

# A stand-in for `headroom proxy ...`: relays POST /v1/messages to --anthropic-api-url, answers
# /readyz, records the environment it was given, and starts a worker that burns 0.3 s of CPU then
# sleeps (a process tree, as a peer with workers has).
FAKE_PEER = r'''#!{python}
import argparse, json, os, subprocess, sys, time
from aiohttp import ClientSession, web

p = argparse.ArgumentParser()
p.add_argument("--port", type=int)
p.add_argument("--anthropic-api-url")
args, _ = p.parse_known_args()
with open("env.json", "w") as f:
    json.dump(dict(os.environ), f)
worker = subprocess.Popen([sys.executable, "-c",
    "import os, time\n"
    "while time.process_time() < 0.3: pass\n"
    "open('worker.pid.tmp', 'w').write(str(os.getpid())); os.rename('worker.pid.tmp', 'worker.pid')\n"
    "time.sleep(600)\n"])

async def relay(request):
    async with request.app["session"].post(args.anthropic_api_url + "/v1/messages", data=await request.read(),
            headers={k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")}) as up:
        return web.Response(status=up.status, body=await up.read(), content_type=up.content_type)

async def ready(request):
    return web.Response(text="ok")

async def session_ctx(app):
    app["session"] = ClientSession()
    yield
    await app["session"].close()

app = web.Application()
app.cleanup_ctx.append(session_ctx)
app.router.add_post("/v1/messages", relay)
app.router.add_get("/readyz", ready)
web.run_app(app, host="127.0.0.1", port=args.port, print=None)
'''


def _install_fake(name: str, script: str) -> Path:
    """A "venv" for peer ``name`` in the cache dir the test points at, as `install` leaves one."""
    spec = PEERS[name]
    venv = spec.venv()
    (venv / "bin").mkdir(parents=True)
    command = venv / "bin" / spec.command
    command.write_text(script.replace("{python}", sys.executable))
    command.chmod(0o755)
    (venv / peers.INSTALLED_MARKER).write_text("fake\n")
    return venv


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "peers-cache"
    root.mkdir()
    monkeypatch.setenv(peers.ENV_ROOT, str(root))
    return root


def _gone(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return True
    return stat[stat.rindex(b")") + 2 :].startswith(b"Z")  # a zombie has ended


# --- unavailable peers: the message says why ---------------------------------------------------


@pytest.mark.parametrize("name", PEER_NAMES)
def test_not_installed_says_how_to_install(name: str, cache_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(PeerUnavailable) as raised:
        start_peer(name, "http://127.0.0.1:9", tmp_path / "run")
    message = str(raised.value)
    assert message.startswith(f"not installed: run python bench/peers.py install {name} ")
    assert str(cache_dir) in message
    assert not (tmp_path / "run").exists()  # nothing was started or written


def test_a_venv_without_the_installed_marker_is_not_installed(cache_dir: Path, tmp_path: Path) -> None:
    venv = _install_fake("litellm", "#!/bin/sh\nexit 0\n")
    (venv / peers.INSTALLED_MARKER).unlink()  # an install that stopped half-way
    with pytest.raises(PeerUnavailable, match=r"^not installed: run python bench/peers\.py install litellm"):
        start_peer("litellm", "http://127.0.0.1:9", tmp_path / "run")


def test_unknown_peer(cache_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(PeerUnavailable, match=r"unknown peer 'vllm' \(known: litellm, headroom\)"):
        start_peer("vllm", "http://127.0.0.1:9", tmp_path / "run")


def test_a_peer_that_exits_during_start_up(cache_dir: Path, tmp_path: Path) -> None:
    _install_fake("litellm", "#!/bin/sh\necho 'config error: no such model list' >&2\nexit 3\n")
    with pytest.raises(PeerUnavailable) as raised:
        start_peer("litellm", "http://127.0.0.1:9", tmp_path / "run")
    assert "litellm exited with code 3 during start-up" in str(raised.value)
    assert "config error: no such model list" in str(raised.value)  # the end of its log


def test_a_peer_that_never_gets_ready_is_stopped(cache_dir: Path, tmp_path: Path) -> None:
    _install_fake("headroom", "#!/bin/sh\necho $$ > pid\nexec sleep 600\n")
    with pytest.raises(PeerUnavailable, match=r"headroom did not answer GET /readyz within 1 s"):
        start_peer("headroom", "http://127.0.0.1:9", tmp_path / "run", ready_timeout=1)
    pid = int((tmp_path / "run" / "pid").read_text())
    assert _gone(pid)


@pytest.mark.timeout(300)  # makes a real venv (ensurepip): ~30 s on a busy box
def test_a_failed_install_leaves_the_peer_not_installed(
    cache_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "no-such-distribution"  # pip fails at once, without asking an index
    monkeypatch.setitem(peers.PEERS, "litellm", dataclasses.replace(PEERS["litellm"], requirement=str(missing)))
    assert peers.main(["install", "litellm"]) == 1
    assert "litellm: install failed" in capsys.readouterr().err
    assert (PEERS["litellm"].venv() / "bin" / "python").exists()  # the venv was made ...
    assert not peers.installed("litellm")  # ... but without the marker it does not count
    with pytest.raises(PeerUnavailable, match=r"^not installed"):
        start_peer("litellm", "http://127.0.0.1:9", tmp_path / "run")


# --- a started peer: forwarding, environment, process tree, stop ------------------------------


async def test_start_peer_forwards_and_stop_ends_the_process_tree(
    cache_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _install_fake("headroom", FAKE_PEER)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-the-users-real-key")  # must not reach a peer
    monkeypatch.setenv("HEADROOM_MODE", "token")  # nor the user's settings
    upstream = FakeUpstream()
    await upstream.start()
    run = tmp_path / "run" / "nested"  # start_peer makes it
    peer = await asyncio.to_thread(start_peer, "headroom", upstream.url + "/", run)
    try:
        assert peer.name == "headroom" and peer.url.startswith("http://127.0.0.1:")
        assert peer.log_path == run / "headroom.log"
        async with anthropic.AsyncAnthropic(base_url=peer.url, api_key="sk-ant-client", max_retries=0) as sdk:
            msg = await sdk.messages.create(
                model="claude-sonnet-4-5", max_tokens=16, messages=[{"role": "user", "content": "hi é"}]
            )
        assert msg.content[0].type == "text" and msg.content[0].text == "Hello from the fake upstream."
        [got] = upstream.requests
        assert (got.method, got.path) == ("POST", "/v1/messages")  # no double slash from the trailing one
        assert got.json()["messages"] == [{"role": "user", "content": "hi é"}]

        env = orjson.loads((run / "env.json").read_bytes())
        assert "ANTHROPIC_API_KEY" not in env and "HEADROOM_MODE" not in env
        assert env["HEADROOM_OFFLINE"] == "1" and env["DO_NOT_TRACK"] == "1" and env["HF_HUB_OFFLINE"] == "1"
        assert env["HOME"] == str(run / "headroom-home")

        worker, own = await asyncio.to_thread(_worker_and_own_cpu, run, peer.proc.pid)
        assert worker in peers.process_tree(peer.proc.pid)
        # the worker's 0.3 s of CPU is counted (two readings in 10 ms clock ticks, taken apart:
        # not to the tick; without the worker's share the difference is ~0)
        assert peer.cpu_seconds() - own >= 0.25
    finally:
        peer.stop()
        await upstream.stop()
    assert peer.proc.returncode is not None
    ended = await asyncio.to_thread(_ends, worker)  # killed with the group (then reaped by init)
    if not ended:
        os.kill(worker, signal.SIGKILL)  # leave nothing behind when the test fails
    assert ended


def _worker_and_own_cpu(run: Path, pid: int) -> tuple[int, float]:
    """The stand-in's worker pid, once it has burnt its 0.3 s of CPU; the stand-in's own CPU."""
    while not (run / "worker.pid").exists():
        time.sleep(0.05)
    fields = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()
    return int((run / "worker.pid").read_text()), (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _ends(pid: int) -> bool:
    for _ in range(200):
        if _gone(pid):
            return True
        time.sleep(0.05)
    return False


# --- the real peers, where installed -----------------------------------------------------------


@pytest.mark.timeout(400)
@pytest.mark.parametrize("name", PEER_NAMES)
async def test_real_peer_json_and_sse(name: str, tmp_path: Path) -> None:
    if not peers.installed(name):
        pytest.skip(f"{name} is not installed (python bench/peers.py install {name})")
    upstream = FakeUpstream()
    await upstream.start()
    peer = await asyncio.to_thread(start_peer, name, upstream.url, tmp_path)
    try:
        async with anthropic.AsyncAnthropic(base_url=peer.url, api_key="sk-ant-client", max_retries=0) as sdk:
            msg = await sdk.messages.create(
                model="claude-sonnet-4-5", max_tokens=16, messages=[{"role": "user", "content": "hi é"}]
            )
            async with sdk.messages.stream(
                model="claude-sonnet-4-5", max_tokens=16, messages=[{"role": "user", "content": "stream"}]
            ) as stream:
                final = await stream.get_final_message()
        assert msg.content[0].type == "text" and msg.content[0].text == "Hello from the fake upstream."
        assert final.content[0].type == "text"
        assert final.content[0].text == "Hello from the fake upstream, streaming."
        # (Headroom also sends HEAD / once, at start-up, as its upstream health check.)
        posts = [r for r in upstream.requests if r.method == "POST"]
        assert [r.path for r in posts] == ["/v1/messages"] * 2
        assert posts[0].json()["messages"] == [{"role": "user", "content": "hi é"}]
        assert posts[1].json()["stream"] is True
        assert {(r.method, r.path) for r in upstream.requests} <= {("POST", "/v1/messages"), ("HEAD", "/")}
        assert peer.cpu_seconds() > 0
    finally:
        peer.stop()
        await upstream.stop()
    assert peer.proc.returncode is not None
