"""One serving worker, assembled: the runtime, the REST app (``app``) behind ``FastPath``,
and what answers beside uvicorn during the app's life: the gRPC server, the native REST
front, and the lookups answered on the fronts' threads (cache hits with the L1 on, planned
reads with it off); stopped in the reverse order.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from fastapi import FastAPI

from feature_store.native import FEAST, REST
from feature_store.serving.api.app import api_app
from feature_store.serving.api.fast import FastPath
from feature_store.serving.api.feast_api import LOOKUP as FEAST_LOOKUP
from feature_store.serving.api.feast_api import FeastFront
from feature_store.serving.api.rest_api import RestHandlers
from feature_store.serving.auth import Authenticator
from feature_store.serving.fronts.hits import NativeHits
from feature_store.serving.fronts.reads import FrontReads, planned_reads
from feature_store.serving.l1.native_cache import NativeCache
from feature_store.serving.runtime import ServingRuntime, tune_gc

if TYPE_CHECKING:
    from feature_store._native import RestCall

log = logging.getLogger(__name__)


def create_app(
    runtime: ServingRuntime, *, grpc_port: int | None = None, rest_backend: int | None = None
) -> FastPath:
    """The app of one worker. With ``grpc_port``, its lifespan also runs the gRPC server;
    with ``rest_backend`` (the loopback port uvicorn serves this app on), the native REST
    front on the REST port (``rest_front``)."""
    settings = runtime.settings
    auth = Authenticator(settings.read_keys, settings.admin_keys)
    handlers = RestHandlers(runtime, auth)
    fronts = Fronts(runtime, handlers, grpc_port, rest_backend)
    app, routes = api_app(runtime, handlers, auth, fronts.lifespan, fronts.feast)
    fronts.fast = FastPath(
        app, routes, auth, settings.max_body_bytes, settings.request_body_timeout
    )
    return fronts.fast


class Fronts:
    """The worker's lifespan: the runtime, then what answers beside uvicorn (the gRPC
    server, the native REST front, the cache hits answered on the fronts' threads); stopped
    in the reverse order."""

    def __init__(
        self,
        runtime: ServingRuntime,
        handlers: RestHandlers,
        grpc_port: int | None,
        rest_backend: int | None,
    ) -> None:
        self.runtime = runtime
        self.handlers = handlers
        self.grpc_port = grpc_port
        self.rest_backend = rest_backend
        self.fast: FastPath | None = None  # the app the native REST front passes on to
        self.feast = FeastFront()  # what the native REST front needs of Feast's lookups

    @contextlib.asynccontextmanager
    async def lifespan(self, app: FastAPI) -> AsyncIterator[None]:
        runtime, settings = self.runtime, self.runtime.settings
        await runtime.start()
        hits = self._hits()
        grpc_server = None
        if self.grpc_port is not None:
            from feature_store.serving.fronts.grpc import start_grpc_server

            grpc_server = await start_grpc_server(runtime, settings.host, self.grpc_port, hits)
        rest = None
        if self.rest_backend is not None:
            from feature_store.serving.fronts.calls import listen
            from feature_store.serving.fronts.rest import NativeRestFront

            assert self.fast is not None
            if hits is not None:
                self.handlers.learn = hits.learner(REST)
                self.feast.learn = hits.learner(FEAST)
            sock = listen(settings.host, settings.port, settings.workers > 1, "REST")
            rest = NativeRestFront(
                self.fast,
                sock,
                self.rest_backend,
                settings,
                hits,
                self._fail_planned,
                runtime.served.native,
            )
            log.info("REST on %s:%d (native front)", settings.host, settings.port)
        if hits is not None:
            hits.start()
        tune_gc(settings)
        if runtime.siblings is not None:
            runtime.siblings.join()  # answers on every port: its sockets are bound
        try:
            yield
        finally:
            if runtime.siblings is not None:
                runtime.siblings.leave()
            if rest is not None:
                await rest.stop(grace=1.0)
            if grpc_server is not None:
                await grpc_server.stop(grace=1.0)
            await runtime.save_warm()  # before the fronts' own entries go with them
            if hits is not None:
                await hits.close()
            await runtime.stop()

    def _hits(self) -> NativeHits | FrontReads | None:
        """Lookups answered on the fronts' threads, with a native front (REST, or gRPC on
        the native front) to answer them: cache hits with the L1 on (``NATIVE_HITS``),
        planned reads with it off (``NATIVE_READS``)."""
        settings = self.runtime.settings
        native_grpc = False
        if self.grpc_port is not None:
            from feature_store.serving.fronts.grpc import front_kind

            native_grpc = front_kind(settings) == "native"
        if self.rest_backend is None and not native_grpc:
            return None
        if self.runtime.reader.cache is None:
            return FrontReads(self.runtime) if planned_reads(self.runtime) else None
        if not isinstance(self.runtime.reader.cache, NativeCache):
            return None  # the L1 in Python (the reference): Python answers every lookup
        return NativeHits(self.runtime) if settings.native_hits else None

    def _fail_planned(self, call: RestCall, error: BaseException, t0: float) -> None:
        """A planned lookup whose round trip failed: its handler's error answer (this
        API's, or Feast's)."""
        assert self.fast is not None
        feast = list(self.fast.routes)[call.route] == FEAST_LOOKUP and self.feast.fail
        answer = (feast or self.handlers.fail)(error, "get", t0)
        call.respond(answer.status, answer.body, list(answer.headers))
