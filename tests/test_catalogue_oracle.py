"""Claude Code's own catalogue is the oracle for ours.

The pinned Claude Code (``.ci/run`` installs @anthropic-ai/claude-code@2.1.197) embeds the model
catalogue it uses for every platform (tests/claude_code_catalogue.py reads it). This test fails
when a model Claude Code knows is missing from ours, when our Bedrock (inference profile), Vertex
or Foundry spelling differs from Claude Code's, when our window is smaller than the one Claude
Code counts with (the proxy would refuse what Claude Code sends), or when a beta Claude Code
itself sends to a platform is one we drop there. On failure it names every entry to add, as rows
to paste into proxy/core/catalogue_data.py: upgrading Claude Code is a matter of reading the
failure. It prints how many entries it compared.
"""

from __future__ import annotations

from functools import cache

import pytest

from proxy.core.catalogue import RULE, Catalogue
from proxy.core.catalogue_data import BETA_1M, MODELS
from proxy.formats.bridging import ACCEPTED
from tests import claude_code_catalogue as cc
from tests.foundry_fake import FOUNDRY_BETAS
from tests.platform_fakes import BEDROCK_BETAS, VERTEX_BETAS

CATALOGUE = Catalogue()
ROOT = cc.REPO


@cache
def _bundle_models() -> list[cc.CcModel]:
    path = cc.bundle()
    if path is None:
        pytest.skip("Claude Code's native binary is not installed (.ci/run installs it)")
    return cc.read_models(path)


@cache
def _bundle_betas() -> cc.CcBetas:
    path = cc.bundle()
    if path is None:
        pytest.skip("Claude Code's native binary is not installed (.ci/run installs it)")
    return cc.read_betas(path)


def differences(models: list[cc.CcModel], catalogue: Catalogue) -> list[str]:
    """Every way ``catalogue`` disagrees with Claude Code's ``models``, one line each (a missing
    model as the row to add)."""
    out: list[str] = []
    for m in models:
        resolved = catalogue.resolve(m.first_party)
        if not resolved.known:
            out.append(
                f"missing: {m.id} -> Model({m.first_party!r}, ..., bedrock="
                f"{(m.bedrock or '').partition('.')[2] or None!r}, vertex={m.vertex!r},"
                f" foundry={m.foundry!r}, source='ids: Claude Code catalogue')"
            )
            continue
        if catalogue.anthropic(m.id) != m.first_party:
            out.append(f"{m.id}: Claude Code's name for it reads as {catalogue.anthropic(m.id)!r}")
        for platform, theirs in (("bedrock", m.bedrock), ("vertex", m.vertex), ("foundry", m.foundry)):
            known = getattr(resolved, platform)
            if theirs is None:
                if known.origin != RULE:
                    out.append(f"{m.id}: {platform} {known.value!r}, Claude Code knows none")
                continue
            ours = catalogue.bedrock(m.first_party, theirs.partition(".")[0]) if platform == "bedrock" else known.value
            if ours != theirs:
                out.append(f"{m.id}: {platform} {ours!r}, Claude Code {theirs!r}")
        window = catalogue.window(m.first_party)
        if m.window is not None and window < m.window:
            out.append(f"{m.id}: window {window}, Claude Code counts {m.window}")
        if m.supports_1m_beta and catalogue.window(m.first_party, [BETA_1M]) < 1_000_000:
            out.append(f"{m.id}: Claude Code uses the 1M beta with it; our window with it is smaller")
    return out


def test_every_model_claude_code_knows_is_ours_spelled_as_claude_code_spells_it() -> None:
    models = _bundle_models()
    problems = differences(models, CATALOGUE)
    compared = sum(1 for m in models for p in (m.bedrock, m.vertex, m.foundry) if p)
    print(
        f"\ncompared {len(models)} models of Claude Code {cc.installed_version()} with ours"
        f" ({compared} platform spellings; ours has {len(MODELS)} rows)"
    )
    assert problems == [], "\n".join(problems)


def test_the_comparison_names_what_is_missing_or_spelled_otherwise() -> None:
    """The oracle can fail: a catalogue without a row, or with one platform id wrong, is named."""
    opus = cc.CcModel(
        "claude-opus-4-8", "claude-opus-4-8", "us.anthropic.claude-opus-4-8", "claude-opus-4-8",
        "claude-opus-4-8", 1_000_000, True,
    )
    assert differences([opus], CATALOGUE) == []
    without = Catalogue(rows=[r for r in MODELS if r.id != "claude-opus-4-8"])
    [missing] = differences([opus], without)
    assert missing.startswith("missing: claude-opus-4-8 -> Model('claude-opus-4-8'")
    assert "bedrock='anthropic.claude-opus-4-8'" in missing
    wrong = Catalogue(
        rows=[r if r.id != "claude-opus-4-8" else type(r)(r.id, bedrock="anthropic.claude-opus-4-8-v1:0",
              vertex=r.vertex, foundry="opus", context_window=200_000) for r in MODELS]
    )
    assert differences([opus], wrong) == [
        "claude-opus-4-8: bedrock 'us.anthropic.claude-opus-4-8-v1:0', Claude Code 'us.anthropic.claude-opus-4-8'",
        "claude-opus-4-8: foundry 'opus', Claude Code 'claude-opus-4-8'",
        "claude-opus-4-8: window 200000, Claude Code counts 1000000",
        "claude-opus-4-8: Claude Code uses the 1M beta with it; our window with it is smaller",
    ]


def test_every_beta_claude_code_sends_to_a_platform_is_accepted_there() -> None:
    betas = _bundle_betas()
    print(
        f"\nClaude Code {cc.installed_version()} sends {len(betas.vertex)} betas to Vertex,"
        f" {len(betas.bedrock)} in Bedrock's body: {sorted(betas.vertex)}"
    )
    assert "effort-2025-11-24" in betas.vertex and "claude-code-20250219" in betas.vertex
    assert sorted(betas.vertex - ACCEPTED["vertex"]) == []
    assert sorted(betas.bedrock - ACCEPTED["bedrock"]) == []
    # the platform fakes refuse none of them either (their own copies of the platforms' lists)
    assert sorted(betas.vertex - VERTEX_BETAS) == []
    assert sorted(betas.bedrock - BEDROCK_BETAS) == []


def test_foundry_gets_claude_codes_betas_as_the_claude_api_does() -> None:
    """Claude Code sends Foundry its first-party betas (no third-party filter there), so a beta
    it sends in Foundry mode must be one we accept for Foundry: tests/test_claude_code_foundry.py
    checks that on a real run (none dropped); here, that the bundle still says so, and that the
    Foundry fake's own copy refuses none of ours."""
    path = cc.bundle()
    if path is None:
        pytest.skip("Claude Code's native binary is not installed (.ci/run installs it)")
    providers = cc.read_full_beta_providers(path)
    assert "foundry" in providers and "firstParty" in providers, providers
    assert not {"bedrock", "vertex"} & providers
    assert sorted(ACCEPTED["foundry"] - FOUNDRY_BETAS) == []


def test_the_pinned_claude_code_is_the_one_installed() -> None:
    run = (ROOT / ".ci" / "run").read_text()
    assert f"@anthropic-ai/claude-code@{cc.PINNED_VERSION}" in run
    version = cc.installed_version()
    if version is None:
        pytest.skip("Claude Code is not installed (.ci/run installs it)")
    assert version == cc.PINNED_VERSION, "upgrade: bump PINNED_VERSION and .ci/run, then rerun this file"
