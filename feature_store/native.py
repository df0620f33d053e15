"""The compiled data plane (``feature_store._native``, Rust) or its Python reference.

``GroupFormat`` is what the serving path asks for a group's answer bytes. It uses the
Rust extension built with the package, unless ``FEATURE_STORE_NATIVE=off`` (or the
extension is missing), and ``feature_store.serialization.answers`` otherwise. The Rust code
takes only canonical stored forms: for anything else it raises ValueError and the value is
answered by the reference, which also raises the EncodingError a bad value deserves.
Either way the bytes are the same (tests/unit/test_native.py).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any

from feature_store.serialization import Codec, Value
from feature_store.serialization.answers import TYPE_CODES, PureGroupCodec, unpack

if TYPE_CHECKING:
    from feature_store._native import GroupCodec as NativeCodec

log = logging.getLogger(__name__)

NATIVE_ENV = "FEATURE_STORE_NATIVE"
# The serving APIs, as the extension numbers them (its fronts, served rows, the L1's forms)
REST, GRPC, FEAST = 0, 1, 2
_OFF = frozenset({"off", "0", "false", "no"})
STATUS_PATTERNS = 256  # memoized statuses lists per group


def _load() -> ModuleType | None:
    if os.environ.get(NATIVE_ENV, "").strip().lower() in _OFF:
        return None
    try:
        from feature_store import _native
    except ImportError:  # a source tree used without `pip install` (setup.sh builds it)
        log.warning("the native extension is not built; serving with the Python reference")
        return None
    return _native


_native = _load()


def native_enabled() -> bool:
    """Whether answers are made by the Rust extension (else by the Python reference)."""
    return _native is not None


@functools.lru_cache(maxsize=256)
def format_of(codecs: tuple[Codec, ...]) -> GroupFormat:
    """One GroupFormat per list of value types (a codec compares by type and dimension)."""
    return GroupFormat(codecs)


def windows_answerer(
    tile_ms: int,
    longest_ms: int,
    ints: list[bool],
    aggregates: list[tuple[int, int, int, int, int]],
) -> Any:
    """The native ``windows.answer`` of one aggregated group's layout (``_native.Windows``),
    or None when the extension is off."""
    return None if _native is None else _native.Windows(tile_ms, longest_ms, ints, aggregates)


def float32_encoder() -> Callable[[list[float]], list[bytes | None]] | None:
    """The native ``codecs.encode_float32`` of many values (None where the codec would
    raise), for the Spark job's float columns; None when the extension is off."""
    return None if _native is None else _native.encode_float32_many


