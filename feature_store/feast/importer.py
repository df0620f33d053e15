"""``feature-store import-feast``: a Feast repository's definitions as this project's registry.

Feast's SDK reads the repository (its ``feature_store.yaml`` and the registry that ``feast
apply`` wrote); ``feature_store.feast.mapping`` maps what it declares. A repository whose
online store is this project's plugin (``feature_store.feast.online_store``) gets the plugin's
mapping, with the key prefixes it pinned in Redis.

Feast is an optional dependency (``pip install 'feature-store[feast]'``), imported only here
and in the plugin.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from feature_store.errors import RegistryError
from feature_store.feast.mapping import DEFAULT_ENTITY_TTL, short_prefixes, to_registry
from feature_store.registry import parse_registry

__all__ = ["import_feast", "register", "run", "short_prefixes", "to_registry"]


def import_feast(repo_path: Path, entity_ttl: str = DEFAULT_ENTITY_TTL) -> str:
    """The registry YAML of the Feast repository at ``repo_path`` (Feast's SDK reads it)."""
    try:
        import feast
    except ImportError:
        raise RegistryError(
            "import-feast needs Feast's SDK: pip install 'feature-store[feast]'"
        ) from None
    if not (repo_path / "feature_store.yaml").is_file():
        raise RegistryError(f"{repo_path}: no feature_store.yaml; is this a Feast repository?")
    store = feast.FeatureStore(repo_path=str(repo_path))
    if type(store.config.online_store).__name__ == "FeatureStoreRedisOnlineStoreConfig":
        # the repository writes this project's layout (feature_store.feast.online_store): its
        # mapping, with the key prefixes pinned in its Redis, is the one to serve
        from feature_store.feast.online_store import FeatureStoreRedisOnlineStore

        return FeatureStoreRedisOnlineStore().layout(store.config, store.registry).text
    views = [*store.list_feature_views(), *store.list_stream_feature_views()]
    return to_registry(
        store.list_entities(),
        views,
        store.list_feature_services(),
        store.list_on_demand_feature_views(),
        entity_ttl=entity_ttl,
        source=str(repo_path),
    )


def run(args: argparse.Namespace) -> int:
    output: Path = args.output
    if output.exists() and not args.force:
        raise RegistryError(f"{output} exists; pass --force to replace it")
    text = import_feast(args.repo_path, args.entity_ttl)
    output.write_text(text)
    registry = parse_registry(text, str(output))
    features = sum(len(g.features) for g in registry.groups.values())
    print(
        f"wrote {output}: {len(registry.entities)} entity type(s), {len(registry.groups)} "
        f"feature group(s), {features} features, {len(registry.services)} feature service(s)"
    )
    for g in registry.groups.values():
        print(
            f"  load {g.name}: feature-store ingest --registry {output} --group {g.name} "
            f"--id-column {g.entity.join_key} --ignore-extra-columns --input PATH",
            file=sys.stderr,
        )
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "import-feast",
        help="write a registry from a Feast repository's definitions (needs the feast extra)",
    )
    p.add_argument("repo_path", type=Path, help="the Feast repository (with feature_store.yaml)")
    p.add_argument("--output", type=Path, required=True, help="the registry YAML to write")
    p.add_argument(
        "--entity-ttl",
        default=DEFAULT_ENTITY_TTL,
        help="TTL of each entity's hash; at least its views' largest ttl (default 7d)",
    )
    p.add_argument("--force", action="store_true", help="replace --output if it exists")
    p.set_defaults(func=run)
