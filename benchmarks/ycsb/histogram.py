"""The YCSB field-length histogram of this project's real encoded value sizes.

Encodes the sample data (``feature_store.sample``, the standard benchmark shape) with the
project's codecs and counts the byte length of every stored value. YCSB's
``fieldlengthdistribution=histogram`` then draws value sizes from it, so a YCSB record's
fields are as long as real feature values: mostly 1-byte zeros, short numbers, Snappy int
lists and 131-byte embeddings.

The file format is the one ``site.ycsb.generator.HistogramGenerator`` (YCSB 0.17.0) reads:

    BlockSize<TAB>1
    0<TAB><count>      bucket i holds the values of (i + 1) blocks: the generator returns
    1<TAB><count>      (i + 1) * BlockSize for bucket i, and never 0
    ...
    M<TAB>0            the last bucket is folded into the one before it (the generator
                       returns M * BlockSize for it), so it must be empty

Buckets are contiguous from 0 because the reader inserts each line at its bucket's index.
Usage: python3 benchmarks/ycsb/histogram.py [--entities N] [--seed S] [--out FILE]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for _project_env
import _project_env  # noqa: F401  (re-runs this script in the project's .venv)

from feature_store import sample


def encoded_sizes(entities: int, seed: int) -> Counter[int]:
    """How many sample values encode to each byte length."""
    features = sample.registry().groups[sample.GROUP].features
    sizes: Counter[int] = Counter()
    for _, values in sample.rows(entities, seed=seed):
        for f in features:
            sizes[len(f.codec.encode(values[f.name]))] += 1
    return sizes


def histogram_lines(sizes: Counter[int]) -> list[str]:
    """The file's lines, block size 1. An empty value (none in the sample) counts as 1 byte."""
    counts = Counter({max(1, size): n for size, n in sizes.items()})
    largest = max(counts)
    lines = ["BlockSize\t1"]
    lines += [f"{size - 1}\t{counts.get(size, 0)}" for size in range(1, largest + 1)]
    lines.append(f"{largest}\t0")
    return lines


def summary(sizes: Counter[int]) -> str:
    values = sorted(sizes.elements())
    q = statistics.quantiles(values, n=100)
    return (
        f"{len(values):,} values: mean {statistics.fmean(values):.1f} B, median {q[49]:.0f} B, "
        f"p95 {q[94]:.0f} B, max {values[-1]} B, {sizes[1] / len(values):.0%} are 1 byte"
    )


def write_histogram(path: Path, entities: int = 2000, seed: int = 0) -> str:
    """Write the histogram file and return a one-line summary of the sizes."""
    sizes = encoded_sizes(entities, seed)
    path.write_text("\n".join(histogram_lines(sizes)) + "\n", encoding="ascii")
    return summary(sizes)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entities", type=int, default=2000, help="sample entities to encode")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--out", type=Path, default=Path("fieldlength.hist"), help="the histogram file"
    )
    args = parser.parse_args(argv)
    print(f"{args.out}: {write_histogram(args.out, args.entities, args.seed)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
