"""Spark's side of the store: the nightly job and the backfill of window aggregations
(``job``, ``task``, ``backfill``), the stream writer (``stream``), the encoders and the
retrying writer they share (``encode``, ``writer``), sample data (``generate``) and the
commands (``cli``)."""
