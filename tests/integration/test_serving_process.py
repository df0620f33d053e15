"""A server started by ServingProcess that fails says why, without a log file."""

from __future__ import annotations

import pytest

from feature_store.embedded import free_port
from feature_store.errors import FeatureStoreError
from feature_store.serving.process import ServingProcess


def test_a_server_that_exits_names_its_error() -> None:
    with pytest.raises(FeatureStoreError) as failed:
        ServingProcess("redis://127.0.0.1:1", registry="/nonexistent/registry.yaml").start()
    message = str(failed.value)
    assert "exited with 2" in message
    assert "/nonexistent/registry.yaml: cannot read the registry" in message


def test_a_server_that_never_gets_ready_shows_what_it_wrote() -> None:
    unreachable = f"redis://127.0.0.1:{free_port()}"  # nothing listens there
    server = ServingProcess(unreachable, ready_path="/readyz", start_timeout=3)
    with pytest.raises(FeatureStoreError) as failed:
        server.start()
    message = str(failed.value)
    assert "was not ready (/readyz) within 3 s" in message
    assert "Redis is not reachable at startup" in message
    assert server.process is None  # stopped
