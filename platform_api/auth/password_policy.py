"""What a new password must be, as NIST SP 800-63B (5.1.1.2, memorized secrets) asks.

- at least ``MIN_LENGTH`` (8) characters; the routes cap the length (1,024) so hashing
  stays cheap; every character is allowed, spaces too (pass phrases);
- not a commonly used or breached password: ``common-passwords.txt.gz`` beside this
  module holds the 8,354 passwords of at least 8 characters among the 20,000 most common
  of the Pwned Passwords corpus, as compiled by Royce Williams and shipped by Django
  (``django/contrib/auth/common-passwords.txt.gz``, BSD-3-Clause, Django Software
  Foundation), compared without regard to case (``Password1`` is ``password1``);
- not made of the context: the account's e-mail address, its local part, the person's
  names or the service's name, alone or with at most four characters around them
  (``Odhiambo2024``, ``amina@clinic`` for amina@clinic.example.org).

No composition rules (no "one digit, one capital"), no periodic change: the guidance
says they make passwords harder to remember, not to guess. A refusal is a 422
``VALIDATION_ERROR`` naming ``password`` and saying why.
"""

from __future__ import annotations

import gzip
from collections.abc import Iterable
from functools import cache
from importlib import resources

from platform_api.auth.errors import validation_error

MIN_LENGTH = 8
# A password that is a context word with at most this many characters added is refused
# (``Odhiambo2024``): a guesser tries the name with a year or a few digits first.
CONTEXT_MARGIN = 4
MIN_CONTEXT_WORD = 4  # shorter names ("Ali", "Wu") occur by chance in good passwords


@cache
def common_passwords() -> frozenset[str]:
    data = resources.files("platform_api.auth").joinpath("common-passwords.txt.gz")
    with data.open("rb") as raw, gzip.open(raw, "rt", encoding="utf-8") as lines:
        return frozenset(line.strip() for line in lines if line.strip())


def check_new_password(password: str, context: Iterable[str] = ()) -> str:
    """``password`` when it may become an account's password; a 422 otherwise."""
    if len(password) < MIN_LENGTH:
        raise validation_error("password", f"password must have at least {MIN_LENGTH} "
                               "characters")
    folded = password.casefold()
    if folded.strip() in common_passwords():
        raise validation_error("password", "this password is one of the most used and "
                               "breached passwords; choose another (a phrase of a few "
                               "words is easy to remember and hard to guess)")
    for word in _context_words(context):
        if word in folded and len(folded) - len(word) <= CONTEXT_MARGIN:
            raise validation_error("password", "the password is too close to your e-mail "
                                   "address, your name or the service's name")
    return password


def _context_words(context: Iterable[str]) -> set[str]:
    words: set[str] = set()
    for item in context:
        text = item.strip().casefold()
        words.add(text)
        local, at, _domain = text.partition("@")
        if at:
            words.add(local)
        words.update(text.replace(".", " ").replace("-", " ").replace("_", " ").split())
    return {w for w in words if len(w) >= MIN_CONTEXT_WORD}
