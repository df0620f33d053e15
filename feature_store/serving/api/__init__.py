"""The serving API: the REST app and its routes (``app``, ``rest_api``, Feast's
``feast_api``), the gRPC servicer (``grpc_server``), the answers' bytes (``wire``,
``json_answer``, ``schemas``) and the ASGI path of the hot POSTs (``fast``). What REST and
gRPC share sits below them, in ``feature_store.serving``: ``service`` (validation,
lookups, push writes) and ``auth``."""
