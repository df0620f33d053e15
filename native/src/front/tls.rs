//! TLS of the fronts (rustls): the server's certificate chain and key, ALPN (h2 for gRPC,
//! http/1.1 for REST), and with a client CA, client certificates it signed required
//! (mutual TLS). The hop to the Python server behind a front stays on loopback, in
//! plaintext.

use std::sync::Arc;
use std::time::Duration;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use tokio_rustls::rustls;
use tokio_rustls::TlsAcceptor;

/// A client that has not finished its TLS handshake by then is dropped.
pub(crate) const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// PEM bytes of TLS: the certificate chain, its key, and the client CA of mutual TLS.
pub(crate) type TlsPem = (Vec<u8>, Vec<u8>, Option<Vec<u8>>);

/// The acceptor of `tls` (None: plaintext) for the protocol `alpn`.
pub(crate) fn acceptor(tls: Option<TlsPem>, alpn: &[u8]) -> PyResult<Option<TlsAcceptor>> {
    match tls {
        Some((cert, key, client_ca)) => {
            tls_acceptor(&cert, &key, client_ca.as_deref(), alpn).map(Some)
        }
        None => Ok(None),
    }
}

fn tls_acceptor(
    cert: &[u8],
    key: &[u8],
    client_ca: Option<&[u8]>,
    alpn: &[u8],
) -> PyResult<TlsAcceptor> {
    let bad = |what: &str, e: &dyn std::fmt::Display| PyValueError::new_err(format!("{what}: {e}"));
    let chain: Vec<rustls::Certificate> = rustls_pemfile::certs(&mut &cert[..])
        .map_err(|e| bad("the TLS certificate is not PEM", &e))?
        .into_iter()
        .map(rustls::Certificate)
        .collect();
    if chain.is_empty() {
        return Err(PyValueError::new_err(
            "the TLS certificate file holds no certificate",
        ));
    }
    let mut keys = rustls_pemfile::read_all(&mut &key[..])
        .map_err(|e| bad("the TLS key is not PEM", &e))?
        .into_iter()
        .filter_map(|item| match item {
            rustls_pemfile::Item::PKCS8Key(k)
            | rustls_pemfile::Item::RSAKey(k)
            | rustls_pemfile::Item::ECKey(k) => Some(rustls::PrivateKey(k)),
            _ => None,
        });
    let key = keys
        .next()
        .ok_or_else(|| PyValueError::new_err("the TLS key file holds no private key"))?;
    let builder = rustls::ServerConfig::builder().with_safe_defaults();
    let builder = match client_ca {
        Some(pem) => {
            let mut roots = rustls::RootCertStore::empty();
            for der in rustls_pemfile::certs(&mut &pem[..])
                .map_err(|e| bad("the client CA is not PEM", &e))?
            {
                roots
                    .add(&rustls::Certificate(der))
                    .map_err(|e| bad("the client CA is not a usable certificate", &e))?;
            }
            if roots.is_empty() {
                return Err(PyValueError::new_err(
                    "the client CA file holds no certificate",
                ));
            }
            let verifier = rustls::server::AllowAnyAuthenticatedClient::new(roots);
            builder.with_client_cert_verifier(Arc::new(verifier))
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder
        .with_single_cert(chain, key)
        .map_err(|e| bad("the TLS certificate and key do not fit", &e))?;
    config.alpn_protocols = vec![alpn.to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}
