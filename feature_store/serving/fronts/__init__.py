"""The Python side of the extension's native fronts: how their calls are taken
(``calls``), the REST port (``rest``), the gRPC port (``grpc``), and the lookups the fronts
answer on their own threads: L1 hits from the worker's cache in the extension (``hits``)
and, without the L1, planned reads (``reads``)."""
