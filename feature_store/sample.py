"""Deterministic sample data in the standard benchmark shape (see sample_features.yaml).

Each entity's values depend only on (seed, entity id), so any slice of entities can be
generated on its own (one Spark partition, one benchmark process) and still match.

The shape follows real nightly features:
- 40 float32 features, about 60% exactly 0.0. The non-zero ones are a mix: counts kept as
  floats, money with two decimals, ratios k/n, and unrounded scores.
- 5 int64 features: small counts, epoch seconds, large ids.
- 3 int lists of 10 to 30 ids drawn with repeats from a vocabulary of 64.
- 2 unit-length float32 embeddings of dimension 32.
"""

from __future__ import annotations

import bisect
import math
import random
from collections.abc import Iterator
from importlib import resources
from pathlib import Path

from feature_store.registry import Registry, parse_registry

ENTITY = "consumer"
GROUP = "consumer_features"
FLOATS = [f"float_{i:02d}" for i in range(40)]
INTS = [f"int_{i}" for i in range(5)]
INT_LISTS = [f"int_list_{i}" for i in range(3)]
EMBEDDINGS = [f"embedding_{i}" for i in range(2)]
EMBEDDING_DIM = 32
ZERO_FRACTION = 0.6
VOCABULARY = range(1000, 1064)


ACTIVITY_GROUP = "consumer_activity"
ACTIVITY_FEATURES = [
    "orders_1h",
    "spend_1h",
    "basket_mean_1d",
    "max_spend_1d",
    "min_spend_1d",
    "last_stores_7d",
]


def activity_registry_text(
    prefix: str = "c", extra_groups: str = "", extra_entities: str = ""
) -> str:
    """A registry of docs/aggregations.md's example: an entity type ``consumer`` (join key
    ``consumer_id``) and its group of window aggregations ``consumer_activity``, then
    ``extra_entities`` and ``extra_groups`` (YAML, indented as entries)."""
    return f"""\
entities:
  consumer: {{prefix: {prefix}, id_type: int, ttl: 30d, join_key: consumer_id}}
{extra_entities}feature_groups:
  consumer_activity:
    entity: consumer
    aggregations:
      tile: 1m
      allowed_lateness: 10m
      features:
        orders_1h:      {{function: count, window: 1h}}
        spend_1h:       {{function: sum,  of: order_total, window: 1h}}
        basket_mean_1d: {{function: mean, of: basket_size, window: 1d}}
        max_spend_1d:   {{function: max,  of: order_total, window: 1d}}
        min_spend_1d:   {{function: min,  of: order_total, window: 1d}}
        last_stores_7d: {{function: last_n, n: 5, of: store_id, window: 7d}}
{extra_groups}"""


# what ``--registry`` (and FEATURE_STORE_REGISTRY) names this registry by, in every command
NAME = "sample"


def registry_path() -> Path:
    """The packaged file of the sample registry."""
    return Path(str(resources.files("feature_store").joinpath("sample_features.yaml")))


def resolve(registry: str | Path) -> Path:
    """A command's ``--registry``: a file, or ``sample`` for the built-in one."""
    return registry_path() if str(registry) == NAME else Path(registry)


def registry_text() -> str:
    return registry_path().read_text("utf-8")


def registry() -> Registry:
    return parse_registry(registry_text(), source="feature_store/sample_features.yaml")


def _float(rng: random.Random, kind: int) -> float:
    if rng.random() < ZERO_FRACTION:
        return 0.0
    if kind == 0:  # a count, kept as float
        return float(rng.randint(1, 500))
    if kind == 1:  # money
        return round(rng.lognormvariate(3.0, 1.0), 2)
    if kind == 2:  # a ratio k/n
        n = rng.randint(1, 200)
        return rng.randint(0, n) / n
    return rng.gauss(0.0, 1.0)  # a score: full precision


def _embedding(rng: random.Random) -> list[float]:
    v = [rng.gauss(0.0, 1.0) for _ in range(EMBEDDING_DIM)]
    norm = math.sqrt(sum(x * x for x in v)) or 1.0
    return [x / norm for x in v]


