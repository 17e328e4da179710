//! Who may use `sm4c serve` and what stands in front of its API: tokens, client certificates and
//! TLS, the peer token of a Kafka group, the refusals to listen beyond loopback unprotected, and the
//! door's and the connections' limits.

use crate::args::ServeArgs;
use std::path::Path;
use std::sync::Arc;

/// Who may use the server and whether it speaks TLS: from the `[server]` section of the
/// configuration file and the `SM4C_TOKEN_ADMIN`, `SM4C_TOKEN_OPERATE` and `SM4C_TOKEN_READ`
/// variables (comma-separated tokens); in Kafka mode, the group's peer token (`[server]
/// peer_token`, or `SM4C_PEER_TOKEN`, which wins).
pub struct Security {
    pub auth: sm4c_api::auth::Auth,
    /// How this worker authenticates to the others of its group (Kafka mode).
    pub peering: sm4c_api::cluster::Peering,
    pub tls: Option<Arc<sm4c_api::tls::ServerConfig>>,
    /// The server certificate's chain (PEM): trusted when this worker asks another of its group,
    /// which usually serves the same.
    pub tls_roots: Option<Vec<u8>>,
}

impl Security {
    pub fn of(args: &ServeArgs, server: &sm4c_invoke::config::ServerConfig) -> Result<Security, String> {
        use sm4c_api::auth::{Auth, Role};
        let mut auth = Auth::default();
        for (role, digest) in &server.tokens {
            auth.token(role.parse()?, *digest);
        }
        for role in Role::ALL {
            let var = format!("SM4C_TOKEN_{}", role.as_str().to_uppercase());
            if let Ok(list) = std::env::var(&var) {
                for token in list.split(',').map(str::trim).filter(|t| !t.is_empty()) {
                    auth.token(role, sm4c_api::auth::digest(token));
                }
            }
        }
        let config_file = args
            .calls
            .config
            .as_deref()
            .unwrap_or(Path::new("the configuration file"));
        let peer = match (std::env::var(PEER_TOKEN_VAR), &server.peer_token) {
            (Ok(t), _) => Some(sm4c_api::auth::PeerToken::new(&t).map_err(|e| format!("{PEER_TOKEN_VAR}: {e}"))?),
            (Err(_), Some(t)) => Some(
                sm4c_api::auth::PeerToken::new(t)
                    .map_err(|e| format!("{}: server.peer_token: {e}", config_file.display()))?,
            ),
            (Err(_), None) => None,
        };
        let mut tls_roots = None;
        let tls = match &server.tls {
            None => None,
            Some(t) => {
                tls_roots = Some(t.cert.clone());
                for (cn, role) in &t.clients {
                    auth.client(cn.clone(), role.parse()?);
                }
                let config = sm4c_api::tls::server_config(&t.cert, &t.key, t.client_ca.as_deref())
                    .map_err(|e| format!("{}: server.tls: {e}", config_file.display()))?;
                Some(Arc::new(config))
            }
        };
        if auth.is_on() && tls.is_none() && !is_loopback(&args.listen) && !args.insecure_plain_http {
            return Err(format!(
                "refusing to accept bearer tokens over plain HTTP on {}: anyone on the network path could read \
                 them and use them. Configure [server.tls] in --config (HTTPS), listen on loopback behind a \
                 proxy that speaks HTTPS, or pass --insecure-plain-http",
                args.listen
            ));
        }
        // A group whose API needs credentials needs the workers' own: they never pass a caller's
        // on. Refused at the start rather than at the first request for an instance held by
        // another worker, which a user would meet only once the group grew past one worker.
        if auth.is_on() && args.kafka.kafka.is_some() && peer.is_none() {
            return Err(format!(
                "Kafka mode with authentication needs a peer token, which the workers of the group \
                 authenticate to each other with (they never pass a caller's token on): set \
                 {PEER_TOKEN_VAR}, or [server] peer_token in --config (\"env:VARIABLE\" or a literal), \
                 to the same secret of at least 16 characters on every worker"
            ));
        }
        let peering = sm4c_api::cluster::Peering {
            // With authentication off nobody checks it: it is not sent.
            token: peer.filter(|_| auth.is_on()),
            plain_http: args.insecure_plain_http,
        };
        if let Some(p) = &peering.token {
            auth.peer(p.digest());
        }
        if !auth.is_on() {
            if !is_loopback(&args.listen) && !args.insecure_no_auth {
                return Err(format!(
                    "refusing to listen on {} without authentication: anyone who reaches it could register \
                     definitions, start and cancel instances. Configure tokens ([server] tokens in --config, or \
                     SM4C_TOKEN_ADMIN / SM4C_TOKEN_OPERATE / SM4C_TOKEN_READ), listen on loopback (127.0.0.1, \
                     ::1, localhost), or pass --insecure-no-auth",
                    args.listen
                ));
            }
            if args.insecure_no_auth && !is_loopback(&args.listen) {
                tracing::warn!(listen = %args.listen, "no authentication (--insecure-no-auth): anyone who reaches this address may do anything");
            }
        }
        Ok(Security {
            auth,
            peering,
            tls,
            tls_roots,
        })
    }
}

/// The variable of the peer token of a Kafka group (see [`Security`]).
const PEER_TOKEN_VAR: &str = "SM4C_PEER_TOKEN";

/// The checks and limits in front of the API ([`sm4c_api::door`]) for a server listening at
/// `local` (from `--listen`), advertised to its group at `advertise` (Kafka).
pub fn door(
    args: &ServeArgs,
    auth: bool,
    local: std::net::SocketAddr,
    advertise: Option<&str>,
) -> anyhow::Result<sm4c_api::door::Door> {
    let mut door = sm4c_api::door::Door {
        auth,
        any_ip: local.ip().is_unspecified(),
        request_timeout: timespan(&args.request_timeout, "--request-timeout")?,
        work: sm4c_api::work::Work::new(
            args.expression.limits(),
            timespan(&args.work_budget, "--work-budget")?,
            args.work_slots,
        ),
        ..Default::default()
    };
    if !local.ip().is_unspecified() {
        door.host_of_url(&args.listen);
        door.host_of_url(&local.to_string());
    }
    if let Some(url) = advertise {
        door.host_of_url(url);
    }
    Ok(door)
}

/// The connection limits of `--max-connections` and `--header-timeout`.
pub fn connections(args: &ServeArgs) -> anyhow::Result<sm4c_api::tls::Connections> {
    if args.max_connections == 0 {
        anyhow::bail!("--max-connections: must be at least 1");
    }
    Ok(sm4c_api::tls::Connections {
        max: args.max_connections,
        header_timeout: timespan(&args.header_timeout, "--header-timeout")?,
    })
}

/// A span of time of a flag (`10s`, `2m`, `PT1M`), more than zero.
pub fn timespan(text: &str, flag: &str) -> anyhow::Result<std::time::Duration> {
    match sm4c_runtime::timespan::parse(text) {
        Ok(0) => anyhow::bail!("{flag} {text:?}: must be more than zero"),
        Ok(ms) => Ok(std::time::Duration::from_millis(ms)),
        Err(e) => anyhow::bail!("{flag} {text:?}: {e}"),
    }
}

/// Whether `--listen` is a loopback address: 127.0.0.0/8, ::1 or `localhost`.
fn is_loopback(listen: &str) -> bool {
    if let Ok(a) = listen.parse::<std::net::SocketAddr>() {
        return a.ip().is_loopback();
    }
    listen
        .rsplit_once(':')
        .is_some_and(|(host, _)| host.eq_ignore_ascii_case("localhost"))
}
