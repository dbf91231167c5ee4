"""The compaction policy a configuration asks for: ``compaction.*`` keys → ``CompactionPolicy``.

Shared by the server and the offline ``replay`` (which must not import the server or the SDK).
"""

from __future__ import annotations

from proxy.config import CompactionConfig
from proxy.core.compaction import (
    DEFAULT_READ_TOOLS,
    DEFAULT_SUMMARY_PROMPT,
    CompactionPolicy,
    ReadTool,
)


def policy_from_config(config: CompactionConfig) -> CompactionPolicy:
    read_tools: tuple[ReadTool, ...] = DEFAULT_READ_TOOLS
    if config.read_tools:
        read_tools = tuple(
            ReadTool(t.name, t.path_key, family=t.name, command=t.command or None)
            for t in config.read_tools
        )
    return CompactionPolicy(
        threshold=config.threshold,
        hard_limit=config.hard_limit,
        target_ratio=config.target_ratio,
        tool_result_cap=config.tool_result_cap,
        keep_recent=config.keep_recent,
        read_tools=read_tools,
        summary_model=config.summary.model,
        summary_max_tokens=config.summary.max_tokens,
        summary_prompt=config.summary.prompt or DEFAULT_SUMMARY_PROMPT,
    )
