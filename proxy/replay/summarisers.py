"""What answers a replay's summary calls: offline, :class:`ExtractiveSummariser` (deterministic,
no model: the user's requests, tool names, file paths and the last lines of the summarised turns);
with an upstream, :class:`UpstreamSummariser`, the very call the edge makes
(``proxy/server/compaction/service.py``) with the anthropic SDK.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from typing import Any, Protocol

from proxy.config.settings import SummaryConfig
from proxy.core.compaction import SummaryRequest

__all__ = ["LABEL", "ExtractiveSummariser", "Summariser", "UpstreamSummariser"]


class Summariser(Protocol):
    """Answers one summary request; ``None`` (or empty text) means the call failed."""

    name: str

    def __call__(self, request: SummaryRequest) -> str | None: ...


_ROLE_LINE = re.compile(r"^(?:\[#\d+\] )?(USER|ASSISTANT|SYSTEM)(?::\s*\(no text\)|:)\s*$")
# how the summariser's input labels each message with its index in the client's messages
LABEL = re.compile(r"^\[#(\d+)\] (?:USER|ASSISTANT|SYSTEM):", re.MULTILINE)
_TOOL_CALL = re.compile(r"^(?:tool_use|server_tool_use|mcp_tool_use) ([\w.:\-]+)\(")
_PATH = re.compile(r"(?<![\w/.])(?:~|\.{1,2})?/(?:[\w.\-@+\[\]]+/)+[\w.\-@+\[\]]*[\w\]]")
_EXTRACTIVE_HEADER = "[offline extractive summary: no model was called]"


class ExtractiveSummariser:
    """A deterministic stand-in for the summary model, built from the rendered region only.

    It keeps: the user's typed lines (the first ones, and the latest when there are many), the
    tools called and how often, file paths mentioned (the latest ones when there are many), the
    number of failed tool calls, and the last lines of the region, all within the request's
    ``max_tokens`` (counted with ``count_text``). A previous summary of its own is merged into the
    new one (incremental, like the real summariser is asked to be); anyone else's is quoted, cut.
    """

    name = "offline-extractive"

    def __init__(
        self,
        count_text: Callable[[str], int],
        *,
        user_lines: int = 12,
        paths: int = 25,
        tail_lines: int = 25,
        line_chars: int = 200,
    ) -> None:
        self._count = count_text
        self._user_lines = user_lines
        self._paths = paths
        self._tail_lines = tail_lines
        self._line_chars = line_chars
        self.calls = 0

    def _cut(self, line: str, limit: int | None = None) -> str:
        line = line.strip()
        limit = self._line_chars if limit is None else limit
        return line if len(line) <= limit else line[:limit] + "…"

    @staticmethod
    def _parse_own(previous: str) -> tuple[list[str], Counter[str], list[str], int] | None:
        """The sections of a summary this class wrote (its tail is left out: it is older than
        the new region's), or ``None`` for anyone else's text."""
        lines = previous.strip().splitlines()
        if not lines or lines[0] != _EXTRACTIVE_HEADER:
            return None
        user: list[str] = []
        tools: Counter[str] = Counter()
        paths: list[str] = []
        errors = 0
        section = ""
        for line in lines[1:]:
            if line == "User requests:":
                section = "user"
            elif line.startswith("Tools used: "):
                section = ""
                for item in line[len("Tools used: ") :].split(", "):
                    name, _, n = item.rpartition(" x")
                    if name and n.isdigit():
                        tools[name] += int(n)
            elif line.startswith("Files mentioned: "):
                section = ""
                paths = line[len("Files mentioned: ") :].split(", ")
            elif line.startswith("Failed tool calls: "):
                section = ""
                n = line[len("Failed tool calls: ") :]
                errors = int(n) if n.isdigit() else 0
            elif line.startswith("Last lines of the summarised turns:"):
                break
            elif section == "user" and line.startswith("- "):
                user.append(line[2:])
        return user, tools, paths, errors

    def __call__(self, request: SummaryRequest) -> str | None:
        self.calls += 1
        text = request.text
        previous = ""
        if "<previous_summary>" in text and "</previous_summary>" in text:
            previous = text.split("<previous_summary>", 1)[1].split("</previous_summary>", 1)[0]
        transcript = text.split("<transcript>", 1)[-1].rsplit("</transcript>", 1)[0]
        lines = transcript.splitlines()

        own = self._parse_own(previous) if previous.strip() else None
        user: list[str] = list(own[0]) if own else []
        tools: Counter[str] = Counter(own[1]) if own else Counter()
        paths: list[str] = list(own[2]) if own else []
        errors = own[3] if own else 0
        role = ""
        in_result = False
        typed: list[str] = []  # the lines of one typed user text

        def flush() -> None:
            if typed:
                user.append(self._cut(" ".join(typed)))
                typed.clear()

        for line in lines:
            head = _ROLE_LINE.match(line)
            if head:
                flush()
                role, in_result = head.group(1), False
                continue
            if line.startswith(("tool_result", "mcp_tool_result")):
                flush()
                in_result = True
                errors += line.startswith(("tool_result (error)", "mcp_tool_result (error)"))
                continue
            call = _TOOL_CALL.match(line)
            if call:
                tools[call.group(1)] += 1
                continue
            if role == "USER" and not in_result and line.strip():
                typed.append(line.strip())
        flush()
        for match in _PATH.finditer(transcript):
            path = match.group(0)
            if path in paths:
                paths.remove(path)
            paths.append(path)  # latest mention last
        if len(user) > self._user_lines:  # the first requests and the latest ones
            first = self._user_lines // 3
            user = [*user[:first], "…", *user[len(user) - (self._user_lines - first) :]]
        paths = [self._cut(p, 120) for p in paths[-self._paths :]]
        tail = [self._cut(x) for x in lines if x.strip()][-self._tail_lines :]

        sections: list[list[str]] = []
        if previous.strip() and own is None:
            quoted = [self._cut(x) for x in previous.strip().splitlines() if x.strip()]
            sections.append(["Earlier summary (cut):", *quoted[:15]])
        sections.append(["User requests:", *(f"- {u}" for u in user)])
        if tools:
            sections.append(
                ["Tools used: " + ", ".join(f"{name} x{n}" for name, n in sorted(tools.items()))]
            )
        if paths:
            sections.append(["Files mentioned: " + ", ".join(paths)])
        if errors:
            sections.append([f"Failed tool calls: {errors}"])
        sections.append(["Last lines of the summarised turns:", *tail])

        budget = max(1, int(request.max_tokens * 0.9))
        out = [_EXTRACTIVE_HEADER]
        used_tokens = self._count(out[0]) + 1
        for section in sections:
            for line in section:
                cost = self._count(line) + 1
                if used_tokens + cost > budget:
                    break
                out.append(line)
                used_tokens += cost
        return "\n".join(out)


class UpstreamSummariser:
    """The edge's summary call (``proxy.server.compaction.summaries.Summaries.summarize``), made
    with the anthropic SDK against ``base_url`` with the key from the environment. Failures answer
    ``None``."""

    def __init__(self, base_url: str, api_key: str, config: SummaryConfig) -> None:
        import anthropic

        self.name = f"upstream {base_url}"
        self.calls = 0
        self.failures: list[str] = []
        # the credentials travel as the edge forwards an x-api-key client's own
        # (``proxy.server.compaction.summary_client.summary_auth_headers``): X-Api-Key, no
        # Authorization
        self._auth: dict[str, Any] = {"X-Api-Key": api_key, "Authorization": anthropic.omit}
        self._client = anthropic.Anthropic(
            base_url=base_url,
            api_key="unused-the-key-is-sent-as-x-api-key",
            max_retries=config.max_retries,
            timeout=config.timeout_seconds,
        )

    def __call__(self, request: SummaryRequest) -> str | None:
        import anthropic

        self.calls += 1
        try:
            message = self._client.messages.create(
                model=request.model,
                max_tokens=request.max_tokens,
                system=request.system,
                messages=[{"role": "user", "content": request.text}],
                extra_headers=self._auth,
            )
        except anthropic.APIError as exc:
            self.failures.append(type(exc).__name__)
            return None
        text = "".join(
            block.text for block in message.content if isinstance(block, anthropic.types.TextBlock)
        )
        return text or None

    def close(self) -> None:
        self._client.close()
