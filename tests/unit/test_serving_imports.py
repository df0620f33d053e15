"""`feature-store --help` must not load the web or gRPC stacks (they load inside `serve`)."""

from __future__ import annotations

import subprocess
import sys


def test_the_cli_parser_imports_no_web_or_grpc_stack() -> None:
    code = (
        "import sys; from feature_store.cli import build_parser; p = build_parser(); "
        "p.parse_args(['serve', '--registry', 'sample']); "
        "heavy = [m for m in ('fastapi', 'uvicorn', 'grpc', 'starlette', 'httpx') "
        "if m in sys.modules]; print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_the_client_module_imports_neither_transport_until_used() -> None:
    code = (
        "import sys; import feature_store.client; "
        "print(','.join(m for m in ('grpc', 'httpx', 'fastapi', 'uvicorn') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_the_package_exports_its_public_names() -> None:
    import feature_store.client as client
    import feature_store.serving as serving
    import feature_store.serving.client as old_client

    assert set(client.__all__) - {"TlsConfig"} <= set(serving.__all__)
    assert all(hasattr(serving, name) for name in serving.__all__)
    # the clients' old home still gives every public name, the same objects
    assert old_client.__all__ == client.__all__
    assert all(getattr(old_client, n) is getattr(client, n) for n in client.__all__)
