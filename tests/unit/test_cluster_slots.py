"""A key's Redis Cluster hash slot in the native core (native/src/front/slots.rs) against
redis-py's (``redis.crc.key_slot``: CRC16/XMODEM of the hash tag or the key, modulo 16,384),
and a cluster URL pointed at one of its nodes. Against Redis's own ``CLUSTER KEYSLOT``:
tests/integration/test_cluster_dataplane.py."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from redis.crc import key_slot as redis_py_slot

from feature_store.native import native_enabled
from feature_store.serving.l1.roundtrip import node_url

BRACES = st.lists(st.sampled_from([b"{", b"}", b"a", b"bc", b":", b"\x00", b"\xff"]), max_size=16)


@pytest.mark.skipif(not native_enabled(), reason="the extension is off")
@given(st.one_of(st.binary(max_size=64), BRACES.map(b"".join)))
def test_the_native_slot_is_redis_pys(key: bytes) -> None:
    from feature_store._native import key_slot

    assert key_slot(key) == redis_py_slot(key)


@pytest.mark.skipif(not native_enabled(), reason="the extension is off")
def test_hash_tags() -> None:
    from feature_store._native import key_slot

    assert key_slot(b"c:{user1}:a") == key_slot(b"user1") == key_slot(b"x{user1}")
    assert key_slot(b"c:{}x") != key_slot(b"")  # an empty tag: the whole key
    assert key_slot(b"123456789") == 12739  # CRC16/XMODEM's check value, 0x31C3, mod 16,384


def test_a_node_url_keeps_the_scheme_credentials_and_options() -> None:
    assert node_url("redis://127.0.0.1:7000", "10.0.0.2", 7001) == "redis://10.0.0.2:7001"
    assert (
        node_url("rediss://user:secret@seed:7000/0?ssl_cert_reqs=none", "n2", 7002)
        == "rediss://user:secret@n2:7002/0?ssl_cert_reqs=none"
    )
    assert node_url("redis://:pw@seed:7000", "::1", 7003) == "redis://:pw@[::1]:7003"
