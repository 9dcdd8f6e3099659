"""Attachment rules (R4 Attachment): ``size`` is the number of bytes of the data and
``hash`` its SHA-1 digest in base64; when the data is inline both can be checked.

``data`` itself is a base64Binary checked as a primitive; when it does not decode,
nothing is said here (one issue for one problem).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from typing import Any


def attachment_problems(attachment: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(element, IssueType code, message) for each disagreement of ``size`` or ``hash``
    with ``data``."""
    data = attachment.get("data")
    if not isinstance(data, str):
        return []
    try:
        content = base64.b64decode("".join(data.split()), validate=True)
    except (binascii.Error, ValueError):
        return []
    found = []
    size = attachment.get("size")
    if isinstance(size, int) and not isinstance(size, bool) and size != len(content):
        found.append(("size", "value", f"the size {size} does not match the data, which "
                      f"is {len(content)} bytes"))
    digest = attachment.get("hash")
    if isinstance(digest, str):
        expected = base64.b64encode(hashlib.sha1(content).digest()).decode()
        if "".join(digest.split()) != expected:
            found.append(("hash", "value", "the hash does not match the data (it must be "
                          f"the base64 SHA-1 of the data: {expected})"))
    return found
