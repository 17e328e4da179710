//! Where the invokers' HTTP requests may go, and how much of an answer they read.
//!
//! Every HTTP client of this crate (REST calls and OpenAPI document fetches, the ASL HTTP Task,
//! remote `.proto` fetches) is made by [`NetPolicy::client`]:
//! - **redirects stay on one origin**: a redirect to another scheme, host or port is not followed
//!   (the 3xx answer is the answer), so configured headers never travel to a server the
//!   configuration did not name;
//! - **private and link-local addresses are refused** unless allowed ([`NetPolicy::allow_private`],
//!   [`NetPolicy::allowed`]): a host name is resolved and every address it resolves to is checked
//!   before a connection is made (so a name cannot resolve to a public address when checked and a
//!   private one when used), and an address written in the URL is checked as it is. Loopback is
//!   always allowed;
//! - **answers are capped** at [`NetPolicy::max_response`] bytes ([`read_capped`]).

use ipnet::IpNet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

/// The default cap of a response body: 4 MiB.
pub const DEFAULT_MAX_RESPONSE: usize = 4 << 20;

/// Most redirects followed within one origin.
const MAX_REDIRECTS: usize = 10;

/// What the invokers' requests may reach, and how much of an answer they read.
#[derive(Debug, Clone)]
pub struct NetPolicy {
    /// Whether private and link-local addresses may be called.
    pub allow_private: bool,
    /// Networks that may be called even when private addresses are refused.
    pub allowed: Vec<IpNet>,
    /// Most bytes read of a response body (a gRPC message included).
    pub max_response: usize,
}

impl Default for NetPolicy {
    /// Private addresses allowed (what `sm4c run` does), answers capped at [`DEFAULT_MAX_RESPONSE`].
    fn default() -> NetPolicy {
        NetPolicy {
            allow_private: true,
            allowed: Vec::new(),
            max_response: DEFAULT_MAX_RESPONSE,
        }
    }
}

/// Why an address is refused, or `None` when it is a public or loopback address.
pub fn private_kind(ip: IpAddr) -> Option<&'static str> {
    let ip = match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        },
        v4 => v4,
    };
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, ..] = v4.octets();
            if v4 == Ipv4Addr::new(169, 254, 169, 254) {
                Some("the cloud metadata address")
            } else if a == 169 && b == 254 {
                Some("a link-local address")
            } else if a == 10 || (a == 172 && (16..32).contains(&b)) || (a == 192 && b == 168) {
                Some("a private address")
            } else if a == 100 && (64..128).contains(&b) {
                Some("a shared (carrier-grade NAT) address")
            } else if a == 0 {
                Some("the unspecified address")
            } else {
                None
            }
        }
        IpAddr::V6(v6) => {
            let first = v6.segments()[0];
            if v6 == Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254) {
                Some("the cloud metadata address")
            } else if first & 0xffc0 == 0xfe80 {
                Some("a link-local address")
            } else if first & 0xfe00 == 0xfc00 {
                Some("a private (unique local) address")
            } else if v6.is_unspecified() {
                Some("the unspecified address")
            } else {
                None
            }
        }
    }
}

impl NetPolicy {
    /// Whether `ip` may be called; the error says what it is and how to allow it.
    pub fn check_ip(&self, host: &str, ip: IpAddr) -> Result<(), String> {
        let Some(kind) = private_kind(ip) else { return Ok(()) };
        if self.allow_private || self.allowed.iter().any(|n| n.contains(&ip)) {
            return Ok(());
        }
        let who = if host.trim_matches(['[', ']']) == ip.to_string() {
            ip.to_string()
        } else {
            format!("{host} ({ip})")
        };
        Err(format!(
            "{who} is {kind}, which calls may not reach: allow it in the configuration file with [calls] allow_networks = [\"{}\"] (or allow_private = true)",
            IpNet::from(ip).trunc()
        ))
    }

