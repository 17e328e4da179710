//! The API's connections, over plain HTTP or HTTPS ([`serve`]), with their limits ([`Connections`]):
//! at most [`Connections::max`] open at once (more are answered 503 and closed), and at most
//! [`Connections::header_timeout`] for a client to send a request's headers (a client that sends
//! them a byte at a time, slowloris, is cut off). Served by hyper-util, the stack `axum::serve`
//! is built on, which leaves these knobs out.
//!
//! TLS handshakes run in tasks of their own (a client that stalls its handshake holds up nobody),
//! at most [`HANDSHAKE`] each. With a client CA, client certificates signed by it are verified and
//! their subject common name is given to the request as [`Peer`] (see [`crate::auth`]); clients
//! without a certificate may still connect and authenticate with a bearer token.

use crate::auth::{common_name, Peer};
use axum::extract::ConnectInfo;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_rustls::TlsAcceptor;
use tower::ServiceExt;

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

/// Limits on the server's connections.
#[derive(Debug, Clone, Copy)]
pub struct Connections {
    /// Most connections open at once; one more is answered 503 and closed.
    pub max: usize,
    /// Longest a client may take to send a request's headers over HTTP/1, counted from the
    /// connection's start or the end of its previous request; over HTTP/2, to send its connection
    /// preface and the headers of its first request.
    pub header_timeout: Duration,
}

/// Most connections open at once by default.
pub const MAX_CONNECTIONS: usize = 1024;
/// Longest a client may take to send a request's headers by default.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

impl Default for Connections {
    fn default() -> Connections {
        Connections {
            max: MAX_CONNECTIONS,
            header_timeout: HEADER_TIMEOUT,
        }
    }
}

/// The answer of a connection beyond [`Connections::max`] (over plain HTTP; over TLS it is closed).
const TOO_MANY: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nconnection: close\r\nretry-after: 1\r\nx-content-type-options: nosniff\r\ncontent-length: 114\r\n\r\n{\"error\":\"tooManyConnections\",\"message\":\"the server has as many connections open as it takes (--max-connections)\"}";

/// Most refused connections being answered at once; more are closed without an answer.
const REFUSING: usize = 64;

pub use rustls::ServerConfig;

/// Serves `app` on `tcp` until `shutdown` completes, then lets the open requests finish: over
/// TLS with `tls` (giving each request the client certificate's [`Peer`]), else over plain HTTP,
/// within `limits`.
pub async fn serve(
    tcp: TcpListener,
    tls: Option<Arc<ServerConfig>>,
    limits: Connections,
    app: axum::Router,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let mut http = auto::Builder::new(TokioExecutor::new());
    http.http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    http.http2().timer(TokioTimer::new());
    let open = Arc::new(Semaphore::new(limits.max.max(1)));
    let refusing = Arc::new(Semaphore::new(REFUSING));
    // Told to every connection when the server stops; it has stopped once they all dropped theirs.
    let (stopping, stopped) = tokio::sync::watch::channel(false);
    let acceptor = tls.map(TlsAcceptor::from);
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (stream, addr) = tokio::select! {
            _ = &mut shutdown => break,
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
        let _ = stream.set_nodelay(true);
        let Ok(permit) = open.clone().try_acquire_owned() else {
            tracing::debug!(peer = %addr, max = limits.max, "too many connections: refusing one");
            if acceptor.is_none() {
                if let Ok(p) = refusing.clone().try_acquire_owned() {
                    tokio::spawn(refuse(stream, p));
                }
            }
            continue;
        };
        let (http, app, stop) = (http.clone(), app.clone(), stopped.clone());
        let first = limits.header_timeout;
        match &acceptor {
            None => {
                tokio::spawn(async move {
                    let asked = Arc::new(AtomicBool::new(false));
                    let conn =
                        http.serve_connection_with_upgrades(TokioIo::new(stream), service(app, None, asked.clone()));
                    run(conn.into_owned(), asked, first, stop).await;
                    drop(permit);
                });
            }
            Some(acceptor) => {
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let tls = match tokio::time::timeout(HANDSHAKE, acceptor.accept(stream)).await {
                        Ok(Ok(tls)) => tls,
                        Ok(Err(e)) => return tracing::debug!(peer = %addr, error = %e, "TLS handshake failed"),
                        Err(_) => return tracing::debug!(peer = %addr, "TLS handshake timed out"),
                    };
                    let peer = Peer {
                        common_name: tls
                            .get_ref()
                            .1
                            .peer_certificates()
                            .and_then(|c| c.first())
                            .and_then(|c| common_name(c)),
                    };
                    let asked = Arc::new(AtomicBool::new(false));
                    let conn =
                        http.serve_connection_with_upgrades(TokioIo::new(tls), service(app, Some(peer), asked.clone()));
                    run(conn.into_owned(), asked, first, stop).await;
                    drop(permit);
                });
            }
        }
    }
    drop(tcp);
    let _ = stopping.send(true);
    drop(stopped);
    stopping.closed().await;
    Ok(())
}

