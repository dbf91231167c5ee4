"""Where the read-only shared data lives: ``../shared`` beside the repository (as on the
developers' machines and in CI), or ``$CONTEXT_PROXY_SHARED``."""

from __future__ import annotations

import os
from pathlib import Path

SHARED = Path(os.environ.get("CONTEXT_PROXY_SHARED") or Path(__file__).resolve().parents[2] / "shared")
DATA = SHARED / "data"
TRANSCRIPTS = DATA / "transcripts"
CC_TRANSCRIPT = TRANSCRIPTS / "cc_mclaude_3af9b1a7_with_autocompact_full.json"
TRAVERSAL_PAYLOADS = DATA / "traversal-payloads.json"
