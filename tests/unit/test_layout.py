"""The on-Redis format: keys, the shipped Redis config, and the listpack requirement."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import pytest

from feature_store import sample
from feature_store.embedded import server_config
from feature_store.errors import RequestError
from feature_store.layout import LISTPACK_SETTINGS, IdType, entity_key, max_encoded_size
from feature_store.registry import parse_registry
from feature_store.serialization import FeatureType, codec_for
from feature_store.store import listpack_value_needed


def shipped_config() -> dict[str, str]:
    text = resources.files("feature_store").joinpath("redis.conf").read_text()
    pairs = (line.split(None, 1) for line in text.splitlines() if line and line[0] != "#")
    return {k: v.strip() for k, v in pairs}


def test_shipped_and_embedded_configs_hold_the_listpack_settings() -> None:
    shipped = shipped_config()
    embedded = server_config(6379, Path("/tmp"))
    for name, value in LISTPACK_SETTINGS.items():
        assert shipped[name] == value
        assert embedded[name] == value
    assert shipped["appendonly"] == embedded["appendonly"] == "yes"


def test_sample_registry_fits_the_shipped_listpack_limit() -> None:
    needed = listpack_value_needed(sample.registry())
    assert needed == 131  # a 32-dim embedding: tag, length, 128 bytes of floats
    assert needed <= int(LISTPACK_SETTINGS["hash-max-listpack-value"])


@pytest.mark.parametrize("dim", [1, 32, 250, 1000])
def test_max_encoded_size_of_embeddings_is_exact(dim: int) -> None:
    encoded = codec_for(FeatureType.EMBEDDING, dim).encode([1.5] * dim)
    assert max_encoded_size(FeatureType.EMBEDDING, dim) == len(encoded)


def test_listpack_need_grows_with_the_largest_embedding() -> None:
    reg = parse_registry(
        "entities: {u: {prefix: u, id_type: int, ttl: 1}}\n"
        "feature_groups: {g: {entity: u, features: {a: float, e: embedding(300)}}}"
    )
    assert listpack_value_needed(reg) == 1203


def test_keys() -> None:
    assert entity_key("c", IdType.INT, 42) == b"c:42"
    assert entity_key("c", IdType.INT, -7) == b"c:-7"
    assert entity_key("store", IdType.STRING, "sf-01 é") == "store:sf-01 é".encode()
    with pytest.raises(RequestError):
        entity_key("c", IdType.INT, 1.0)
    with pytest.raises(RequestError):
        entity_key("c", IdType.STRING, 1)
