"""The serving API's clients, importable here as before: they live in ``feature_store.client``
(beside the server package, not inside it: a model server needs none of the server). Every
public name of that module is found here (PEP 562), the same objects."""

from typing import Any

from feature_store import client as _client

__all__ = _client.__all__


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(_client, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
