"""Ids the server assigns: UUID version 7, time-ordered (resources, events)."""

from __future__ import annotations

import os
import threading
import time
import uuid

_last_id_time = [0, 0]  # (unix ms, counter) of the last id: ids stay in creation order
_id_lock = threading.Lock()


class _RandomPool:
    """Random bits from the OS's CSPRNG, fetched 4 KiB at a time: one ``getrandom`` call
    per 400 ids instead of two per id (a system call cost as much as the rest of
    ``new_id``, ~12 µs a create under load)."""

    def __init__(self) -> None:
        self.buffer = b""
        self.offset = 0

    def take(self, size: int) -> int:
        if self.offset + size > len(self.buffer):
            self.buffer, self.offset = os.urandom(4096), 0
        start = self.offset
        self.offset += size
        return int.from_bytes(self.buffer[start:self.offset], "big")


_random = _RandomPool()


def new_id() -> str:
    """A server-assigned resource id: a UUID version 7 (RFC 9562), time-ordered.

    Ids in creation order make every insert into the (type, id) indexes an append at
    their end instead of a write at a random page (uuid4), which keeps commits small as
    the store grows (bulk loads measured 5-10% faster at 20,000 resources). The 12-bit
    counter after the millisecond timestamp keeps ids made in one millisecond ordered
    (RFC 9562, method 1); 62 bits stay random (the OS's CSPRNG), so ids are not
    guessable.
    """
    with _id_lock:  # one id per random bits, whichever thread asks
        ms = time.time_ns() // 1_000_000
        last_ms, counter = _last_id_time
        if ms <= last_ms:  # the same millisecond (or the clock went back): count on
            ms, counter = last_ms, counter + 1
            if counter > 0xFFF:
                ms, counter = ms + 1, 0
        else:
            counter = _random.take(2) & 0x3FF  # leaves room to count
        _last_id_time[:] = [ms, counter]
        rand = _random.take(8) & ((1 << 62) - 1)
    return str(uuid.UUID(int=(ms << 80) | (0x7 << 76) | (counter << 64) | (0b10 << 62) | rand))


__all__ = ["new_id"]
