//! HTTPS for the API: a [`TlsListener`] that `axum::serve` takes like a TCP listener, so graceful
//! shutdown and the HTTP stack stay the same as over plain HTTP.
//!
//! Handshakes run in tasks of their own (a client that stalls its handshake holds up nobody), at
//! most [`HANDSHAKE`] each. With a client CA, client certificates signed by it are verified and
//! their subject common name is given to the request as [`Peer`] (see [`crate::auth`]); clients
//! without a certificate may still connect and authenticate with a bearer token.

use crate::auth::{common_name, Peer};
use axum::extract::connect_info::Connected;
use axum::serve::{IncomingStream, Listener};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

/// Longest a TLS handshake may take.
pub const HANDSHAKE: Duration = Duration::from_secs(10);

/// The server's TLS configuration from PEM: its certificate chain and key, and optionally the CAs
/// whose client certificates it verifies (mutual TLS).
pub fn server_config(cert: &[u8], key: &[u8], client_ca: Option<&[u8]>) -> Result<rustls::ServerConfig, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let chain = CertificateDer::pem_slice_iter(cert)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("the certificate is not PEM: {e}"))?;
    if chain.is_empty() {
        return Err("the certificate file holds no CERTIFICATE".into());
    }
    let key = PrivateKeyDer::from_pem_slice(key).map_err(|e| format!("the key is not a PEM private key: {e}"))?;
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for c in CertificateDer::pem_slice_iter(ca) {
                let c = c.map_err(|e| format!("the client CA is not PEM: {e}"))?;
                roots
                    .add(c)
                    .map_err(|e| format!("the client CA is not a CA certificate: {e}"))?;
            }
            if roots.is_empty() {
                return Err("the client CA file holds no CERTIFICATE".into());
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .allow_unauthenticated()
                .build()
                .map_err(|e| format!("the client CA: {e}"))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder
        .with_single_cert(chain, key)
        .map_err(|e| format!("the certificate and key do not go together: {e}"))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}

/// Accepts TCP connections and hands over those whose TLS handshake succeeded.
pub struct TlsListener {
    ready: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
}

impl TlsListener {
    /// Starts accepting on `tcp` (on the current tokio runtime).
    pub fn new(tcp: TcpListener, config: Arc<rustls::ServerConfig>) -> std::io::Result<TlsListener> {
        let local = tcp.local_addr()?;
        let (tx, ready) = mpsc::channel(64);
        let acceptor = TlsAcceptor::from(config);
        tokio::spawn(async move {
            loop {
                let (stream, addr) = tokio::select! {
                    _ = tx.closed() => return,
                    r = tcp.accept() => match r {
                        Ok(c) => c,
                        Err(e) => {
                            // Out of file descriptors and the like: wait, as axum does.
                            tracing::warn!(error = %e, "cannot accept a connection");
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            continue;
                        }
                    },
                };
                let (acceptor, tx) = (acceptor.clone(), tx.clone());
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE, acceptor.accept(stream)).await {
                        Ok(Ok(tls)) => {
                            let _ = tx.send((tls, addr)).await;
                        }
                        Ok(Err(e)) => tracing::debug!(peer = %addr, error = %e, "TLS handshake failed"),
                        Err(_) => tracing::debug!(peer = %addr, "TLS handshake timed out"),
                    }
                });
            }
        });
        Ok(TlsListener { ready, local })
    }
}

impl Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(c) => c,
            // The accepting task only ends when this listener is dropped.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        Ok(self.local)
    }
}

impl Connected<IncomingStream<'_, TlsListener>> for Peer {
    fn connect_info(stream: IncomingStream<'_, TlsListener>) -> Peer {
        let (_, session) = stream.io().get_ref();
        Peer {
            common_name: session
                .peer_certificates()
                .and_then(|c| c.first())
                .and_then(|c| common_name(c)),
        }
    }
}

pub use rustls::ServerConfig;

/// Serves `app` on `tcp` until `shutdown` completes: over TLS with `tls` (giving each request the
/// client certificate's [`Peer`]), else over plain HTTP.
pub async fn serve(
    tcp: TcpListener,
    tls: Option<Arc<ServerConfig>>,
    app: axum::Router,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    match tls {
        None => axum::serve(tcp, app).with_graceful_shutdown(shutdown).await,
        Some(config) => {
            axum::serve(
                TlsListener::new(tcp, config)?,
                app.into_make_service_with_connect_info::<Peer>(),
            )
            .with_graceful_shutdown(shutdown)
            .await
        }
    }
}
