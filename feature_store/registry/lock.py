"""The lock file beside a registry (``features.lock`` for ``features.yaml``): what has been
deployed, each entity type's prefix and id type and each feature's type. Redis keeps the
bytes of the old type until they expire, so changing a deployed feature's type in place is
refused at load; rename the feature instead (see README "Changing a feature")."""

from __future__ import annotations

from pathlib import Path

import orjson

from feature_store.errors import RegistryLockError
from feature_store.registry.model import Registry, entries_fingerprint, lock_entries

LOCK_VERSION = 1


def default_lock_path(registry_path: str | Path) -> Path:
    return Path(registry_path).with_suffix(".lock")


def _read_lock(lock_path: Path) -> dict[str, dict[str, object]]:
    try:
        doc = orjson.loads(lock_path.read_bytes())
    except (OSError, orjson.JSONDecodeError) as e:
        raise RegistryLockError(f"{lock_path}: cannot read the lock file: {e}") from None
    if not isinstance(doc, dict) or doc.get("version") != LOCK_VERSION:
        raise RegistryLockError(f"{lock_path}: not a version {LOCK_VERSION} lock file")
    entities = doc.get("entities")
    if not isinstance(entities, dict):
        raise RegistryLockError(f"{lock_path}: 'entities' is missing")
    return entities


def lock_conflicts(registry: Registry, lock_path: Path) -> list[str]:
    """Every way the registry contradicts what the lock file says is deployed."""
    deployed = _read_lock(lock_path)
    conflicts = []
    for name, now in lock_entries(registry).items():
        before = deployed.get(name)
        if not isinstance(before, dict):
            continue  # a new entity type
        for key in ("prefix", "id_type"):
            if before.get(key) != now[key]:
                conflicts.append(
                    f"entities.{name}.{key}: changed from {before.get(key)!r} to {now[key]!r}"
                )
        old_features = before.get("features", {})
        new_features = now["features"]
        assert isinstance(old_features, dict)
        assert isinstance(new_features, dict)
        for fname, sig in new_features.items():
            old = old_features.get(fname)
            if old is not None and old != sig:
                f = registry.features_of(name)[fname]
                conflicts.append(
                    f"feature_groups.{f.group}.features.{fname}: type changed from {old} to {sig}"
                )
    return conflicts


def check_against_lock(registry: Registry, lock_path: Path) -> None:
    conflicts = lock_conflicts(registry, lock_path)
    if conflicts:
        raise RegistryLockError(
            f"{registry.source}: incompatible with what {lock_path} says is deployed:\n  "
            + "\n  ".join(conflicts)
            + "\nRedis still holds values in the old format. Rename the feature (e.g. add _v2)"
            " so it gets a new field, or, once no old values remain, accept the change with"
            " 'feature-store registry lock --accept-changes'."
        )


def write_lock(registry: Registry, lock_path: Path, *, accept_changes: bool = False) -> str:
    """Record the registry as deployed and return its fingerprint.

    Features that left the registry stay in the lock, so bringing a name back with another
    type is still caught. Refuses conflicts unless ``accept_changes``.
    """
    entries = lock_entries(registry)
    if lock_path.exists():
        if not accept_changes:
            check_against_lock(registry, lock_path)
        for name, before in _read_lock(lock_path).items():
            now = entries.get(name)
            if now is None:
                entries[name] = before
                continue
            old_features = before.get("features", {})
            new_features = now["features"]
            assert isinstance(old_features, dict)
            assert isinstance(new_features, dict)
            now["features"] = {**old_features, **new_features}
    fp = entries_fingerprint(entries)
    doc = {"version": LOCK_VERSION, "fingerprint": fp, "entities": entries}
    lock_path.write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS))
    return fp
