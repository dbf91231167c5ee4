"""The test fixtures taken from the project's shared data, shipped inside the repository
(``tests/data``) so that a fresh clone passes with nothing beside it. Licences: the Claude Code
transcript and session are CC0-1.0, the SWE-agent and tau-bench trajectories MIT; the licence texts
and the origin of each file are in ``tests/data/transcripts/LICENSES`` and the README files there.

``$CONTEXT_PROXY_SHARED`` may name another copy of the shared folder (its ``data/`` is used)."""

from __future__ import annotations

import os
from pathlib import Path

_override = os.environ.get("CONTEXT_PROXY_SHARED")
DATA = Path(_override) / "data" if _override else Path(__file__).resolve().parent / "data"
TRANSCRIPTS = DATA / "transcripts"
CC_TRANSCRIPT = TRANSCRIPTS / "cc_mclaude_3af9b1a7_with_autocompact_full.json"
CC_SESSION_FILE = DATA / "claude-code-sessions" / "3af9b1a7-6512-4883-ad18-320658ced099.jsonl"
TRAVERSAL_PAYLOADS = DATA / "traversal-payloads.json"
