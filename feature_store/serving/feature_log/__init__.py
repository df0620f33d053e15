"""The serving log: a row per served entity, so that training sets are made from what the
models were served (``feature-store training-set``) and online values can be checked
against offline ones.

Every lookup has a request id: the client's (``x-request-id`` header or gRPC metadata, 1 to
128 visible ASCII characters) or one the worker makes (a prefix of its own and a counter),
sent back in the same header or metadata. With ``--feature-log``, a lookup whose id is
sampled (xxh32 of the id below the fraction: the same requests on every worker and on the
native fronts) is offered to the log with its answer's bytes. Serving never waits for the
log:

- The offer appends to a bounded queue per worker (``FEATURE_SERVING_FEATURE_LOG_QUEUE_BYTES``
  of answers; the
  native fronts keep one of their own, ``_native.ServedLog``). A full queue drops the
  answer and counts it.
- The worker's log thread takes both queues, reads each answer (REST's JSON, gRPC's
  protobuf, Feast's JSON) into rows, one per entity, and hands them to the sink.

The rows' values are the answer's values, read back from the bytes the client got. A row:
``request_id``, ``served_at`` (ms), ``api`` (rest, grpc, feast), ``entity_id``, ``source``
(l1: every group from the L1; redis: some read from Redis for this lookup), and per feature
of the entity type ``<group>__<feature>`` (null when not asked or not present) and
``<group>__<feature>__status`` (present, missing, stale, error; null when not asked), and
per group ``<group>__event_time`` (the served second minus the answer's age: whole seconds).

Sinks (``--feature-log URL``):

- ``file:///DIR``: parquet under ``DIR/entity_type=<name>/date=YYYY-MM-DD/hour=HH/``, one
  schema per entity type (every feature of it), written to a hidden ``.part-*.tmp`` name
  and renamed to ``part-*.parquet`` when rolled (``--feature-log-roll-seconds``, or
  ``--feature-log-roll-bytes``): readers (pyarrow, pandas, Spark) skip hidden files, so
  they never see a partial one. A worker killed loses its open files' rows: at most a roll
  interval, plus its queue.
- ``kafka://HOST:PORT/TOPIC``: a JSON record per row, produced asynchronously (librdkafka's
  own bounded buffer; full, the row is dropped and counted). ``feature-store log-sink``
  writes the topic into the file sink's layout.
"""

from feature_store.serving.feature_log.ids import REQUEST_ID, given_id, sampled, threshold
from feature_store.serving.feature_log.log import FeatureLog
from feature_store.serving.feature_log.rows import AnswerRows, Served, arrow_schema

__all__ = [
    "REQUEST_ID",
    "AnswerRows",
    "FeatureLog",
    "Served",
    "arrow_schema",
    "given_id",
    "sampled",
    "threshold",
]
