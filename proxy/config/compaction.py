"""The compaction policy a configuration asks for: ``compaction.*`` keys → ``CompactionPolicy``.

Shared by the server and the offline ``replay`` (which must not import the server or the SDK).
The threshold and hard limit may depend on the model (a share of its window, ``auto``): they are
resolved per request (``limits_for``) and the policy is made for those figures.
"""

from __future__ import annotations

from collections.abc import Iterable

from proxy.config.settings import CompactionConfig
from proxy.core.catalogue import Catalogue, built_in
from proxy.core.catalogue_data import DEFAULT_CONTEXT_WINDOW
from proxy.core.compaction import (
    DEFAULT_READ_TOOLS,
    DEFAULT_SUMMARY_PROMPT,
    CompactionPolicy,
    ReadTool,
)
from proxy.core.limits import Limits, resolve_limits


def limits_for(
    config: CompactionConfig,
    model: str,
    betas: Iterable[str] = (),
    max_tokens: object = 0,
    catalogue: Catalogue | None = None,
) -> Limits:
    """The threshold and hard limit of one request (its model, betas and ``max_tokens``), the
    window from ``catalogue`` (the built-in one without)."""
    window = (catalogue or built_in()).window(model, frozenset(betas))
    return resolve_limits(config.threshold, config.hard_limit, window, max_tokens)


def policy_from_config(config: CompactionConfig, limits: Limits | None = None) -> CompactionPolicy:
    """The policy of ``config`` for ``limits`` (without: a model of the default window, and a
    request without ``max_tokens``)."""
    if limits is None:
        limits = resolve_limits(config.threshold, config.hard_limit, DEFAULT_CONTEXT_WINDOW, 0)
    read_tools: tuple[ReadTool, ...] = DEFAULT_READ_TOOLS
    if config.read_tools:
        read_tools = tuple(
            ReadTool(t.name, t.path_key, family=t.name, command=t.command or None)
            for t in config.read_tools
        )
    return CompactionPolicy(
        threshold=limits.threshold,
        hard_limit=limits.hard_limit,
        target_ratio=config.target_ratio,
        tool_result_cap=config.tool_result_cap,
        keep_recent=config.keep_recent,
        read_tools=read_tools,
        summary_model=config.summary.model,
        summary_max_tokens=config.summary.max_tokens,
        summary_prompt=config.summary.prompt or DEFAULT_SUMMARY_PROMPT,
        summary_input_cap=config.summary.input_budget,
        summary_max_calls=config.summary.max_calls,
        shrink_window=config.shrink_window,
        summary_mode=config.summary.mode,
    )
