"""The L1 cache and the read path behind it: the cache (``cache``), what a lookup is
answered with (``loader``: single-flight, stale-on-error), coalescing (``flight``), the
round trips to Redis (``reads``, ``roundtrip``) under a circuit breaker and adaptive
timeouts (``breaker``), refresh ahead (``refresh``), invalidation across instances
(``invalidation``), warm start (``warm``), shadow checks (``shadow``) and each group's
read (``spec``)."""
