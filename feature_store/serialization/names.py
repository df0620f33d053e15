"""Feature names become 4-byte xxHash32 field names.

Raw 4 bytes beat the decimal text of the same hash in Redis's listpack encoding: listpack
stores a decimal string as an integer, and hashes of 2**31 or more (about half) need its
9-byte int64 form. Measured by benchmarks/memory.py; see benchmarks/results/memory.md.
"""

from __future__ import annotations

import xxhash

FIELD_SEED = 0  # part of the storage contract: changing it renames every field


def field_name(name: str) -> bytes:
    """The Redis hash field of a feature: xxh32 of its UTF-8 name, 4 bytes big-endian."""
    return xxhash.xxh32_digest(name.encode("utf-8"), seed=FIELD_SEED)
