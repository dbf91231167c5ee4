"""A long agent loop through context-proxy's keyless demo, with the official Anthropic SDK.

    context-proxy serve --demo                # in one terminal
    python examples/demo_agent_loop.py        # in another, from the same folder

The demo provider's model (``claude-demo-1``) plays an agent that reads, one tool call a turn,
the files its plan lists; this script is the other half of the loop, as any agent is: it runs
each ``read_file`` call on this repository's own source files and sends the result back. Nothing
here knows about the proxy but its URL: the SDK talks to it as to the provider.

Each turn prints what the proxy forwarded (its ``x-compaction-*`` response headers); at the end,
the session's figures from the proxy's usage ledger (the admin API, with the demo's admin token
from ``state/demo/admin-token``): tokens and dollars saved, and how many compactions.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import anthropic

REPO = Path(__file__).resolve().parent.parent
MODEL = "claude-demo-1"
TOOLS = [
    {
        "name": "read_file",
        "description": "Read a text file of the repository.",
        "input_schema": {
            "type": "object",
            "properties": {"path": {"type": "string", "description": "relative to the repository"}},
            "required": ["path"],
        },
    }
]
MAX_FILE_CHARS = 60_000


def plan(files: int) -> list[str]:
    """The repository's largest source files, and four of them read again later (an agent
    re-reading a file it changed: the proxy drops the superseded read)."""
    sources = sorted(
        (p for p in (REPO / "proxy").rglob("*.py") if p.is_file()),
        key=lambda p: (-p.stat().st_size, str(p)),
    )[:files]
    paths = [str(p.relative_to(REPO)) for p in sources]
    steps = list(paths)
    for n, again in enumerate(paths[2 : 2 + 4 * 3 : 3]):
        steps.insert(min(len(steps), 8 + 4 * n), again)
    return steps


def read_file(path: str) -> tuple[str, bool]:
    """The tool: the file's text (cut at 60,000 characters), or an error for the model."""
    target = (REPO / path).resolve()
    if not target.is_relative_to(REPO) or not target.is_file():
        return f"no such file in the repository: {path}", True
    return target.read_text(encoding="utf-8", errors="replace")[:MAX_FILE_CHARS], False


def usd(value: float | None) -> str:
    """Money for people: cents from a dollar up, two significant digits below."""
    if value is None:
        return "-"
    if abs(value) >= 1 or value == 0:
        return f"${value:,.2f}"
    decimals = min(6, max(2, 1 - math.floor(math.log10(abs(value)))))
    return f"${value:.{decimals}f}"


def admin_token(path: str) -> str | None:
    token = os.environ.get("CONTEXT_PROXY_ADMIN_TOKEN")
    if token:
        return token
    try:
        return Path(path).read_text(encoding="ascii").strip() or None
    except OSError:
        return None


