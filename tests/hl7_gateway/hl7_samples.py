"""Loader for the public HL7 v2 samples in ``tests/data/hl7-samples`` (imported by the
tests of this folder)."""

from __future__ import annotations

from pathlib import Path

SAMPLES_DIR = Path(__file__).resolve().parents[1] / "data" / "hl7-samples"


def sample_files() -> list[Path]:
    return sorted(SAMPLES_DIR.glob("*.hl7"))


def sample_bytes(prefix: str) -> bytes:
    """The message bytes of sample `prefix` (e.g. "01"), its '#' header lines removed."""
    path = next(SAMPLES_DIR.glob(f"{prefix}_*.hl7"))
    lines = path.read_bytes().split(b"\n")
    while lines and lines[0].startswith(b"#"):
        lines.pop(0)
    return b"\n".join(lines)
