"""TLS on both ports, with certificates made at run time by a test CA (openssl).

The project's REST and gRPC clients and curl verify the server against the CA; plaintext
clients, and clients that trust another CA, are refused. With a client CA (mutual TLS) a
client without a certificate that CA signed is refused too.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import grpc
import httpx
import pytest

from feature_store import sample
from feature_store.client import FeatureClient, GrpcFeatureClient, TlsConfig
from feature_store.errors import StoreUnavailableError
from feature_store.proto.v1 import serving_pb2 as pb
from feature_store.proto.v1 import serving_pb2_grpc as pb_grpc
from feature_store.serving.process import ServingProcess
from feature_store.store import FeatureStore

GROUP, ENTITY = sample.GROUP, sample.ENTITY


def _server_args(pki: Path) -> list[str]:
    return ["--tls-cert", str(pki / "server.pem"), "--tls-key", str(pki / "server.key")]


@pytest.mark.parametrize("front", ["native", "grpcio"])
def test_both_ports_speak_tls_and_refuse_plaintext_and_strangers(
    redis_url: str, pki: Path, front: str, grpcurl: str
) -> None:
    with FeatureStore.connect(redis_url, sample.registry()) as store:
        store.write(GROUP, sample.rows(3))
    trusted = TlsConfig(ca=str(pki / "ca.pem"))
    other = TlsConfig(ca=str(pki / "other-ca.pem"))
    env = {"FEATURE_SERVING_GRPC_FRONT": front}  # native: rustls in the extension's front
    with ServingProcess(
        redis_url, args=[*_server_args(pki), "--workers", "2"], env=env, tls=trusted
    ) as server:
        assert server.rest_url.startswith("https://")
        expected = sample.features(1)["int_0"]
        with FeatureClient(server.rest_url, tls=trusted, timeout=5) as rest:
            assert rest.get(ENTITY, [1], ["int_0"]).rows[0].values == [expected]
        with GrpcFeatureClient(server.grpc_target, tls=trusted, timeout=5) as g:
            assert g.get(ENTITY, [1], ["int_0"]).rows[0].values == [expected]
            # WriteFeatures: passed through the front to grpc.aio
            assert g.write(GROUP, [(1, {"int_0": 7})]).entities == 1
            assert g.get(ENTITY, [1], ["int_0"]).rows[0].values == [7]
        call = [server.grpc_target, "feature_store.v1.FeatureService/GetFeatures"]
        body = '{"entity_type": "consumer", "int_ids": [1], "features": ["int_0"]}'
        verified = subprocess.run(
            [grpcurl, "-cacert", str(pki / "ca.pem"), "-d", body, *call],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert verified.returncode == 0, verified.stderr
        assert "int_value" in verified.stdout
        unverified = subprocess.run(  # the system's CAs do not know the test CA
            [grpcurl, "-d", body, *call], capture_output=True, text=True, timeout=30
        )
        assert unverified.returncode != 0
        assert "certificate" in unverified.stderr
        curl = subprocess.run(
            ["curl", "-sS", "--cacert", str(pki / "ca.pem"), f"{server.rest_url}/healthz"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert curl.returncode == 0, curl.stderr
        assert '"ok"' in curl.stdout
        # curl without the CA: the certificate is not trusted
        untrusted = subprocess.run(
            ["curl", "-sS", f"{server.rest_url}/healthz"], capture_output=True, timeout=30
        )
        assert untrusted.returncode != 0

        # plaintext on either port is refused
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"http://127.0.0.1:{server.port}/healthz", timeout=5)
        with grpc.insecure_channel(server.grpc_target) as channel:
            stub = pb_grpc.FeatureServiceStub(channel)  # type: ignore[no-untyped-call]
            with pytest.raises(grpc.RpcError) as raised:
                stub.GetFeatures(
                    pb.GetFeaturesRequest(entity_type=ENTITY, int_ids=[1], features=["int_0"]),
                    timeout=5,
                )
            assert raised.value.code() is grpc.StatusCode.UNAVAILABLE  # type: ignore[attr-defined]

        # a client that trusts another CA refuses the server
        with (
            FeatureClient(server.rest_url, tls=other, timeout=5) as rest,
            pytest.raises(StoreUnavailableError, match="CERTIFICATE_VERIFY_FAILED"),
        ):
            rest.get(ENTITY, [1], ["int_0"])
        with (
            GrpcFeatureClient(server.grpc_target, tls=other, timeout=5) as g,
            pytest.raises(StoreUnavailableError),
        ):
            g.get(ENTITY, [1], ["int_0"])


@pytest.mark.parametrize("front", ["native", "grpcio"])
def test_mutual_tls_needs_a_client_certificate_the_ca_signed(
    redis_url: str, pki: Path, front: str
) -> None:
    with FeatureStore.connect(redis_url, sample.registry()) as store:
        store.write(GROUP, sample.rows(3))
    ca = str(pki / "ca.pem")
    client = TlsConfig(ca=ca, cert=str(pki / "client.pem"), key=str(pki / "client.key"))
    args = [*_server_args(pki), "--tls-client-ca", ca]
    env = {"FEATURE_SERVING_GRPC_FRONT": front}
    with ServingProcess(redis_url, args=args, env=env, tls=client) as server:
        with FeatureClient(server.rest_url, tls=client, timeout=5) as rest:
            assert rest.get(ENTITY, [2], ["int_0"]).rows[0].values == [sample.features(2)["int_0"]]
        with GrpcFeatureClient(server.grpc_target, tls=client, timeout=5) as g:
            assert g.get(ENTITY, [2], ["int_0"]).rows[0].values == [sample.features(2)["int_0"]]
        stranger = TlsConfig(ca=ca, cert=str(pki / "stranger.pem"), key=str(pki / "stranger.key"))
        for tls in (TlsConfig(ca=ca), stranger):  # no certificate; one another CA signed
            with (
                FeatureClient(server.rest_url, tls=tls, timeout=5) as rest,
                pytest.raises(StoreUnavailableError),
            ):
                rest.get(ENTITY, [2], ["int_0"])
            with (
                GrpcFeatureClient(server.grpc_target, tls=tls, timeout=5) as g,
                pytest.raises(StoreUnavailableError),
            ):
                g.get(ENTITY, [2], ["int_0"])


def test_tls_settings_are_checked_at_startup(tmp_path: Path, pki: Path) -> None:
    from feature_store.errors import ConfigError
    from feature_store.serving.config import ServingSettings

    with pytest.raises(ConfigError, match="TLS_CERT and FEATURE_SERVING_TLS_KEY go together"):
        ServingSettings(tls_cert=str(pki / "server.pem")).validated()
    with pytest.raises(ConfigError, match=r"TLS_KEY cannot be read: nope\.key"):
        ServingSettings(tls_cert=str(pki / "server.pem"), tls_key="nope.key").validated()
    (tmp_path / "junk.pem").write_text("not a certificate")
    with pytest.raises(ConfigError, match="TLS_CERT is not a PEM file"):
        ServingSettings(
            tls_cert=str(tmp_path / "junk.pem"), tls_key=str(pki / "server.key")
        ).validated()
    with pytest.raises(ConfigError, match="TLS_CLIENT_CA needs TLS"):
        ServingSettings(tls_client_ca=str(pki / "ca.pem")).validated()