    /// Checks a URL before a request: an address written as the host is checked here (names are
    /// checked when they are resolved, by the client's resolver).
    pub fn check_url(&self, url: &reqwest::Url) -> Result<(), String> {
        match url.host() {
            Some(url::Host::Ipv4(ip)) => self.check_ip(&ip.to_string(), IpAddr::V4(ip)),
            Some(url::Host::Ipv6(ip)) => self.check_ip(&format!("[{ip}]"), IpAddr::V6(ip)),
            _ => Ok(()),
        }
    }

    /// An HTTP client that follows redirects only within one origin and resolves names through
    /// this policy.
    pub fn client(&self, timeout: Duration) -> reqwest::ClientBuilder {
        reqwest::Client::builder()
            .timeout(timeout)
            .redirect(same_origin())
            .dns_resolver(Arc::new(Guard(Arc::new(self.clone()))))
    }

    /// The blocking client of remote `.proto` fetches, with the same rules.
    pub fn blocking_client(&self, timeout: Duration) -> reqwest::blocking::ClientBuilder {
        reqwest::blocking::Client::builder()
            .timeout(timeout)
            .redirect(same_origin())
            .dns_resolver(Arc::new(Guard(Arc::new(self.clone()))))
    }
}

/// Follows a redirect only to the origin (scheme, host and port) of the first request.
fn same_origin() -> reqwest::redirect::Policy {
    reqwest::redirect::Policy::custom(|attempt| {
        let first = attempt.previous().first().map(|u| u.origin());
        if attempt.previous().len() > MAX_REDIRECTS {
            attempt.error(format!("more than {MAX_REDIRECTS} redirects"))
        } else if first.as_ref() != Some(&attempt.url().origin()) {
            // Another origin: not followed; the 3xx answer is the answer.
            attempt.stop()
        } else {
            attempt.follow()
        }
    })
}

/// Resolves names, then refuses the name when any of its addresses is refused.
struct Guard(Arc<NetPolicy>);

