"""MkDocs hook: the reference pages' generated parts, made from the code at build time.

A page holds a marker line ``<!-- generated: NAME -->``; :func:`on_page_markdown` replaces it with
``GENERATED[NAME]()``. So the configuration reference is the config schema's own descriptions
(``proxy/config/reference.py``), and never drifts from it. tests/test_docs_site.py checks every
marker is used and renders.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from proxy.config.reference import markdown as keys_markdown
from proxy.config.reference import rows
from proxy.config.retention import RetentionConfig
from proxy.config.settings import CompactionConfig, Config
from proxy.config.upstream import UpstreamTarget
from proxy.tenancy.tenants import PolicyFile

# A policy's sections that take the configuration's keys: one row naming the config's section.
POLICY_REFER: dict[type, str] = {
    CompactionConfig: "compaction",
    RetentionConfig: "retention",
    UpstreamTarget: "upstream",
}


def configuration() -> str:
    return keys_markdown(rows(Config), level=3)


def policy() -> str:
    return keys_markdown(rows(PolicyFile, POLICY_REFER), level=3, anchor_prefix="policy-")


GENERATED: dict[str, Callable[[], str]] = {
    "configuration": configuration,
    "policy": policy,
}

MARKER = re.compile(r"^<!-- generated: ([a-z-]+) -->$", re.MULTILINE)


def render(text: str) -> str:
    """``text`` with every marker replaced by its generated Markdown (KeyError: an unknown one)."""
    return MARKER.sub(lambda m: GENERATED[m.group(1)]().rstrip("\n"), text)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    return render(markdown)
