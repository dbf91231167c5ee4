"""What compaction may do and when: one frozen value, validated on construction.

Token figures here are *calibrated* tokens (the estimate multiplied by the model's calibration
ratio), except the per-item caps (``tool_result_cap``, ``summary_input_cap``, ...), which bound
estimates of single pieces of content and are compared with raw estimates.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from proxy.core.catalogue_data import SUMMARY_MODEL

__all__ = ["DEFAULT_READ_TOOLS", "DEFAULT_SUMMARY_PROMPT", "CompactionPolicy", "ReadTool"]


@dataclass(frozen=True, slots=True)
class ReadTool:
    """A client tool whose call reads one file, for L2 (dedup).

    Two reads are the same read when their ``family`` and normalised path match. A later read
    supersedes an earlier one when it reads the whole file (none of ``range_keys`` in its input)
    or the very same range (equal values for all ``range_keys``). ``command``, when set, must equal
    ``input["command"]`` (the text-editor tool is a read only for ``view``).
    """

    name: str
    path_key: str
    family: str
    command: str | None = None
    range_keys: tuple[str, ...] = ()

    def read_path(self, tool_input: object) -> str | None:
        """The normalised path this call reads, or ``None`` when it is not a read of this tool."""
        if not isinstance(tool_input, Mapping):
            return None
        if self.command is not None and tool_input.get("command") != self.command:
            return None
        path = tool_input.get(self.path_key)
        if not isinstance(path, str) or not path.strip():
            return None
        return normalize_path(path)

    def read_range(self, tool_input: Mapping[str, Any]) -> tuple[object, ...] | None:
        """The range arguments of a read, or ``None`` for a whole-file read."""
        values = tuple(tool_input.get(k) for k in self.range_keys)
        return None if all(v is None for v in values) else values


def normalize_path(path: str) -> str:
    """Lexical normalisation only (no file system, no cwd): ``a//b/./c`` -> ``a/b/c``."""
    return posixpath.normpath(path.strip())


DEFAULT_READ_TOOLS: tuple[ReadTool, ...] = (
    ReadTool("Read", "file_path", family="claude-code-read", range_keys=("offset", "limit")),
    ReadTool(
        "str_replace_based_edit_tool",
        "path",
        family="text-editor-view",
        command="view",
        range_keys=("view_range",),
    ),
    ReadTool(
        "str_replace_editor",
        "path",
        family="text-editor-view",
        command="view",
        range_keys=("view_range",),
    ),
    ReadTool("read_file", "path", family="read_file"),
)

DEFAULT_SUMMARY_PROMPT = """\
You are writing a hand-off note for an AI coding agent whose conversation became too long. \
The earlier part of the conversation is given below as a transcript; the agent keeps the first \
user message and the most recent turns, and will continue from your note alone for everything \
in between.

Write a compact, factual note in this structure:
1. Goal and constraints: what the user asked for, requirements, preferences and constraints \
they stated (quote short user instructions verbatim).
2. Decisions made: choices and their reasons.
3. Files and commands: files read, created or changed (paths) and what changed; commands run \
and their relevant outcome.
4. Errors and fixes: each error met and how it was fixed (or that it is still open).
5. Open work: what remains to be done, and the next step that was about to be taken.

If the transcript begins with a previous summary, merge it with the newer turns into one note. \
Do not invent anything; omit pleasantries; do not address the user. Stay well within the length \
limit."""


@dataclass(frozen=True, slots=True)
class CompactionPolicy:
    """When to compact and how hard. Defaults suit a 200k-token context window."""

    threshold: int = 80_000
    hard_limit: int = 120_000
    target_ratio: float = 0.55
    tool_result_cap: int = 5_000
    keep_recent: int = 6
    # the recent window shrinks (whole interactions, down to the latest assistant message) when
    # it alone keeps the view over the target; False: ``keep_recent`` messages stay whatever
    # they weigh (L1 cuts inside them instead)
    shrink_window: bool = True
    read_tools: tuple[ReadTool, ...] = DEFAULT_READ_TOOLS
    summarize: bool = True
    summary_model: str = SUMMARY_MODEL
    summary_max_tokens: int = 2_000
    summary_prompt: str = DEFAULT_SUMMARY_PROMPT
    # the summariser's input budget per call (``compaction.summary.input_budget``), and the most
    # calls one compaction may make to summarise everything it removes (an incremental chain)
    summary_input_cap: int = 24_000
    summary_max_calls: int = 6
    summary_tool_result_cap: int = 400
    summary_tool_input_chars: int = 300
    carried_text_cap: int = 2_000
    # who writes the L4 summary: "proxy" (the summary model, from a rendering of the removed
    # turns) or "provider" (the provider's on-demand compaction on the request's own model,
    # see ``provider``; "proxy" is its fallback)
    summary_mode: str = "proxy"
    _by_name: Mapping[str, tuple[ReadTool, ...]] = field(
        init=False, repr=False, compare=False, hash=False
    )

    def __post_init__(self) -> None:
        problems: list[str] = []
        if self.threshold <= 0:
            problems.append("threshold must be > 0")
        if self.hard_limit < self.threshold:
            problems.append("hard_limit must be >= threshold")
        if not 0.0 < self.target_ratio <= 1.0:
            problems.append("target_ratio must be in (0, 1]")
        if self.tool_result_cap < 1:
            problems.append("tool_result_cap must be >= 1")
        if self.keep_recent < 1:
            problems.append("keep_recent must be >= 1")
        if self.summary_mode not in ("proxy", "provider"):
            problems.append('summary_mode must be "proxy" or "provider"')
        if self.summary_max_tokens < 1:
            problems.append("summary_max_tokens must be >= 1")
        if self.summary_input_cap < self.summary_max_tokens + 200:
            problems.append(
                "summary_input_cap must be >= summary_max_tokens + 200 (each call after the"
                " first reads the previous call's summary)"
            )
        if self.summary_max_calls < 1:
            problems.append("summary_max_calls must be >= 1")
        if self.summary_tool_result_cap < 1 or self.summary_tool_input_chars < 1:
            problems.append("summary caps must be >= 1")
        if self.carried_text_cap < 1:
            problems.append("carried_text_cap must be >= 1")
        if self.summarize and not self.summary_prompt.strip():
            problems.append("summary_prompt must not be empty")
        if problems:
            raise ValueError("invalid compaction policy: " + "; ".join(problems))
        by_name: dict[str, tuple[ReadTool, ...]] = {}
        for tool in self.read_tools:
            by_name[tool.name] = (*by_name.get(tool.name, ()), tool)
        object.__setattr__(self, "_by_name", by_name)

    @property
    def target(self) -> int:
        """Once compaction is triggered, the layers work toward this many calibrated tokens."""
        return int(self.threshold * self.target_ratio)

    def read_of(self, name: object, tool_input: object) -> tuple[ReadTool, str] | None:
        """``(tool, normalised path)`` when a ``tool_use`` named ``name`` reads a file."""
        if not isinstance(name, str):
            return None
        for tool in self._by_name.get(name, ()):
            path = tool.read_path(tool_input)
            if path is not None:
                return tool, path
        return None
