"""One reading of a serving worker's /metrics for every test (``metric``), through
prometheus-client's own parser of the text format."""

from __future__ import annotations

import re

import httpx
from prometheus_client.parser import text_string_to_metric_families

from feature_store.serving.process import ServingProcess

SELECTOR = re.compile(r"(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})?")
LABEL = re.compile(r'(\w+)="([^"]*)"')


def metric(source: str | ServingProcess, selector: str, default: float | None = None) -> float:
    """The sum of the samples ``selector`` names, as /metrics writes one: a sample's name
    (``feature_serving_cache_misses_total``), and optionally some of its labels
    (``…_total{api="rest",how="hit"}``): every sample with those labels counts, whatever
    its others. ``source`` is the text of a /metrics answer, or a server to ask for it.

    A metric the worker does not expose at all is an error (a misspelt name must not read
    as 0), unless ``default`` is given; one exposed without samples of those labels yet
    (a labelled counter nothing has counted) is 0."""
    if isinstance(source, ServingProcess):
        source = httpx.get(f"{source.rest_url}/metrics", timeout=5).text
    found = SELECTOR.fullmatch(selector)
    if found is None:
        raise ValueError(f"not a metric selector: {selector!r}")
    name, wanted = found["name"], dict(LABEL.findall(found["labels"] or ""))
    exposed, total = False, 0.0
    for family in text_string_to_metric_families(source):
        # a counter's family is named without its _total, its samples with it; a
        # histogram's samples are its _count, _sum and _bucket
        samples = [s for s in family.samples if s.name == name]
        exposed = exposed or bool(samples) or name in (family.name, f"{family.name}_total")
        total += sum(s.value for s in samples if wanted.items() <= s.labels.items())
    if not exposed:
        if default is not None:
            return default
        raise AssertionError(f"the worker exposes no metric {name}")
    return total
