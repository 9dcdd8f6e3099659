"""Loader for the shared public HL7 v2 samples (imported by the tests of this folder)."""

from __future__ import annotations

from pathlib import Path

import pytest

SAMPLES_DIR = Path(__file__).resolve().parents[2].parent / "shared" / "hl7-samples"


def sample_files() -> list[Path]:
    return sorted(SAMPLES_DIR.glob("*.hl7")) if SAMPLES_DIR.is_dir() else []


def sample_bytes(prefix: str) -> bytes:
    """The message bytes of sample `prefix` (e.g. "01"), its '#' header lines removed."""
    if not SAMPLES_DIR.is_dir():
        pytest.skip(f"HL7 samples not found at {SAMPLES_DIR}")
    path = next(SAMPLES_DIR.glob(f"{prefix}_*.hl7"))
    lines = path.read_bytes().split(b"\n")
    while lines and lines[0].startswith(b"#"):
        lines.pop(0)
    return b"\n".join(lines)
