"""Serving: REST and gRPC batch lookups behind an in-process L1 cache."""
