"""Types of the Rust extension built from native/src/lib.rs (see feature_store.native)."""

from collections.abc import Sequence

class GroupCodec:
    def __init__(self, types: list[tuple[int, int]]) -> None: ...
    def load(
        self, reply: list[bytes | None], proto: bool = False
    ) -> tuple[bytes, bytes, bytes]: ...
    def load_packed(
        self, packed: bytes, first: int, proto: bool = False
    ) -> tuple[tuple[bytes, bytes, bytes], bytes | int | None]: ...
    def values(self, reply: list[bytes | None]) -> list[object]: ...
    def json_parts(self, raw: bytes) -> list[bytes]: ...
    def picked_rows(
        self,
        ids: Sequence[object],
        rows: Sequence[Sequence[object]],
        now: int,
        max_age: int | None,
        group_json: bytes,
        picks: Sequence[int],
    ) -> bytes: ...
    def feast_columns(
        self,
        raws: Sequence[bytes | None],
        statuses: Sequence[bytes],
        stamps: Sequence[bytes],
        picks: Sequence[int],
    ) -> list[bytes]: ...
    def json(self, raw: bytes) -> bytes: ...
    def proto(self, raw: bytes) -> bytes: ...
    def proto_parts(self, raw: bytes) -> list[bytes]: ...

def float32_json(x: float) -> bytes: ...
def float64_json(x: float) -> bytes: ...

class ReadPlan:
    def __init__(self, fields: list[bytes], whole: bool) -> None: ...

def resp_scan(buf: bytes, pos: int, count: int) -> tuple[int, int]: ...
def resp_split(buf: bytes, plans: list[ReadPlan]) -> list[bytes | str]: ...
def rest_rows(
    ids: Sequence[int | str],
    rows: Sequence[Sequence[tuple[object, bool]]],
    now: int,
    max_age: int | None,
    group_json: bytes,
) -> bytes: ...
def grpc_rows(
    ids: Sequence[int | str],
    rows: Sequence[Sequence[tuple[object, bool]]],
    now: int,
    max_age: int | None,
    group: bytes,
) -> bytes: ...
def encode_float32_many(values: list[float]) -> list[bytes | None]: ...

class GrpcCall:
    """One call to the native gRPC front's hot method."""

    @property
    def request(self) -> bytes: ...
    @property
    def authorization(self) -> str | None: ...
    @property
    def request_id(self) -> str: ...
    @property
    def command(self) -> bytes: ...
    @property
    def count(self) -> int: ...
    @property
    def loading(self) -> bool: ...
    @property
    def keys(self) -> list[bytes]: ...
    def reply(self, message: bytes) -> None: ...
    def fail(self, code: int, message: str) -> None: ...
    def replies(self, buf: bytes, start: int, end: int) -> None: ...
    def loaded(self) -> None: ...

class ServedLog:
    """The serving log's queue of a worker's native fronts, and their request ids
    (native/src/front/served.rs)."""

    def __init__(self, prefix: str, threshold: int, capacity: int, logging: bool) -> None: ...
    # (api, request id, served at in unix ms, source: 0 the L1, 1 Redis, the answer)
    def take(self) -> list[tuple[int, str, int, int, bytes]]: ...
    @property
    def dropped(self) -> int: ...
    def sampled(self, request_id: str) -> bool: ...

# a column of LogColumns.finish: its kind, validity bitmap, offsets (i32) and values
LogBuffers = tuple[int, bytes, bytes, bytes]

class LogColumns:
    """The serving log's rows of one form, as Arrow's buffers (native/src/logrows.rs)."""

    def __init__(self, kinds: list[int], group_names: list[str], int_ids: bool) -> None: ...
    @property
    def rows(self) -> int: ...
    def add_rest(
        self,
        answer: bytes,
        request_id: str,
        served_at_ms: int,
        now: int,
        api: int,
        sources: bytes,
    ) -> int: ...
    def add_grpc(
        self,
        answer: bytes,
        request_id: str,
        served_at_ms: int,
        now: int,
        api: int,
        sources: bytes,
    ) -> int: ...
    # request ids, served at (i64), apis, sources, ids, per feature (values, statuses),
    # per group its event times
    def finish(
        self,
    ) -> tuple[
        LogBuffers,
        bytes,
        bytes,
        bytes,
        LogBuffers,
        list[tuple[LogBuffers, bytes]],
        list[LogBuffers],
    ]: ...

def grpc_head(answer: bytes) -> int: ...

class GrpcFront:
    """HTTP/2 + gRPC on a thread of its own (native/src/front/grpc.rs)."""

    def __init__(
        self,
        listen_fd: int,
        wake_fd: int,
        method: str,
        backend: str,
        max_request: int,
        keys: tuple[list[tuple[bytes, int]], int],
        role: int,
        served: ServedLog,
        tls: tuple[bytes, bytes, bytes | None] | None = None,
        hits: HitCache | None = None,
    ) -> None: ...
    def take(self) -> list[GrpcCall]: ...
    @property
    def redis(self) -> FrontRedis: ...
    def stop(self, grace: float) -> None: ...

class RestCall:
    """One POST to a fast route of the native REST front."""

    @property
    def route(self) -> int: ...
    @property
    def authorization(self) -> str | None: ...
    @property
    def request_id(self) -> str: ...
    @property
    def body(self) -> bytes: ...
    @property
    def command(self) -> bytes: ...
    @property
    def count(self) -> int: ...
    @property
    def loading(self) -> bool: ...
    @property
    def keys(self) -> list[bytes]: ...
    def respond(self, status: int, body: bytes, headers: list[tuple[str, str]]) -> None: ...
    def replies(self, buf: bytes, start: int, end: int) -> None: ...
    def loaded(self) -> None: ...

