"""The configuration reference is made from the config schema: every key of the configuration and
of a tenant policy carries a description in its field metadata, and the generated page shows each
key with its type, default and allowed values, sorted and grouped by section
(proxy/config/reference.py, docs/hooks/reference.py)."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

import pytest

from proxy.config.reference import markdown as keys_markdown
from proxy.config.reference import rows, undescribed
from proxy.config.schema import check, doc, one_of, positive
from proxy.config.settings import Config
from proxy.tenancy.policies import PolicyFile
from tests.docs_hook import load_hook

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "reference" / "configuration.md"


@pytest.fixture(scope="module")
def hook() -> ModuleType:
    return load_hook()


@pytest.fixture(scope="module")
def page(hook: ModuleType) -> str:
    rendered: str = hook.render(PAGE.read_text())
    return rendered


def test_every_configuration_key_is_described() -> None:
    assert undescribed(Config) == []


def test_every_policy_key_is_described(hook: ModuleType) -> None:
    assert undescribed(PolicyFile, hook.POLICY_REFER) == []


@dataclass(frozen=True, slots=True)
class _Item:
    described: int = field(default=1, metadata=doc("An item key."))
    bare: str = ""


@dataclass(frozen=True, slots=True)
class _Inner:
    described: int = field(default=1, metadata=check(positive, doc="A nested key."))
    bare: int = field(default=2, metadata=check(positive))


@dataclass(frozen=True, slots=True)
class _Section:
    inner: _Inner = field(default=_Inner(), metadata=doc("A nested section."))
    items: tuple[_Item, ...] = field(default=(), metadata=doc("A list of mappings."))
    bare_section: _Inner = _Inner()
    env_only: bytes = field(default=b"", metadata={"env": True})  # not a file key


def test_a_key_without_a_description_is_named_wherever_it_is() -> None:
    assert undescribed(_Section) == [
        "inner.bare",
        "items[].bare",
        "bare_section",
        "bare_section.bare",
    ]


def test_the_page_uses_both_generated_parts(hook: ModuleType) -> None:
    text = PAGE.read_text()
    assert set(hook.MARKER.findall(text)) == {"configuration", "policy"}


def _table_rows(page: str) -> dict[str, list[str]]:
    """key path -> its cells (type, default, allowed, description), from every table row."""
    found: dict[str, list[str]] = {}
    for line in page.splitlines():
        m = re.match(r"^\| `([^`]+)` \| (.*) \|$", line)
        if m:
            found.setdefault(m.group(1), re.split(r"(?<!\\)\s\|\s", m.group(2)))
    return found


def test_the_page_shows_every_key_with_type_default_and_description(page: str) -> None:
    table = _table_rows(page)
    sections = {key.path for key in rows(Config) if key.type == "mapping" and "." not in key.path}
    for key in rows(Config):
        if key.path in sections:  # a top-level section: its heading and description
            assert f"### `{key.path}` {{#{key.path}}}\n\n{key.doc}\n" in page
            continue
        assert key.path in table, key.path
        kind, default, allowed, description = table[key.path]
        assert allowed == key.allowed
        assert kind == key.type
        assert default == (f"`{key.default}`" if key.default else "")
        assert description.replace("\\|", "|") == key.doc
    assert "admin_token_hashes" not in page  # from the environment, not a key of the file


def test_the_page_shows_defaults_and_allowed_values_as_written(page: str) -> None:
    table = _table_rows(page)
    assert table["retention.plans.max_age_days"][:2] == ["number", "`30`"]
    assert table["retention.plans.max_rows"][:2] == ["integer", "`100000`"]
    assert table["retention.calibration.max_rows"][1] == "`1000`"  # the section's own default
    assert table["auth.mode"][1:3] == ["`passthrough`", "`passthrough`, `keys`"]
    assert table["compaction.target_ratio"][2] == "between 0 and 1 (exclusive)"
    assert table["compaction.threshold"][:2] == ["integer or string", "`80000`"]
    assert table["listen.port"][1:3] == ["`8080`", "0 to 65535"]
    assert table["store.url"][1:3] == ['`""`', '`""` or `sqlite:///<path>`, `postgresql://...`']
    assert table["models[].thinking_binding"][1:3] == ["`auto`", "`auto`, `prefix`, `none`"]
    assert table["logging.level"][2] == "`DEBUG`, `INFO`, `WARNING`, `ERROR` (any case)"
    assert table["sources.kinds"][:2] == ["list of strings", "`[transcript, artifact]`"]
    assert table["sources.session_patterns"][1] == '`["*"]`'


def test_keys_are_sorted_and_grouped_by_section(page: str) -> None:
    config_part, policy_part = page.split("## Tenant policy files", 1)
    for part, prefix in ((config_part, ""), (policy_part, "policy-")):
        headings = re.findall(r"^### (.+) \{#([a-z_-]+)\}$", part, re.MULTILINE)
        names = [anchor.removeprefix(prefix) for _, anchor in headings]
        assert names[0] == "top-level" and names[1:] == sorted(names[1:])
        for block in re.split(r"^### ", part, flags=re.MULTILINE)[1:]:
            paths = re.findall(r"^\| `([^`]+)` \|", block, re.MULTILINE)
            assert paths == sorted(paths)
            heading = block.split(" ", 1)[0].strip("`")
            if heading != "Top-level":
                assert all(p.split(".")[0].split("[")[0] == heading for p in paths), heading


def test_policy_sections_that_take_the_configuration_keys_link_to_them(page: str) -> None:
    policy_part = page.split("## Tenant policy files", 1)[1]
    for name in ("compaction", "retention", "upstream"):
        section = policy_part.split(f"### `{name}` {{#policy-{name}}}", 1)[1].split("###", 1)[0]
        assert f"[`{name}`](#{name})" in section
        assert f"`{name}." not in section  # not the keys again
    assert "| `quota.keys[].key_sha256` |" in policy_part
    assert "| `sources.object_store.bucket` |" in policy_part


def test_every_key_is_one_table_row_of_five_cells(hook: ModuleType) -> None:
    """Rendered as the site renders it: a description holding a pipe must not split its row."""
    markdown = pytest.importorskip("markdown")
    for part in (hook.configuration(), hook.policy()):
        html = markdown.markdown(part, extensions=["tables", "attr_list"])
        body_rows = re.findall(r"<tr>(.*?)</tr>", html, re.DOTALL)[1:]
        assert body_rows
        for row in body_rows:
            cells = re.findall(r"<t[dh][^>]*>", row)
            assert len(cells) == 5, row
    html = markdown.markdown(hook.configuration(), extensions=["tables", "attr_list"])
    assert "<code>a.b</code>, <code>a[]</code>" in html  # backticks inside a cell stay code


@dataclass(frozen=True, slots=True)
class _Piped:
    mode: str = field(default="a", metadata=check(one_of("a", "b"), doc="`a|b` in code, or a | b in text."))


def test_a_pipe_in_a_description_stays_in_its_cell() -> None:
    markdown = pytest.importorskip("markdown")
    html = markdown.markdown(keys_markdown(rows(_Piped)), extensions=["tables", "attr_list"])
    (row,) = re.findall(r"<tr>(.*?)</tr>", html, re.DOTALL)[1:]
    assert len(re.findall(r"<td[^>]*>", row)) == 5
    assert "<code>a|b</code> in code, or a | b in text." in row


def test_dataclass_fields_are_all_seen() -> None:
    """Every file key of Config is a row (nothing skipped but the environment's)."""
    paths = {key.path for key in rows(Config)}
    for f in dataclasses.fields(Config):
        assert (f.name in paths) != bool(f.metadata.get("env")), f.name
