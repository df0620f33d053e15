"""The serving API: the REST app and its routes (``app``, ``rest_api``, Feast's
``feast_api``), the gRPC servicer (``grpc_server``), what REST and gRPC share
(``service``: validation, lookups, push writes; ``auth``), the answers' bytes (``wire``,
``json_answer``, ``schemas``) and the ASGI path of the hot POSTs (``fast``)."""
