"""Write durability's setting: parsed strictly, checked against WAIT's answer."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from feature_store.durability import ASYNCHRONOUS, DEFAULT_TIMEOUT_MS, Durability
from feature_store.errors import ConfigError, NotDurableError, StoreUnavailableError
from feature_store.settings import Settings


@pytest.mark.parametrize(
    ("text", "replicas", "timeout"),
    [
        ("", 0, DEFAULT_TIMEOUT_MS),
        ("replicas=1", 1, DEFAULT_TIMEOUT_MS),
        ("replicas=2,timeout=250", 2, 250),
        (" timeout = 90ms , replicas = 1 ", 1, 90),
        ("replicas=0", 0, DEFAULT_TIMEOUT_MS),
    ],
)
def test_the_forms_it_takes(text: str, replicas: int, timeout: int) -> None:
    d = Durability.parse(text)
    assert (d.replicas, d.timeout_ms) == (replicas, timeout)
    assert d.asked == (replicas > 0)
    if d.asked:
        assert d.command == ("WAIT", replicas, timeout)
        assert Durability.parse(str(d)) == d  # what it prints, it reads back


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("1", "expected replicas=N[,timeout=MS]"),
        ("replica=1", "not 'replica=1'"),
        ("timeout=100", "replicas=N is missing"),
        ("replicas=one", "replicas='one' is not a whole number"),
        ("replicas=1,replicas=2", "replicas given twice"),
        ("replicas=-1", "must be 0 or more"),
        ("replicas=1,timeout=0", "waits forever"),
    ],
)
def test_a_malformed_setting_says_what_is_wrong(text: str, says: str) -> None:
    with pytest.raises(ConfigError, match=None) as caught:
        Durability.parse(text)
    assert says in str(caught.value)


def test_the_environment_names_the_variable_and_the_timeouts_must_fit() -> None:
    with pytest.raises(ConfigError, match=r"FEATURE_STORE_WRITE_DURABILITY: .*'replica=1'"):
        Settings.from_env({"FEATURE_STORE_WRITE_DURABILITY": "replica=1"})
    # WAIT's timeout inside the socket's, or every slow replica reads as Redis gone
    with pytest.raises(ConfigError, match="shorter than the Redis socket timeout"):
        Settings.from_env({"FEATURE_STORE_WRITE_DURABILITY": "replicas=1,timeout=1000"})
    s = Settings.from_env(
        {"FEATURE_STORE_WRITE_DURABILITY": "replicas=1,timeout=200"},
        redis_url="redis://127.0.0.1:1",
    )
    assert s.redis_target().durability == Durability(1, 200)
    assert Settings.from_env({}, redis_url="redis://127.0.0.1:1").redis_target().durability == (
        ASYNCHRONOUS
    )


@given(st.integers(0, 5), st.one_of(st.integers(-1, 6), st.none(), st.text(max_size=3)))
def test_only_enough_replicas_confirm_a_write(replicas: int, reply: object) -> None:
    d = Durability(replicas, 100)
    if isinstance(reply, int) and reply >= replicas:
        d.check(reply, "the master")
        return
    with pytest.raises(NotDurableError) as caught:
        d.check(reply, "master 127.0.0.1:7000")
    assert isinstance(caught.value, StoreUnavailableError)  # a 503, retried by the jobs
    assert "master 127.0.0.1:7000" in str(caught.value)
    assert "within 100 ms" in str(caught.value)
    if isinstance(reply, int):
        assert f"confirmed by {reply} of {replicas} replica(s)" in str(caught.value)
    else:  # an error in WAIT's place: the write is not said to be applied
        assert f"WAIT on master 127.0.0.1:7000 answered {reply!s}" in str(caught.value)
        assert "applied by" not in str(caught.value)
