"""``context-proxy models``: what the proxy knows of each model, and where each value comes from.

Without names: one line per model the catalogue lists (the config's entries first, then the
built-in rows), each value marked when it is not the built-in one (``*`` from the config, ``~``
made by the published id rule), and which config entry gave what. With names (any spelling:
``claude-opus-4-8``, ``us.anthropic.claude-opus-4-8``, ``claude-opus-4-8@…``): every value of
those models with its origin, its source and notes. ``--json``: the same, as data.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from proxy.core.catalogue import BUILT_IN, DEFAULT, RULE, Catalogue, Known, Resolved
from proxy.core.model_row import Price

VALUES = (
    "bedrock", "vertex", "foundry", "context_window", "context_window_1m", "max_output", "price",
    "binds_thinking",
)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("models", nargs="*", metavar="MODEL", help="models to show in full (any spelling)")
    parser.add_argument("--config", help="YAML config file (default: $CONTEXT_PROXY_CONFIG, else built-in defaults)")
    parser.add_argument("--json", action="store_true", help="print JSON: every value with its origin")


def run(args: argparse.Namespace) -> int:
    from proxy.config.environment import config_path_from_env
    from proxy.config.models import catalogue_of
    from proxy.config.schema import ConfigError
    from proxy.config.settings import load_config

    try:
        config = load_config(config_path_from_env(args.config))
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    catalogue = catalogue_of(config)
    print(render(catalogue, args.models, as_json=args.json))
    return 0


def render(catalogue: Catalogue, names: list[str], *, as_json: bool = False) -> str:
    resolved = [catalogue.resolve(n) for n in names] if names else catalogue.listed()
    if as_json:
        import orjson

        return orjson.dumps([to_json(r) for r in resolved], option=orjson.OPT_INDENT_2).decode()
    return "\n".join(details(r) for r in resolved) if names else table(resolved, catalogue)


def to_json(r: Resolved) -> dict[str, Any]:
    out: dict[str, Any] = {"model": r.name, "id": r.id, "name": r.display.value}
    out["aliases"] = list(r.aliases.value)
    for attr in VALUES:
        known: Known[Any] = getattr(r, attr)
        value = known.value
        if isinstance(value, Price):
            value = {f: getattr(value, f) for f in Price.__dataclass_fields__}
        out[attr] = {"value": value, "origin": known.origin}
    out["source"] = r.row.source if r.row else ""
    out["note"] = r.row.note if r.row else ""
    return out


def _mark(known: Known[Any]) -> str:
    if known.origin.startswith("config"):
        return "*"
    return "~" if known.origin == RULE else ""


def _tokens(value: int | None) -> str:
    if value is None:
        return "-"
    return f"{value // 1_000_000}M" if value % 1_000_000 == 0 else f"{value // 1000}K"


def _money(value: float) -> str:
    return f"${value:g}"


def price_text(price: Price | None) -> str:
    if price is None:
        return "unpriced"
    return f"{_money(price.input)}/{_money(price.output)}"


def table(rows: list[Resolved], catalogue: Catalogue) -> str:
    head = ("MODEL", "WINDOW", "1M BETA", "OUTPUT", "IN/OUT $/MTok", "BINDS", "BEDROCK", "VERTEX", "FOUNDRY")
    lines: list[tuple[str, ...]] = [head]
    notes: list[str] = []
    for r in rows:
        cells = (
            r.id,
            _tokens(r.context_window.value) + _mark(r.context_window),
            _tokens(r.context_window_1m.value) + _mark(r.context_window_1m),
            _tokens(r.max_output.value) + _mark(r.max_output),
            price_text(r.price.value) + _mark(r.price),
            ("yes" if r.binds_thinking.value else "no") + _mark(r.binds_thinking),
            r.bedrock.value + _mark(r.bedrock),
            r.vertex.value + _mark(r.vertex),
            r.foundry.value + _mark(r.foundry),
        )
        lines.append(cells)
        configured = [
            f"{attr} from config {known.origin[len('config '):]}"
            for attr in ("display", "aliases", *VALUES)
            if (known := getattr(r, attr)).origin.startswith("config")
        ]
        if configured:
            notes.append(f"  {r.id}: " + "; ".join(configured))
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    text = ["  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in lines]
    globs = [e for e in catalogue.entries if e.is_glob]
    text.append("")
    text.append(
        "Values without a mark are built in (docs/reference/models.md cites each row's source);"
        " * from the config, ~ made by the published id rule (no row or entry knows it)."
        " Bedrock ids are base ids: upstream.profile_geo puts a geography in front."
    )
    if notes:
        text.append("From the config:")
        text.extend(notes)
    for e in globs:
        text.append(f"  glob {e.match!r} (config {e.origin}) applies to every model it matches")
    return "\n".join(text)


def details(r: Resolved) -> str:
    origin = {BUILT_IN: "built in", DEFAULT: "default (nothing knows this model)", RULE: "the published id rule"}

    def line(label: str, known: Known[Any], shown: str) -> str:
        return f"  {label:<16}{shown:<56} {origin.get(known.origin, known.origin)}"

    price = r.price.value
    title = r.display.value if r.display.value not in (r.id, r.name) else ""
    out = [f"{r.name}" + (f"  (Claude API id {r.id})" if r.id != r.name else "") + (f"  {title}" if title else "")]
    out.append(line("aliases", r.aliases, ", ".join(r.aliases.value) or "-"))
    out.append(line("bedrock", r.bedrock, r.bedrock.value))
    out.append(line("vertex", r.vertex, r.vertex.value))
    out.append(line("foundry", r.foundry, r.foundry.value))
    out.append(line("context window", r.context_window, f"{r.context_window.value:,}"))
    window_1m = r.context_window_1m.value
    out.append(line("with 1M beta", r.context_window_1m, f"{window_1m:,}" if window_1m else "-"))
    max_output = r.max_output.value
    out.append(line("max output", r.max_output, f"{max_output:,}" if max_output else "not published"))
    shown = "unpriced" if price is None else (
        f"in {_money(price.input)}, out {_money(price.output)}, 5m write"
        f" {_money(price.cache_write_5m)}, 1h write {_money(price.cache_write_1h)}, read"
        f" {_money(price.cache_read)}"
    )
    out.append(line("price $/MTok", r.price, shown))
    out.append(line("binds thinking", r.binds_thinking, "yes" if r.binds_thinking.value else "no"))
    if r.row is not None:
        out.append(f"  source          {r.row.source}")
        if r.row.note:
            out.append(f"  note            {r.row.note}")
    return "\n".join(out) + "\n"