class GroupFormat:
    """One feature group's stored values as answer bytes; see ``PureGroupCodec``."""

    __slots__ = (
        "_patterns",
        "_statuses",
        "absent_json",
        "absent_present",
        "codecs",
        "native",
        "pure",
    )

    def __init__(self, codecs: Sequence[Codec], *, native: bool | None = None) -> None:
        self.codecs = tuple(codecs)
        self.pure = PureGroupCodec(self.codecs)
        use_native = native_enabled() if native is None else native
        self.native: NativeCodec | None = (
            _native.GroupCodec([(TYPE_CODES[c.type], c.dim or 0) for c in self.codecs])
            if use_native and _native is not None
            else None
        )
        self.absent_present = bytes(len(self.codecs))  # a negative entry: no values
        self.absent_json = b"[" + b",".join([b"null"] * len(self.codecs)) + b"]"
        self._patterns: dict[bytes, bytes] = {}  # one ``present`` object per pattern
        self._statuses: dict[tuple[bytes, bool], bytes] = {}

    def load(
        self, reply: Sequence[bytes | None], proto: bool = False
    ) -> tuple[bytes, bytes, bytes]:
        """``(packed, present, answer)`` of a reply's values (the group's, in order):
        ``answer`` is the values' JSON array, or with ``proto`` their gRPC records.

        Raises EncodingError for a value its codec does not decode. ``present`` is shared
        between entries with the same values missing."""
        loaded = None
        if self.native is not None:
            # ValueError: a form only the reference reads (or a bad value): it decides
            with contextlib.suppress(ValueError):
                loaded = self.native.load(reply if type(reply) is list else list(reply), proto)
        raw, present, answer = self.pure.load(reply, proto) if loaded is None else loaded
        return raw, self._shared(present), answer

    def load_packed(
        self, packed: bytes, first: int, proto: bool = False
    ) -> tuple[tuple[bytes, bytes, bytes], bytes | int | None]:
        """``load`` of the group's values in a packed read (``resp_split``), from item
        ``first`` on, and the group's freshness value, the item after them: its bytes, or
        (read by the native core) its unix seconds where it is a well-formed write time
        (``layout.decode_timestamp``); a malformed one stays bytes, for the caller to name."""
        if self.native is not None:
            try:
                (raw, present, answer), freshness = self.native.load_packed(packed, first, proto)
                return (raw, self._shared(present), answer), freshness
            except ValueError:
                pass
        items = unpack(packed)[first : first + len(self.codecs) + 1]
        if len(items) != len(self.codecs) + 1:
            raise ValueError("the read has fewer values than the group")
        return self.load(items[:-1], proto), items[-1]

    def json(self, raw: bytes) -> bytes:
        """The values' JSON array (what ``load`` makes), from the packed values."""
        if self.native is not None:
            try:
                return self.native.json(raw)
            except ValueError:
                pass
        return b"[" + b",".join(self.pure.json_parts(raw)) + b"]"

    def _shared(self, present: bytes) -> bytes:
        """One object per pattern of missing values, for entries to share."""
        shared = self._patterns.get(present)
        if shared is None and len(self._patterns) < STATUS_PATTERNS:
            shared = self._patterns[present] = present
        return present if shared is None else shared

    def statuses_json(self, present: bytes, stale: bool) -> bytes:
        """The statuses of an entry's values as JSON: "present" (or "stale") and "missing".

        Memoized per pattern of missing values; few patterns occur, and the memo is bounded
        against data that makes many."""
        key = (present, stale)
        found = self._statuses.get(key)
        if found is None:
            mark = b'"stale"' if stale else b'"present"'
            found = b"[" + b",".join(mark if p else b'"missing"' for p in present) + b"]"
            if len(self._statuses) < STATUS_PATTERNS:
                self._statuses[key] = found
        return found

    def json_parts(self, raw: bytes) -> list[bytes]:
        """Each value's JSON, ``null`` for none."""
        if self.native is not None:
            try:
                return self.native.json_parts(raw)
            except ValueError:
                pass
        return self.pure.json_parts(raw)

    def feast_columns(
        self,
        raws: Sequence[bytes | None],
        statuses: Sequence[bytes],
        stamps: Sequence[bytes],
        picks: Sequence[int],
    ) -> list[bytes]:
        """Feast's answer columns of one group (``PureGroupCodec.feast_columns``)."""
        if self.native is not None:
            try:
                return self.native.feast_columns(raws, statuses, stamps, picks)
            except ValueError:
                pass
        return self.pure.feast_columns(raws, statuses, stamps, picks)

    def proto(self, raw: bytes) -> bytes:
        """Every value's ``FeatureRow.values`` record, joined."""
        if self.native is not None:
            try:
                return self.native.proto(raw)
            except ValueError:
                pass
        return self.pure.proto(raw)

    def proto_parts(self, raw: bytes) -> list[bytes]:
        if self.native is not None:
            try:
                return self.native.proto_parts(raw)
            except ValueError:
                pass
        return self.pure.proto_parts(raw)

    def decode(self, reply: Sequence[bytes | None]) -> list[Value | None]:
        """A reply's values (the codecs', in order) as Python objects, as each codec's
        ``fast_decode`` makes them: the store client's read. Raises ValueError (or its
        EncodingError) for a value that does not decode."""
        if self.native is not None:
            with contextlib.suppress(ValueError):  # declined: the codecs decide
                return self.native.values(reply if type(reply) is list else list(reply))  # type: ignore[return-value]
        pairs = zip(self.codecs, reply[: len(self.codecs)], strict=True)
        return [None if r is None else c.fast_decode(r) for c, r in pairs]

    def values(self, raw: bytes) -> tuple[Value | None, ...]:
        """The packed values as Python objects (for library callers and comparisons)."""
        pairs = zip(self.codecs, unpack(raw), strict=True)
        return tuple(None if v is None else c.decode(v) for c, v in pairs)
