"""MkDocs hook: the reference pages' generated parts, made from the code at build time.

A page holds a marker line ``<!-- generated: NAME -->``; :func:`on_page_markdown` replaces it with
``GENERATED[NAME]()``: the configuration and policy keys from the config schema's own descriptions
(``proxy/config/reference.py``), the metrics from the registry the proxy builds, the command line
from its argparse parsers, the admin API's routes from ``docs/admin-openapi.yaml``. So these pages
never drift from the code; tests/test_docs_reference.py and tests/test_config_reference.py check
what they show.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import yaml

from proxy.cli.main import build_parser
from proxy.config.reference import cell, rows
from proxy.config.reference import markdown as keys_markdown
from proxy.config.retention import RetentionConfig
from proxy.config.settings import CompactionConfig, Config
from proxy.config.upstream import UpstreamTarget
from proxy.server.http.metrics import new_metrics
from proxy.server.maintenance.retention import GcMetrics
from proxy.tenancy.policies import PolicyFile

DOCS = Path(__file__).resolve().parent.parent
OPENAPI = DOCS / "admin-openapi.yaml"

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


# --- metrics --------------------------------------------------------------------------------------


class MetricRow(NamedTuple):
    name: str  # as exposed: a counter's with _total
    type: str
    labels: tuple[str, ...]
    help: str


def metric_rows() -> list[MetricRow]:
    """Every metric the proxy registers: its app metrics and the garbage collector's."""
    metrics = new_metrics()
    gc = GcMetrics.on(metrics.registry)
    found: list[MetricRow] = []
    for holder in (metrics, gc):
        for f in dataclasses.fields(holder):
            metric = getattr(holder, f.name)
            if not hasattr(metric, "describe"):
                continue
            for family in metric.describe():  # one, or a collector's several (the caches')
                name = family.name + ("_total" if family.type == "counter" else "")
                labels = metric._labelnames if hasattr(metric, "_labelnames") else family._labelnames
                found.append(MetricRow(name, family.type, tuple(labels), family.documentation))
    return sorted(found, key=lambda m: m.name)


def metrics() -> str:
    lines = ["| metric | type | labels | what it counts |", "|---|---|---|---|"]
    for m in metric_rows():
        labels = ", ".join(f"`{label}`" for label in m.labels)
        lines.append(f"| `{m.name}` | {m.type} | {labels} | {cell(m.help)} |")
    return "\n".join(lines)


# --- the command line -----------------------------------------------------------------------------


def _subcommands(parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            yield from action.choices.items()


def cli_sections() -> list[tuple[int, str, str]]:
    """(heading level, command, its --help at 100 columns) for every command and subcommand."""
    out: list[tuple[int, str, str]] = []

    def walk(parser: argparse.ArgumentParser, level: int) -> None:
        parser.formatter_class = functools.partial(argparse.HelpFormatter, width=100)
        out.append((level, parser.prog, parser.format_help().rstrip()))
        for _, sub in _subcommands(parser):
            walk(sub, level + 1)

    walk(build_parser(), 2)
    return out


def cli() -> str:
    parts = []
    for level, prog, text in cli_sections():
        parts.append(f"{'#' * level} `{prog}`\n\n```text\n{text}\n```\n")
    return "\n".join(parts)


# --- the admin API --------------------------------------------------------------------------------

METHODS = ("get", "put", "post", "patch", "delete")


def _resolve(spec: dict[str, Any], node: Any) -> Any:
    while isinstance(node, dict) and "$ref" in node:
        target: Any = spec
        for part in node["$ref"].removeprefix("#/").split("/"):
            target = target[part]
        node = target
    return node


def admin_routes() -> list[tuple[str, str, str, list[str]]]:
    """(method, path, summary, query parameters) of every operation of the OpenAPI file."""
    spec = yaml.safe_load(OPENAPI.read_text())
    out = []
    for path, item in spec["paths"].items():
        shared = item.get("parameters", [])
        for method in METHODS:
            op = item.get(method)
            if op is None:
                continue
            params = [_resolve(spec, p) for p in [*shared, *op.get("parameters", [])]]
            query = [p["name"] for p in params if p.get("in") == "query"]
            out.append((method.upper(), path, op.get("summary", ""), query))
    return out


def admin_api() -> str:
    lines = ["| method | path (under `/admin/v1`) | what | query parameters |", "|---|---|---|---|"]
    for method, path, summary, query in admin_routes():
        params = ", ".join(f"`{q}`" for q in query)
        lines.append(f"| {method} | `{path}` | {cell(summary)} | {params} |")
    return "\n".join(lines)


GENERATED: dict[str, Callable[[], str]] = {
    "configuration": configuration,
    "policy": policy,
    "metrics": metrics,
    "cli": cli,
    "admin-api": admin_api,
}

MARKER = re.compile(r"^<!-- generated: ([a-z-]+) -->$", re.MULTILINE)


def render(text: str) -> str:
    """``text`` with every marker replaced by its generated Markdown (KeyError: an unknown one)."""
    return MARKER.sub(lambda m: GENERATED[m.group(1)]().rstrip("\n"), text)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    return render(markdown)
