"""Request ids and sampling: a client's id kept or one made, and whether an id is logged
(xxh32 of the id below the fraction's threshold: the same requests on every worker and on
the native fronts)."""

from __future__ import annotations

import xxhash

REQUEST_ID = "x-request-id"
MAX_REQUEST_ID = 128
EVERY = 1 << 32  # the sampling threshold of a fraction of 1.0


def given_id(value: str | None) -> str | None:
    """A client's request id if it is one we keep: 1 to 128 visible ASCII characters."""
    if not value or len(value) > MAX_REQUEST_ID or " " in value:
        return None
    return value if value.isascii() and value.isprintable() else None


def threshold(fraction: float) -> int:
    """The sampling threshold of a fraction: sampled when xxh32(id) < threshold."""
    return EVERY if fraction >= 1.0 else int(fraction * EVERY)


def sampled(request_id: str, limit: int) -> bool:
    """Whether a request id is sampled (deterministic: the same on every worker and front)."""
    return limit >= EVERY or xxhash.xxh32_intdigest(request_id.encode()) < limit
