"""Batch ingest: the nightly PySpark job that writes feature values into Redis."""
