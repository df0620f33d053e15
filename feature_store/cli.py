"""The ``feature-store`` command.

Subcommands live beside what they run: each module in ``COMMAND_MODULES`` has a
``register(subparsers)`` that adds its parsers and sets ``func``. Those modules import
only argparse-level code, so ``feature-store --help`` does not start Spark or a web stack.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

from feature_store.errors import FeatureStoreError

COMMAND_MODULES = (
    "feature_store.commands",
    "feature_store.serving.cli",
    "feature_store.ingest.cli",
    "feature_store.feast.importer",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="feature-store", description="Online ML feature store on Redis."
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    level = logging.WARNING - 10 * min(args.verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return int(args.func(args) or 0)
    except FeatureStoreError as e:
        print(f"feature-store {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
