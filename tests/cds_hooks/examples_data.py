"""The CDS Hooks specification's own examples (copied from the spec and the Hook Library
into ``examples/``; each ``.src.txt`` names its source), as test data."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

EXAMPLES = Path(__file__).resolve().parent / "examples"
JSON = dict[str, Any]


def example(name: str) -> Any:
    """An example file; the Hook Library's fragments (``"context": {...}``) are wrapped
    in braces as their source notes say."""
    text = (EXAMPLES / name).read_text()
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return json.loads("{" + text + "}")


def hook_context(hook: str, number: int = 1) -> JSON:
    return example(f"hook-context.{hook}.example{number}.json")["context"]  # type: ignore[no-any-return]


def hook_request(hook: str, context: JSON, prefetch: JSON | None = None, **extra: Any) -> JSON:
    request: JSON = {"hook": hook, "hookInstance": str(uuid.uuid4()), "context": context}
    if prefetch is not None:
        request["prefetch"] = prefetch
    request.update(extra)
    return request