class RestFront:
    """HTTP/1.1 on a thread of its own (native/src/front/rest.rs)."""

    def __init__(
        self,
        listen_fd: int,
        wake_fd: int,
        routes: list[tuple[str, int, list[tuple[int, bytes, list[tuple[str, str]]]]]],
        keys: tuple[list[tuple[bytes, int]], int],
        backend: str,
        max_body: int,
        body_timeout: float,
        header_timeout: float,
        served: ServedLog,
        tls: tuple[bytes, bytes, bytes | None] | None = None,
        hits: tuple[list[tuple[int, int]], HitCache] | None = None,
    ) -> None: ...
    def take(self) -> list[RestCall]: ...
    @property
    def redis(self) -> FrontRedis: ...
    def stop(self, grace: float) -> None: ...

# (function, field or -1, window ms, n, answer type code)
WindowAggregate = tuple[int, int, int, int, int]
# an aggregated group's share of a planned read: tile ms, longest window ms, each field's
# values int64, its aggregates, and the aggregates read
WindowShare = tuple[int, int, list[bool], list[WindowAggregate], list[int]]

class Windows:
    def __init__(
        self, tile_ms: int, longest_ms: int, ints: list[bool], aggregates: list[WindowAggregate]
    ) -> None: ...
    def answer(self, data: bytes, now_ms: int) -> tuple[list[bytes | None], int | None]: ...

class HitCache:
    """Lookups on the fronts' threads (native/src/hits/): the worker's L1, or (``planning``)
    the Redis commands and answers of lookups without the L1."""

    def __init__(
        self,
        max_ids: int,
        max_string_id: int,
        shadow_fraction: float,
        seed: int = 0,
        planning: bool = False,
        compact: bool = False,
    ) -> None: ...
    def define_read(
        self,
        read: int,
        fields: list[bytes],
        whole: bool,
        types: list[tuple[int, int]],
        counts: list[int] | None = None,
        windows: list[WindowShare | None] | None = None,
    ) -> None: ...
    def plan(
        self,
        body: bytes,
        replies: bytes | None = None,
        grpc: bool = False,
        feast: bool = False,
    ) -> tuple[bytes, int, bytes | None] | None: ...
    def learn(
        self,
        api: int,
        entity: str,
        features: list[str],
        groups: list[str],
        parts: list[tuple[int, int | None, list[int] | None, bytes]],
        head: bytes,
        prefix: bytes,
        int_ids: bool,
        order: list[int] | None = None,
    ) -> bool: ...
    def put_many(
        self,
        items: list[
            tuple[
                bytes,
                bytes | None,
                bytes | None,
                bytes | None,
                bytes,
                int | None,
                float,
                float,
                float,
                float,
            ]
        ],
    ) -> int: ...
    def put_fault(self, key: bytes, ttl: float, fault: bytes) -> None: ...
    def entry(
        self, key: bytes, touch: bool = True
    ) -> (
        tuple[
            bytes | None,
            bytes | None,
            bytes | None,
            bytes,
            int | None,
            float,
            float,
            float,
            bytes | None,
            bool,
            bool,
        ]
        | None
    ): ...
    def add_answers(
        self, key: bytes, json: bytes | None = None, wire: bytes | None = None
    ) -> tuple[bool, int]: ...
    def claim(self, keys: list[bytes]) -> PythonLoad: ...
    def discard(self, key: bytes) -> bool: ...
    def clear(self) -> None: ...
    def expire_all(self) -> None: ...
    def notice_group(self, group: int) -> None: ...
    def notice_again(self, key: bytes, notice_in: float) -> None: ...
    def mark_shadowed(self, key: bytes) -> None: ...
    def __len__(self) -> int: ...
    def drain(
        self,
    ) -> tuple[
        list[tuple[list[float], int, int, int]],
        int,
        int,
        list[bytes],
        list[bytes],
        tuple[int, int, int, int, int, int, int, int, int],
    ]: ...
    def load_misses(
        self,
        ttl: float,
        negative_ttl: float,
        jitter: float,
        refresh_ahead: float,
        wait: float,
        max_stale: float,
    ) -> bool: ...
    def bound(self, max_bytes: int, max_entries: int) -> int: ...
    def size(self) -> tuple[int, int, int]: ...
    def keys(self, group: int) -> list[bytes]: ...
    def answer(self, body: bytes, grpc: bool = False, feast: bool = False) -> bytes | None: ...
    def missing(
        self, body: bytes, grpc: bool = False, feast: bool = False
    ) -> list[bytes] | None: ...
    def replay(
        self, body: bytes, keys: list[bytes], grpc: bool = False, feast: bool = False
    ) -> bytes | None: ...

class PythonLoad:
    """Keys a load of Python's claimed in the L1's single flight (``HitCache.claim``)."""

    def end(self) -> None: ...
    def __len__(self) -> int: ...
    def elsewhere(self) -> list[bytes]: ...

class FrontRedis:
    """A front's own Redis connections for planned reads and the L1's loads
    (native/src/front/links.rs, redis.rs)."""

    def add(self, fd: int, node: int = 0) -> None: ...
    def route(self, table: bytes | None) -> None: ...
    def redirects(self) -> int: ...
    def set(
        self,
        allowed: bool,
        timeouts: list[tuple[int | None, float]],
        flush_keys: int,
        node: int = 0,
    ) -> None: ...
    def drain(self, node: int = 0) -> tuple[int, list[tuple[float, int]], int]: ...
    def refresh_outdated(self, cache: HitCache, keys: list[bytes]) -> list[bytes]: ...
    def notify(self, load: PythonLoad, fd: int, timeout: float) -> None: ...

def key_slot(key: bytes) -> int: ...
def key_role(keys: list[tuple[bytes, int]], open: int, authorization: str | None) -> int | None: ...