def features(entity_id: int, seed: int = 0) -> dict[str, object]:
    """The 50 feature values of one entity."""
    rng = random.Random(seed * 1_000_003 + entity_id)
    out: dict[str, object] = {name: _float(rng, i % 4) for i, name in enumerate(FLOATS)}
    out[INTS[0]] = rng.randint(0, 1000)
    out[INTS[1]] = rng.randint(1_600_000_000, 1_800_000_000)
    out[INTS[2]] = rng.randint(0, 2**40)
    out[INTS[3]] = rng.randint(-1000, 1000)
    out[INTS[4]] = rng.choice((0, 1, 2, 3))
    for name in INT_LISTS:
        out[name] = [rng.choice(VOCABULARY) for _ in range(rng.randint(10, 30))]
    for name in EMBEDDINGS:
        out[name] = _embedding(rng)
    return out


def rows(n: int, seed: int = 0, start: int = 0) -> Iterator[tuple[int, dict[str, object]]]:
    """``(entity_id, features)`` for ids start .. start+n-1."""
    for entity_id in range(start, start + n):
        yield entity_id, features(entity_id, seed)


# The standard shape as a team on Feast declares it: what `feature-store import-feast` reads
# and what the Feast benchmarks serve (feast_repo writes it into a repository).
FEAST_DEFINITIONS = """\
from datetime import timedelta

from feast import Entity, FeatureService, FeatureView, Field, FileSource, PushSource, ValueType
from feast.types import Array, Float32, Int64

consumer = Entity(
    name="consumer",
    join_keys=["consumer_id"],
    value_type=ValueType.INT64,
    description="A consumer of the marketplace.",
)
source = FileSource(
    name="consumer_source", path="data/consumer.parquet", timestamp_field="event_timestamp"
)
push = PushSource(name="consumer_push", batch_source=source)
schema = (
    [Field(name=f"float_{i:02d}", dtype=Float32) for i in range(40)]
    + [Field(name=f"int_{i}", dtype=Int64) for i in range(5)]
    + [Field(name=f"int_list_{i}", dtype=Array(Int64)) for i in range(3)]
    + [Field(name=f"embedding_{i}", dtype=Array(Float32), vector_length=32) for i in range(2)]
)
consumer_features = FeatureView(
    name="consumer_features",
    entities=[consumer],
    ttl=timedelta(hours=36),
    schema=schema,
    source=push,
    description="Nightly consumer features.",
)
consumer_small = FeatureService(
    name="consumer_small", features=[consumer_features[["int_0", "embedding_0"]]]
)
"""


def feast_repo(
    path: Path,
    online_store: str,
    entities: int = 0,
    seed: int = 0,
    event_time: float = 0.0,
    definitions: str = FEAST_DEFINITIONS,
) -> Path:
    """A Feast repository of the standard shape at ``path``: ``feature_store.yaml`` with
    ``online_store`` (its YAML block, indented), the definitions (``definitions``: other
    ones), and, with ``entities``, ``data/consumer.parquet`` of that many rows at unix time
    ``event_time`` (needs pandas). Run ``feast apply`` in it to register them."""
    (path / "data").mkdir(parents=True, exist_ok=True)
    (path / "feature_store.yaml").write_text(
        "project: standard_shape\nprovider: local\nregistry: data/registry.db\n"
        f"online_store:\n{online_store}\noffline_store:\n  type: file\n"
        "entity_key_serialization_version: 3\n"
    )
    (path / "definitions.py").write_text(definitions)
    if entities:
        import pandas as pd  # type: ignore[import-untyped]

        data = list(rows(entities, seed))
        names = FLOATS + INTS + INT_LISTS + EMBEDDINGS
        pd.DataFrame(
            {
                "consumer_id": [i for i, _ in data],
                **{n: [values[n] for _, values in data] for n in names},
                "event_timestamp": [pd.Timestamp(event_time, unit="s", tz="UTC")] * len(data),
            }
        ).to_parquet(path / "data" / "consumer.parquet")
    return path


class Zipf:
    """Zipfian ids over [0, n) (YCSB's default request distribution, constant 0.99)."""

    def __init__(self, n: int, theta: float = 0.99, seed: int = 0) -> None:
        self.rng = random.Random(seed)
        weights = [1.0 / (i + 1) ** theta for i in range(n)]
        total = 0.0
        self.cdf = []
        for w in weights:
            total += w
            self.cdf.append(total)
        self.total = total
        # scatter popular ids over the key space, as YCSB's scrambled zipfian does
        self.order = list(range(n))
        random.Random(seed + 1).shuffle(self.order)

    def sample(self, k: int) -> list[int]:
        return [
            self.order[bisect.bisect_left(self.cdf, self.rng.random() * self.total)]
            for _ in range(k)
        ]
