"""The gRPC port: grpc.aio serving ``FeatureServicer`` (health checking and reflection
beside it) and, by default, the extension's HTTP/2 front before it (``NativeFront``,
native/src/front/grpc.rs), which answers GetFeatures and passes every other method through
to grpc.aio on a loopback port.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from typing import TYPE_CHECKING

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from feature_store.errors import ConfigError
from feature_store.native import GRPC, native_enabled
from feature_store.proto.v1 import serving_pb2 as pb
from feature_store.serving.api.grpc_server import (
    MAX_MESSAGE,
    REFLECTION_V1,
    SERVICE,
    FeatureServicer,
    parser,
    reflection_v1,
    server_credentials,
)
from feature_store.serving.auth import Role
from feature_store.serving.config import ServingSettings, tls_pem
from feature_store.serving.fronts.calls import QueuedCalls, listen
from feature_store.serving.fronts.hits import FrontLookups, NativeHits
from feature_store.serving.fronts.reads import FrontReads
from feature_store.serving.runtime import ServingRuntime

if TYPE_CHECKING:
    from feature_store._native import GrpcCall

log = logging.getLogger(__name__)


class NativeFront(QueuedCalls):
    """GetFeatures on the extension's HTTP/2 front (``native/src/front/grpc.rs``), answered with
    ``FeatureServicer.answer`` (the same code as grpc.aio's method). Other methods reach
    grpc.aio through the front.
    """

    def __init__(
        self,
        servicer: FeatureServicer,
        sock: socket.socket,
        backend: int,
        hits: FrontLookups | None = None,
    ) -> None:
        from feature_store import _native

        super().__init__()
        self.servicer = servicer
        self.backend = backend  # grpc.aio's loopback port
        self.reads = hits if isinstance(hits, FrontReads) else None
        self.l1 = hits if isinstance(hits, NativeHits) else None
        self.proto = True
        self.parse = parser(pb.GetFeaturesRequest)
        settings = servicer.runtime.settings
        self.start(
            lambda wake: _native.GrpcFront(
                sock.detach(),
                wake,
                f"/{SERVICE}/GetFeatures",
                f"127.0.0.1:{backend}",
                settings.max_body_bytes,
                servicer.auth.native(),
                int(Role.READ),
                servicer.runtime.served.native,
                tls_pem(settings),
                hits.native if hits is not None else None,
            ),
            "gRPC port",
        )
        if hits is not None:
            hits.attach(self.front.redis)

    def fail_planned(self, call: GrpcCall, error: BaseException, t0: float) -> None:
        """A planned lookup whose round trip failed: the method's own failure status."""
        code, details = self.servicer.failure(error, "get", t0)
        call.fail(code.value[0], details)

    async def answer(self, call: GrpcCall) -> None:
        t0 = time.perf_counter()
        try:
            request = self.parse(call.request)
            answer = await self.servicer.answer(request, call.authorization, t0, call.request_id)
        except Exception as e:
            code, details = self.servicer.failure(e, "get", t0)
            call.fail(code.value[0], details)
        else:
            call.reply(answer)


class GrpcServer:
    """A started gRPC server (and its native front) plus the task that keeps its health
    status current."""

    def __init__(
        self,
        server: grpc.aio.Server,
        port: int,
        health_task: asyncio.Task[None],
        stopping: asyncio.Event,
        front: NativeFront | None = None,
    ) -> None:
        self.server = server
        self.port = port
        self.front = front
        self._health_task = health_task
        self._stopping = stopping

    async def stop(self, grace: float | None = 1.0) -> None:
        # a cancel can be lost while the tracker's ping waits for a pooled connection under
        # load (the ping's timeout ends as TimeoutError, not CancelledError): the tracker
        # also stops on the event, and its ping is bounded, so this wait is too
        self._stopping.set()
        self._health_task.cancel()
        await asyncio.wait({self._health_task})
        if self.front is not None:
            await self.front.stop(grace or 0.0)
        await self.server.stop(grace)


def front_kind(settings: ServingSettings) -> str:
    """The front that serves GetFeatures: "native" where the extension is on, else grpcio."""
    return "native" if settings.grpc_front == "native" and native_enabled() else "grpcio"


async def start_grpc_server(
    runtime: ServingRuntime, host: str, port: int, hits: FrontLookups | None = None
) -> GrpcServer:
    """Serve on host:port (0: a free port).

    SO_REUSEPORT only with several workers, so that they share the port; ``feature-store
    serve`` first checks that no other process holds it (``cli.check_port_free``). A single
    worker binds without it and fails on a port in use, as the REST port does. With the
    native front, that is the front's port, and grpc.aio listens on a free loopback port
    of its own behind it.
    """
    settings = runtime.settings
    native = front_kind(settings) == "native"
    reuse_port = settings.workers > 1
    sock = listen(host, port, reuse_port, "gRPC") if native else None
    server = grpc.aio.server(
        options=[
            ("grpc.so_reuseport", 1 if reuse_port and not native else 0),
            # 1,000 entities x many features, embeddings included, can pass gRPC's 4 MiB
            ("grpc.max_send_message_length", MAX_MESSAGE),
            ("grpc.max_receive_message_length", settings.max_body_bytes),
        ]
    )
    servicer = FeatureServicer(runtime)
    if hits is not None and native:
        servicer.learn = hits.learner(GRPC)
    server.add_generic_rpc_handlers((servicer.handler(),))
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    names = (
        SERVICE,
        health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
        REFLECTION_V1,
        reflection.SERVICE_NAME,
    )
    reflection.enable_server_reflection(names, server)
    server.add_generic_rpc_handlers((reflection_v1(names),))
    address = "127.0.0.1:0" if native else f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        if settings.tls_cert is not None and not native:
            bound = server.add_secure_port(address, server_credentials(settings))
        else:
            bound = server.add_insecure_port(address)
    except RuntimeError as e:  # grpc raises when the bind fails
        if sock is not None:
            sock.close()
        raise ConfigError(f"cannot serve gRPC on {address}: {e}") from None
    if bound == 0:
        if sock is not None:
            sock.close()
        raise ConfigError(f"cannot serve gRPC on {address}: the port is in use")
    await server.start()
    front = None
    if sock is not None:
        port = sock.getsockname()[1]
        front = NativeFront(servicer, sock, bound, hits)
    else:
        port = bound
    stopping = asyncio.Event()
    task = asyncio.get_running_loop().create_task(_track_health(runtime, health_servicer, stopping))
    log.info("gRPC on %s:%d (%s front)", host, port, "native" if native else "grpcio")
    return GrpcServer(server, port, task, stopping, front)


async def _track_health(
    runtime: ServingRuntime, servicer: health.aio.HealthServicer, stopping: asyncio.Event
) -> None:
    serving = health_pb2.HealthCheckResponse.SERVING
    not_serving = health_pb2.HealthCheckResponse.NOT_SERVING
    while not stopping.is_set():
        status = serving if await runtime.ready() else not_serving
        for name in ("", SERVICE):
            await servicer.set(name, status)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stopping.wait(), 2.0)
