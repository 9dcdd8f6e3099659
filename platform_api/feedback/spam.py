"""Simple spam checks for anonymous feedback: no links, no text sent again, no floods of
one character or word, a sensible size. Each refusal names the check (422
``SPAM_REJECTED`` with ``field`` text).

Repeats are found by a fingerprint of the normalized text (case, spacing and punctuation
folded, SHA-256): the same text sent anonymously again within ``REPEAT_WINDOW`` is
refused. Only the fingerprint is kept for that, beside the feedback itself.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections import Counter

MIN_CHARS = 10
MAX_CHARS = 2000
REPEAT_WINDOW_SECONDS = 24 * 3600
LINK = re.compile(r"(https?://|www\.|\b[a-z0-9-]+\.(com|net|org|info|biz|ru|xyz|top|io)\b"
                  r"|\[url|<a\s)", re.IGNORECASE)
RUN = re.compile(r"(.)\1{9,}")  # one character ten times or more
WORD = re.compile(r"\w+", re.UNICODE)


def normalized(text: str) -> str:
    folded = unicodedata.normalize("NFKC", text).casefold()
    return " ".join(WORD.findall(folded))


def fingerprint(text: str) -> str:
    return hashlib.sha256(normalized(text).encode()).hexdigest()


def spam_reason(text: str) -> str | None:
    """Why ``text`` looks like spam (None when it does not)."""
    stripped = text.strip()
    if len(stripped) < MIN_CHARS:
        return f"the text is shorter than {MIN_CHARS} characters"
    if len(stripped) > MAX_CHARS:
        return f"the text is longer than {MAX_CHARS} characters"
    if LINK.search(stripped):
        return "anonymous feedback may not contain links"
    if RUN.search(stripped):
        return "the text repeats one character over and over"
    words = WORD.findall(stripped.casefold())
    if len(words) >= 8 and Counter(words).most_common(1)[0][1] > len(words) / 2:
        return "the text repeats one word over and over"
    return None


__all__ = ["MAX_CHARS", "MIN_CHARS", "REPEAT_WINDOW_SECONDS", "fingerprint", "normalized",
           "spam_reason"]