impl reqwest::dns::Resolve for Guard {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let policy = self.0.clone();
        let host = name.as_str().to_string();
        Box::pin(async move {
            let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            for a in &addrs {
                policy.check_ip(&host, a.ip()).map_err(std::io::Error::other)?;
            }
            Ok(Box::new(addrs.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

/// Whether `url` is under `prefix`: the same scheme, host and port, and a path that is the
/// prefix's or continues it at a segment boundary (`/v1/` and `/v1` match `/v1/x`, not `/v1x`).
pub fn under(prefix: &reqwest::Url, url: &reqwest::Url) -> bool {
    if prefix.scheme() != url.scheme()
        || prefix.host() != url.host()
        || prefix.port_or_known_default() != url.port_or_known_default()
        || !url.username().is_empty()
        || url.password().is_some()
    {
        return false;
    }
    let (p, u) = (prefix.path(), url.path());
    match u.strip_prefix(p) {
        None => false,
        Some(rest) => p.ends_with('/') || rest.is_empty() || rest.starts_with('/'),
    }
}

/// An error with its causes (`error sending request: …: 10.0.0.1 is a private address …`): reqwest
/// shows only the first.
pub fn describe(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cause {
        let text = c.to_string();
        if !parts.iter().any(|seen| seen.contains(&text)) {
            parts.push(text);
        }
        cause = c.source();
    }
    parts.join(": ")
}

/// An answer too big to read.
#[derive(Debug)]
pub enum ReadError {
    /// The body is longer than the cap (in bytes).
    TooBig(usize),
    /// The body could not be read.
    Io(reqwest::Error),
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadError::TooBig(cap) => write!(
                f,
                "the response is larger than the cap of {cap} bytes ([calls] max_response in the configuration file)"
            ),
            ReadError::Io(e) => write!(f, "{}", describe(e)),
        }
    }
}

/// Reads a response body, failing as soon as it passes `cap` bytes.
pub async fn read_capped(mut resp: reqwest::Response, cap: usize) -> Result<Vec<u8>, ReadError> {
    if resp.content_length().is_some_and(|n| n > cap as u64) {
        return Err(ReadError::TooBig(cap));
    }
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(ReadError::Io)? {
        if body.len() + chunk.len() > cap {
            return Err(ReadError::TooBig(cap));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn u(s: &str) -> reqwest::Url {
        reqwest::Url::parse(s).unwrap()
    }

    #[test]
    fn under_compares_parsed_urls_on_segment_boundaries() {
        let p = u("https://api.example.com/v1/");
        assert!(under(&p, &u("https://api.example.com/v1/charges?x=1")));
        assert!(under(&p, &u("https://API.example.com:443/v1/")));
        assert!(!under(&p, &u("https://api.example.com.evil/v1/")));
        assert!(!under(&p, &u("https://api.example.com/v1evil")));
        assert!(!under(&p, &u("https://api.example.com/v1")));
        assert!(!under(&p, &u("http://api.example.com/v1/x")));
        assert!(!under(&p, &u("https://api.example.com:8443/v1/x")));
        assert!(!under(&p, &u("https://api.example.com@evil.example/v1/x")));
        assert!(!under(&p, &u("https://user@api.example.com/v1/x")));
        // Dot segments are resolved by parsing, before the comparison.
        assert!(!under(&p, &u("https://api.example.com/v1/../admin")));
        assert!(!under(&p, &u("https://api.example.com/v1/%2e%2e/admin")));
        let p = u("https://api.example.com/v1");
        assert!(under(&p, &u("https://api.example.com/v1")));
        assert!(under(&p, &u("https://api.example.com/v1/x")));
        assert!(!under(&p, &u("https://api.example.com/v1evil")));
        assert!(under(&u("https://api.example.com"), &u("https://api.example.com/any")));
    }

    #[test]
    fn private_and_link_local_addresses_are_refused_unless_allowed() {
        let refuse = NetPolicy {
            allow_private: false,
            ..NetPolicy::default()
        };
        for ip in [
            "10.1.2.3",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "169.254.169.254",
            "169.254.1.1",
            "100.64.0.1",
            "0.0.0.0",
            "fc00::1",
            "fd00:ec2::254",
            "fe80::1",
            "::ffff:10.0.0.1",
            "::",
        ] {
            let ip: IpAddr = ip.parse().unwrap();
            let e = refuse.check_ip("h", ip).unwrap_err();
            assert!(e.contains("allow_networks"), "{e}");
        }
        for ip in ["127.0.0.1", "::1", "8.8.8.8", "172.32.0.1", "2001:db8::1"] {
            assert_eq!(refuse.check_ip("h", ip.parse().unwrap()), Ok(()), "{ip}");
        }
        let e = refuse.check_ip("h", "169.254.169.254".parse().unwrap()).unwrap_err();
        assert!(e.contains("metadata"), "{e}");
        let some = NetPolicy {
            allow_private: false,
            allowed: vec!["10.20.0.0/16".parse().unwrap()],
            ..NetPolicy::default()
        };
        assert_eq!(some.check_ip("h", "10.20.3.4".parse().unwrap()), Ok(()));
        assert!(some.check_ip("h", "10.21.3.4".parse().unwrap()).is_err());
        assert_eq!(NetPolicy::default().check_ip("h", "10.21.3.4".parse().unwrap()), Ok(()));
        assert!(refuse.check_url(&u("http://10.0.0.1:8080/x")).is_err());
        assert!(refuse.check_url(&u("http://[fe80::1]/x")).is_err());
        assert!(refuse.check_url(&u("http://127.0.0.1:8080/x")).is_ok());
    }

    #[tokio::test]
    async fn a_name_is_refused_when_it_resolves_to_a_refused_address() {
        use reqwest::dns::Resolve;
        let refuse = Guard(Arc::new(NetPolicy {
            allow_private: false,
            allowed: vec!["127.0.0.0/8".parse().unwrap()],
            ..NetPolicy::default()
        }));
        // localhost is loopback: allowed.
        assert!(refuse.resolve("localhost".parse().unwrap()).await.is_ok());
        // A name written as a private address resolves to it, and is refused.
        let e = match refuse.resolve("10.9.8.7".parse().unwrap()).await {
            Err(e) => e.to_string(),
            Ok(_) => panic!("10.9.8.7 must be refused"),
        };
        assert!(e.contains("a private address"), "{e}");
    }
}
