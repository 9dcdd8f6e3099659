"""Files only the server's own account may read: exported data and stored blobs are
written 0600 in 0700 directories (issue 32), whatever the process's umask, since they
hold patient data another local account has no business reading."""

from __future__ import annotations

import os
from pathlib import Path
from typing import IO, Any

FILE_MODE = 0o600
DIRECTORY_MODE = 0o700


def private_directory(path: Path) -> Path:
    """``path`` (and missing parents) created 0700; an existing ``path`` made 0700."""
    path.mkdir(mode=DIRECTORY_MODE, parents=True, exist_ok=True)
    os.chmod(path, DIRECTORY_MODE)  # mkdir's mode is masked by the umask
    return path


def private_open(path: Path, mode: str) -> IO[Any]:
    """``open(path, mode)`` for writing ("wb" or "ab"), a new file created 0600."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if "a" in mode else os.O_TRUNC)
    descriptor = os.open(path, flags, FILE_MODE)
    return os.fdopen(descriptor, mode)


def write_private(path: Path, data: bytes) -> None:
    with private_open(path, "wb") as handle:
        handle.write(data)
