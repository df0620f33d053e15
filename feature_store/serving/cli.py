"""``feature-store serve``: the REST API (uvicorn) and the gRPC API of one or more workers.

Imports nothing heavy at module level: fastapi, uvicorn and grpc load inside ``run_serve``.

Every worker process runs the REST app and, in the app's lifespan, a gRPC server on the
same gRPC port (SO_REUSEPORT lets the kernel spread connections over the workers), and has
its own L1 cache. With ``--workers 1`` (the default) everything runs in this process.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import os
import shutil
import signal
import socket
import ssl
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from feature_store import sample
from feature_store.commands import add_durability_arg, add_redis_args, redis_url, settings_from
from feature_store.errors import ConfigError

if TYPE_CHECKING:
    from feature_store.registry import Registry
    from feature_store.serving.api.fast import FastPath
    from feature_store.serving.config import ServingSettings
    from feature_store.settings import Settings


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "serve",
        help="serve features over REST and gRPC",
        description="Serve batch feature lookups over REST (uvicorn) and gRPC, behind an "
        "in-process L1 cache. Settings come from these flags, then FEATURE_SERVING_* and "
        "FEATURE_STORE_* variables (docs/serving.md). API keys: FEATURE_SERVING_READ_KEYS and "
        "FEATURE_SERVING_ADMIN_KEYS, comma-separated.",
    )
    p.add_argument(
        "--registry",
        help=f"the registry file (default: FEATURE_STORE_REGISTRY, else features.yaml); "
        f"'{sample.NAME}' serves the built-in sample registry",
    )
    p.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="REST port (default 8000)")
    p.add_argument("--grpc-port", type=int, help="gRPC port (default 50051)")
    p.add_argument("--no-grpc", action="store_true", help="do not serve gRPC")
    p.add_argument("--workers", type=int, help="worker processes (default 1)")
    p.add_argument("--no-cache", action="store_true", help="disable the L1 cache")
    p.add_argument("--cache-ttl", type=float, help="L1 TTL in seconds (default 30)")
    p.add_argument("--cache-max-bytes", type=int, help="L1 bound in bytes (default 256 MiB)")
    p.add_argument(
        "--cache-form",
        choices=("answers", "compact"),
        help="answers: entries keep their answer bytes (default); compact: the packed values "
        "only, about half the memory, each hit writing its answer",
    )
    p.add_argument("--max-entities", type=int, help="entity ids per request (default 1000)")
    p.add_argument("--tls-cert", help="PEM certificate (chain): TLS on both ports")
    p.add_argument("--tls-key", help="PEM private key of --tls-cert")
    p.add_argument(
        "--tls-client-ca", help="PEM CA: clients must present a certificate it signed (mTLS)"
    )
    p.add_argument(
        "--feature-log",
        metavar="URL",
        help="log every served entity (a row per entity of each sampled lookup) to "
        "file:///DIR (parquet, rolled) or kafka://HOST:PORT/TOPIC (JSON); see docs/logging.md",
    )
    p.add_argument(
        "--feature-log-sample",
        type=float,
        metavar="FRACTION",
        help="share of lookups logged, chosen by request id (default 1.0)",
    )
    p.add_argument(
        "--feature-log-roll-seconds",
        type=float,
        metavar="SECONDS",
        help="a log file is closed and renamed into place this long after its first row "
        "(default 60): a worker killed loses at most this long of rows",
    )
    p.add_argument("--log-level", default="warning", help="uvicorn's log level")
    add_redis_args(p)
    add_durability_arg(p, "a push write")
    p.set_defaults(func=run_serve)


def run_serve(args: argparse.Namespace) -> int:
    from feature_store.serving.config import ServingSettings

    core = settings_from(args)
    registry_path = args.registry if args.registry is not None else str(core.registry)
    serving = ServingSettings.from_env(
        host=args.host,
        port=args.port,
        grpc_port=args.grpc_port,
        workers=args.workers,
        cache=False if args.no_cache else None,
        cache_ttl=args.cache_ttl,
        cache_max_bytes=args.cache_max_bytes,
        cache_form=args.cache_form,
        max_entities=args.max_entities,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        tls_client_ca=args.tls_client_ca,
        feature_log=args.feature_log,
        feature_log_sample=args.feature_log_sample,
        feature_log_roll_seconds=args.feature_log_roll_seconds,
    )
    if args.no_grpc:
        serving = dataclasses.replace(serving, grpc_port=None)
    _load(registry_path)  # fail now, with the registry's own message, not in a worker
    if serving.grpc_port is not None and importlib.util.find_spec("grpc_health") is None:
        raise ConfigError(
            "gRPC serving needs the grpc extra (pip install 'feature-store[grpc]'); "
            "or pass --no-grpc"
        )
    # uvicorn re-raises SIGTERM after its graceful shutdown; with the default handler that
    # kills the process before the embedded Redis below is stopped. Exit cleanly instead.
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        _serve(args, core, serving, registry_path)
    finally:
        signal.signal(signal.SIGTERM, previous)
    return 0


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(0)


def _serve(
    args: argparse.Namespace,
    core: Settings,
    serving: ServingSettings,
    registry_path: str,
) -> None:
    import uvicorn

    from feature_store.serving.api.http import HeaderDeadlineProtocol
    from feature_store.serving.config import WORKER_ENV
    from feature_store.serving.fronts.rest import rest_front_kind

    if serving.grpc_port:
        check_port_free(serving.host, serving.grpc_port, "gRPC")
    with redis_url(core) as url:
        config = {
            "serving": orjson.loads(serving.to_json()),
            "redis_url": url,
            "registry": registry_path,
            "socket_timeout": core.socket_timeout,
            "connect_timeout": core.connect_timeout,
            "max_connections": core.max_connections,
            "redis_retries": core.redis_retries,
            "write_durability": core.write_durability,
        }
        grpc_note = f", gRPC on {serving.host}:{serving.grpc_port}" if serving.grpc_port else ""
        scheme = "http" if serving.tls_cert is None else "https"
        tls_note = "" if serving.tls_cert is None else " (TLS on both ports)"
        print(
            f"serving REST on {scheme}://{serving.host}:{serving.port}{grpc_note}{tls_note}, "
            f"{serving.workers} worker(s), Redis {url}",
            flush=True,
        )
        common: dict[str, Any] = {
            "http": HeaderDeadlineProtocol,
            "log_level": args.log_level,
            "access_log": False,
            "timeout_graceful_shutdown": 5,
        }
        with _siblings(config, serving.workers):
            if rest_front_kind(serving) == "native":
                # the front (each worker's) takes the REST port; uvicorn serves the rest of the
                # app behind it on a loopback socket bound here, which the workers share
                check_port_free(serving.host, serving.port, "REST")
                backend = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                backend.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                backend.bind(("127.0.0.1", 0))
                backend.listen(2048)
                config["rest_backend"] = backend.getsockname()[1]
                _serve_behind_front(config, serving.workers, backend, common)
            elif serving.workers == 1:
                uvicorn.run(
                    _app_from_config(config),
                    host=serving.host,
                    port=serving.port,
                    **common,
                    **_tls(serving),
                )
            else:
                os.environ[WORKER_ENV] = orjson.dumps(config).decode()
                with _metrics_dir():
                    uvicorn.run(
                        "feature_store.serving.cli:worker_app",
                        factory=True,
                        host=serving.host,
                        port=serving.port,
                        workers=serving.workers,
                        **common,
                        **_tls(serving),
                    )


def _serve_behind_front(
    config: dict[str, object], workers: int, backend: socket.socket, common: dict[str, Any]
) -> None:
    """uvicorn on the loopback socket ``backend`` (what ``uvicorn.run`` does with a socket
    it binds itself: one Server, or its Multiprocess supervisor over the workers)."""
    import uvicorn
    from uvicorn.supervisors import Multiprocess

    from feature_store.serving.config import WORKER_ENV

    host, port = backend.getsockname()
    if workers == 1:
        app = _app_from_config(config)
        server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, **common))
        server.run(sockets=[backend])
        if not server.started:
            sys.exit(3)  # uvicorn's STARTUP_FAILURE, as uvicorn.run exits
        return
    os.environ[WORKER_ENV] = orjson.dumps(config).decode()
    with _metrics_dir():
        worker = uvicorn.Config(
            "feature_store.serving.cli:worker_app",
            factory=True,
            host=host,
            port=port,
            workers=workers,
            **common,
        )
        Multiprocess(worker, sockets=[backend]).run()


def _tls(serving: ServingSettings) -> dict[str, Any]:
    """uvicorn's TLS arguments for the REST port (none without TLS)."""
    if serving.tls_cert is None:
        return {}
    out: dict[str, Any] = {"ssl_certfile": serving.tls_cert, "ssl_keyfile": serving.tls_key}
    if serving.tls_client_ca is not None:
        out.update(ssl_ca_certs=serving.tls_client_ca, ssl_cert_reqs=ssl.CERT_REQUIRED)
    return out


