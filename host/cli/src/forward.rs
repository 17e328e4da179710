//! How one `sm4c serve --kafka` worker sends a request to another ([`sm4c_api::cluster`]): the
//! requests about an instance it does not hold, and its share of a listing.

use axum::body::Bytes;
use sm4c_host::BoxFuture;

/// Requests to the other workers of the group, over reqwest.
pub struct Peers {
    client: reqwest::Client,
}

impl Peers {
    /// `roots`: PEM certificates trusted besides the usual roots, for workers that serve HTTPS with
    /// a certificate of their own (`sm4c serve` passes its own server certificate's chain: the
    /// workers of a group usually share one).
    pub fn new(roots: Option<&[u8]>) -> Result<Peers, String> {
        let mut b = reqwest::Client::builder()
            .use_rustls_tls()
            .timeout(sm4c_api::cluster::FORWARD_TIMEOUT)
            .redirect(reqwest::redirect::Policy::none());
        if let Some(pem) = roots {
            for c in reqwest::Certificate::from_pem_bundle(pem).map_err(|e| e.to_string())? {
                b = b.add_root_certificate(c);
            }
        }
        Ok(Peers {
            client: b.build().map_err(|e| e.to_string())?,
        })
    }
}

impl sm4c_api::cluster::Forward for Peers {
    fn send(&self, req: axum::http::Request<Bytes>) -> BoxFuture<'static, Result<axum::http::Response<Bytes>, String>> {
        let client = self.client.clone();
        Box::pin(async move {
            let (parts, body) = req.into_parts();
            let answer = client
                .request(parts.method, parts.uri.to_string())
                .headers(parts.headers)
                .body(body)
                .send()
                .await
                .map_err(cause)?;
            let mut out = axum::http::Response::builder().status(answer.status());
            for (k, v) in answer.headers() {
                out = out.header(k, v);
            }
            let body = answer.bytes().await.map_err(cause)?;
            out.body(body).map_err(|e| e.to_string())
        })
    }
}

/// reqwest's error with its deepest cause ("error sending request …: connection refused").
fn cause(e: reqwest::Error) -> String {
    let mut s: &dyn std::error::Error = &e;
    while let Some(next) = s.source() {
        s = next;
    }
    match s.to_string() {
        deepest if deepest != e.to_string() => format!("{e}: {deepest}"),
        _ => e.to_string(),
    }
}