/// Serves one connection until it ends: shut down gracefully (its open requests finish) when the
/// server stops, or when no request has begun on it within `first` of its start. HTTP/1's
/// header-read timeout covers that case over HTTP/1; this covers HTTP/2, whose server waits
/// without a bound for a client's preface and first request (a slowloris client holding one of
/// the [`Connections::max`] slots for ever).
async fn run<C>(conn: C, asked: Arc<AtomicBool>, first: Duration, mut stop: tokio::sync::watch::Receiver<bool>)
where
    C: hyper_util::server::graceful::GracefulConnection,
{
    let mut conn = std::pin::pin!(conn);
    let deadline = tokio::time::sleep(first);
    let mut deadline = std::pin::pin!(deadline);
    let (mut shutting, mut timed) = (false, true);
    loop {
        tokio::select! {
            _ = conn.as_mut() => return,
            r = stop.changed(), if !shutting => {
                if r.is_err() || *stop.borrow() {
                    shutting = true;
                    conn.as_mut().graceful_shutdown();
                }
            }
            // The guard is read when the select begins: a request that began while it waited is
            // looked for again when the deadline comes.
            _ = deadline.as_mut(), if !shutting && timed => {
                timed = false;
                if asked.load(Ordering::Relaxed) {
                    continue;
                }
                tracing::debug!(timeout_ms = first.as_millis() as u64, "no request within the header timeout: closing the connection");
                // Politely (an HTTP/2 GOAWAY), but HTTP/2's graceful close waits for the client to
                // answer a PING, which such a client may never do: dropped after a moment.
                conn.as_mut().graceful_shutdown();
                let _ = tokio::time::timeout(Duration::from_secs(1), conn.as_mut()).await;
                return;
            }
        }
    }
}

/// The service of one connection: the router, with the connection's [`Peer`] over TLS; `asked`
/// is set once a request has begun on it.
fn service(
    app: axum::Router,
    peer: Option<Peer>,
    asked: Arc<AtomicBool>,
) -> impl hyper::service::Service<
    hyper::Request<hyper::body::Incoming>,
    Response = axum::response::Response,
    Error = std::convert::Infallible,
    Future = tower::util::Oneshot<axum::Router, axum::extract::Request>,
> + Clone {
    hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
        asked.store(true, Ordering::Relaxed);
        let mut req = req.map(axum::body::Body::new);
        if let Some(p) = &peer {
            req.extensions_mut().insert(ConnectInfo(p.clone()));
        }
        app.clone().oneshot(req)
    })
}

/// Answers a connection beyond the limit 503 and closes it, after reading (and dropping) what the
/// client sent for a moment, so that closing does not reset the answer away.
async fn refuse(mut stream: impl AsyncRead + AsyncWrite + Unpin, _permit: OwnedSemaphorePermit) {
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        stream.write_all(TOO_MANY).await?;
        stream.shutdown().await?;
        let mut sink = [0u8; 4096];
        while stream.read(&mut sink).await? > 0 {}
        std::io::Result::Ok(())
    })
    .await;
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_refusal_is_a_whole_http_answer() {
        let text = std::str::from_utf8(super::TOO_MANY).expect("text");
        let (head, body) = text.split_once("\r\n\r\n").expect("head and body");
        assert!(head.contains(&format!("content-length: {}", body.len())), "{head}");
        let v: serde_json::Value = serde_json::from_str(body).expect("JSON");
        assert_eq!(v["error"], "tooManyConnections");
    }
}