@contextlib.contextmanager
def _siblings(config: dict[str, object], workers: int) -> Iterator[None]:
    """With several workers, the directory where each marks that it answers (siblings.py):
    the server is ready when all of them do."""
    if workers == 1:
        yield
        return
    path = tempfile.mkdtemp(prefix="feature-serving-workers-")
    config["workers_dir"] = path
    try:
        yield
    finally:
        shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def _metrics_dir() -> Iterator[None]:
    """Where the workers' metrics meet (prometheus-client's multiprocess mode): a fresh
    directory for this server, or the one PROMETHEUS_MULTIPROC_DIR names (kept as it is)."""
    from feature_store.serving.metrics import MULTIPROCESS_ENV

    if os.environ.get(MULTIPROCESS_ENV):
        yield
        return
    path = tempfile.mkdtemp(prefix="feature-serving-metrics-")
    os.environ[MULTIPROCESS_ENV] = path
    try:
        yield
    finally:
        del os.environ[MULTIPROCESS_ENV]
        shutil.rmtree(path, ignore_errors=True)


def check_port_free(host: str, port: int, what: str) -> None:
    """Refuse a port another process serves. Binding without SO_REUSEPORT fails on a port
    held by any socket, also one that a server bound with SO_REUSEPORT (which would
    otherwise let a second server join it and take part of its connections)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        # as servers bind: connections of a server that just stopped do not count
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as e:
            raise ConfigError(f"the {what} port {host}:{port} is in use ({e.strerror})") from None


def _load(path: str) -> Registry:
    from feature_store.registry import load_registry

    return load_registry(sample.resolve(path))


def _app_from_config(config: dict[str, object]) -> FastPath:
    from feature_store.connection import RedisTarget
    from feature_store.durability import Durability
    from feature_store.serving.api.http import HeaderDeadlineProtocol
    from feature_store.serving.config import ServingSettings
    from feature_store.serving.runtime import ServingRuntime
    from feature_store.serving.worker import create_app

    serving = ServingSettings.from_json(orjson.dumps(config["serving"]).decode())
    HeaderDeadlineProtocol.header_timeout = serving.request_header_timeout
    target = RedisTarget.parse(
        str(config["redis_url"]),
        socket_timeout=float(config["socket_timeout"]),  # type: ignore[arg-type]
        connect_timeout=float(config["connect_timeout"]),  # type: ignore[arg-type]
        max_connections=int(config["max_connections"]),  # type: ignore[call-overload]
        retries=int(config["redis_retries"]),  # type: ignore[call-overload]
        durability=Durability.parse(str(config.get("write_durability", ""))),
    )
    runtime = ServingRuntime(_load(str(config["registry"])), target, serving)
    if config.get("workers_dir"):
        from feature_store.serving.siblings import Siblings

        runtime.siblings = Siblings(Path(str(config["workers_dir"])), serving.workers)
    backend = config.get("rest_backend")
    return create_app(
        runtime,
        grpc_port=serving.grpc_port,
        rest_backend=int(backend) if backend is not None else None,  # type: ignore[call-overload]
    )


def worker_app() -> FastPath:
    """The app of one worker process of ``serve --workers N`` (uvicorn's factory)."""
    from feature_store.serving.config import WORKER_ENV

    return _app_from_config(orjson.loads(os.environ[WORKER_ENV]))