def ledger(url: str, token: str, session: str, since: str, requests: int) -> dict[str, Any] | None:
    """The session's totals from the usage ledger, once all its requests are written (the
    ledger writes in the background: a fraction of a second)."""
    query = urllib.parse.urlencode({"session": session, "since": since})
    request = urllib.request.Request(
        f"{url}/admin/v1/usage/summary?{query}",
        headers={"Authorization": f"Bearer {token}", "Accept": "application/json"},
    )
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    deadline = time.monotonic() + 10
    while True:
        try:
            with opener.open(request, timeout=10) as answer:
                totals: dict[str, Any] = json.load(answer)["totals"]
        except (urllib.error.URLError, OSError, ValueError, KeyError) as exc:
            print(f"(the usage ledger could not be read: {exc})", file=sys.stderr)
            return None
        if totals.get("client_calls", 0) >= requests or time.monotonic() > deadline:
            return totals
        time.sleep(0.2)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=os.environ.get("CONTEXT_PROXY_URL", "http://127.0.0.1:8080"),
                        help="the proxy (default: $CONTEXT_PROXY_URL, else http://127.0.0.1:8080)")
    parser.add_argument("--files", type=int, default=20, help="how many files the agent reads (default 20)")
    parser.add_argument("--token-file", default="state/demo/admin-token",
                        help="the demo's admin token, for the dollars (default: state/demo/admin-token;"
                        " $CONTEXT_PROXY_ADMIN_TOKEN wins)")
    args = parser.parse_args()
    url = args.url.rstrip("/")
    session = f"demo-{time.strftime('%Y%m%d-%H%M%S')}"
    since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 60))
    steps = plan(args.files)
    system = "You are a code reader. Read these files, one per turn, then report:\n" + "\n".join(
        f"- {path}" for path in steps
    )
    client = anthropic.Anthropic(
        base_url=url, api_key="no-key-needed-for-the-demo", max_retries=2,
        default_headers={"x-session-id": session},
    )
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Go through the plan, please."}]
    print(f"Session {session}: an agent reading {len(steps)} files through {url}")
    turns = compactions = saved = 0
    try:
        for turn in range(1, len(steps) + 2):
            raw = client.messages.with_raw_response.create(
                model=MODEL, max_tokens=1024, system=system, tools=TOOLS,  # type: ignore[arg-type]
                messages=messages,  # type: ignore[arg-type]
            )
            answer, headers = raw.parse(), raw.headers
            turns = turn
            before = int(headers.get("x-compaction-tokens-before", "0"))
            after = int(headers.get("x-compaction-tokens-after", "0"))
            saved += max(0, before - after)
            new = headers.get("x-compaction-plan") == "new" and "x-compaction-id" in headers
            compactions += new
            calls = [b for b in answer.content if b.type == "tool_use"]
            what = f"read {calls[0].input['path']}" if calls else "done"  # type: ignore[index]
            layers = headers.get("x-compaction-layers", "none")
            print(f"turn {turn:2}  {what:44.44}  {before:>7,} -> {after:>7,} tokens"
                  f"  layers {layers}{'  (a new compaction)' if new else ''}")
            messages.append({"role": "assistant", "content": [b.to_dict() for b in answer.content]})
            if answer.stop_reason != "tool_use":
                break
            results = []
            for call in calls:
                text, failed = read_file(str(call.input.get("path", "")))  # type: ignore[union-attr]
                results.append({"type": "tool_result", "tool_use_id": call.id, "content": text,
                                "is_error": failed})
            messages.append({"role": "user", "content": results})
    except anthropic.APIConnectionError:
        print(f"cannot reach the proxy at {url}: start it first with `context-proxy serve --demo`",
              file=sys.stderr)
        return 2
    except anthropic.APIStatusError as exc:
        print(f"the proxy answered {exc.status_code}: {exc.message}", file=sys.stderr)
        return 1
    finally:
        client.close()

    token = admin_token(args.token_file)
    totals = ledger(url, token, session, since, turns) if token else None
    print()
    if totals is None:
        print(f"Saved {saved:,} tokens over {turns} requests; {compactions} compactions"
              " (from the response headers; for dollars, the admin token: --token-file)")
        return 0
    ratio = totals.get("tokens_saved_ratio") or 0.0
    if totals.get("savings_usd") is None:
        dollars = f"no dollars ({totals.get('unpriced_note')})"
    else:
        dollars = usd(totals["savings_usd"])
    print(f"Saved {totals['tokens_saved']:,} tokens ({ratio * 100:.1f}% of input) and {dollars}"
          f" over {totals['client_calls']} requests; {totals['compaction_events']} compactions.")
    print(f"It cost {usd((totals.get('cost_usd') or {}).get('total'))} instead of"
          f" {usd(((totals.get('cost_usd') or {}).get('total') or 0) + (totals.get('savings_usd') or 0))}"
          f" at {MODEL}'s (demo) price.")
    print(f"See the session in the console: {url}/console/sessions/{session}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
