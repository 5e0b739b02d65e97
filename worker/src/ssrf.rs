//! The egress rule: webhooks go to the public internet only, unless configuration allows a
//! private range (tests allow `127.0.0.0/8`).
//!
//! One rule, applied where each socket is opened, to the address that socket connects to
//! (issue #53: the rule had been applied per library at the spot each was wired, and two
//! libraries connected elsewhere than what was checked). Every transport's connections go
//! through [`addresses`], which resolves a name (or takes a literal) and refuses the lot if
//! any address is outside the allowlist; the caller then connects to exactly those
//! addresses, never to the name again:
//!
//! - HTTP (Attempts, OAuth2 token requests, SQS): the client's DNS resolver is
//!   [`GuardedResolver`]; literal IP hosts never reach a resolver, so [`Allowlist::refuses_url`]
//!   checks them where every request is sent (`http::Way::send`). Redirects are not
//!   followed (a 3xx is a FAILED Attempt) and no ambient proxy is used, so the request's
//!   host is the connection's host. Through the egress proxy, the tunnel's connector
//!   checks the address it asks the proxy for (tunnel.rs).
//! - RabbitMQ: lapin's connector is ours (amqp.rs): it connects to the checked address,
//!   on the first connection and on every reconnection; TLS keeps the name for the
//!   certificate.
//! - Kafka: librdkafka's `connect_cb` (kafka.rs) sees the socket address of every broker
//!   connection, bootstrap and metadata-learned alike, before `connect(2)`.
//! - NATS: the client gets the checked address, never the name, and ignores the servers a
//!   server announces (nats.rs); TLS verifies the certificate against the name.
//!
//! A check at endpoint creation would not do: a name that resolved to a public address
//! when the endpoint was created may resolve to `10.0.0.5` now.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use ipnet::IpNet;
use reqwest::dns::{Addrs, Name, Resolve, Resolving};

/// Ranges that are allowed although not global.
#[derive(Debug, Clone, Default)]
pub struct Allowlist(Arc<Vec<IpNet>>);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("'{0}' is not a CIDR range")]
pub struct BadCidr(String);

impl Allowlist {
    /// Parses `RAILHOOK_ALLOW_PRIVATE_TARGETS`: comma-separated CIDRs, empty for none.
    pub fn parse(raw: &str) -> Result<Self, BadCidr> {
        let nets = raw
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|s| s.parse::<IpNet>().map_err(|_| BadCidr(s.to_owned())))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self(Arc::new(nets)))
    }

    /// Every address: for the one target that is never a tenant's (a `railhook listen`
    /// session's relay on Railhook's own API, transport/mod.rs). Nothing else uses it.
    pub fn everything() -> Self {
        let nets = ["0.0.0.0/0", "::/0"]
            .iter()
            .filter_map(|n| n.parse::<IpNet>().ok())
            .collect();
        Self(Arc::new(nets))
    }

    pub fn permits(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        is_global(ip) || self.0.iter().any(|n| n.contains(&ip))
    }

    /// Whether any non-global range is allowed (a test or an internal deployment).
    pub fn allows_private(&self) -> bool {
        !self.0.is_empty()
    }

    /// A URL whose host is a literal IP outside the allowlist (names are the resolver's).
    pub fn refuses_url(&self, url: &url::Url) -> Option<Refused> {
        let ip: IpAddr = match url.host()? {
            url::Host::Ipv4(ip) => ip.into(),
            url::Host::Ipv6(ip) => ip.into(),
            url::Host::Domain(_) => return None,
        };
        (!self.permits(ip)).then_some(Refused(ip))
    }
}

/// A URL's host as a name or an unbracketed IP literal: what [`addresses`] resolves and what
/// a TLS handshake verifies the certificate against.
pub fn host_of(url: &url::Url) -> Option<String> {
    Some(match url.host()? {
        url::Host::Domain(name) => name.to_owned(),
        url::Host::Ipv4(ip) => ip.to_string(),
        url::Host::Ipv6(ip) => ip.to_string(),
    })
}

/// Why [`addresses`] gave no address to connect to.
#[derive(Debug, thiserror::Error)]
pub enum Unreachable {
    #[error(transparent)]
    Refused(#[from] Refused),
    #[error("cannot resolve {0}: {1}")]
    Resolve(String, std::io::Error),
    #[error("{0} has no address")]
    NoAddress(String),
}

/// The one egress rule: the addresses to connect to for `host` (a name, or a literal IP,
/// bracketed or not), every one of them checked. A name with one refused address is
/// refused whole, so a round-robin answer cannot slip one in.
pub async fn addresses(
    allow: &Allowlist,
    host: &str,
    port: u16,
) -> Result<Vec<SocketAddr>, Unreachable> {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let addrs: Vec<SocketAddr> = match bare.parse::<IpAddr>() {
        Ok(ip) => vec![SocketAddr::new(ip, port)],
        Err(_) => tokio::net::lookup_host((bare, port))
            .await
            .map_err(|e| Unreachable::Resolve(bare.to_owned(), e))?
            .collect(),
    };
    if let Some(bad) = addrs.iter().find(|a| !allow.permits(a.ip())) {
        return Err(Refused(bad.ip()).into());
    }
    if addrs.is_empty() {
        return Err(Unreachable::NoAddress(bare.to_owned()));
    }
    Ok(addrs)
}

/// An IPv6 address that carries an IPv4 address is judged as that IPv4 address: mapped
/// (`::ffff:10.0.0.1`), the deprecated compatible form (`::10.0.0.1`), and 6to4
/// (`2002:0a00:0001::`, whose bits 16–47 are the IPv4 address it tunnels to).
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => {
            let s = v6.segments();
            if let Some(v4) = v6.to_ipv4_mapped() {
                IpAddr::V4(v4)
            } else if s[..6] == [0; 6] && !v6.is_unspecified() && !v6.is_loopback() {
                IpAddr::V4(Ipv4Addr::new(
                    (s[6] >> 8) as u8,
                    s[6] as u8,
                    (s[7] >> 8) as u8,
                    s[7] as u8,
                ))
            } else if s[0] == 0x2002 {
                IpAddr::V4(Ipv4Addr::new(
                    (s[1] >> 8) as u8,
                    s[1] as u8,
                    (s[2] >> 8) as u8,
                    s[2] as u8,
                ))
            } else {
                ip
            }
        }
        v4 => v4,
    }
}

fn is_global_v4(ip: Ipv4Addr) -> bool {
    let [a, b, ..] = ip.octets();
    !(ip.is_private()
        || ip.is_loopback()
        || ip.is_link_local()
        || ip.is_unspecified()
        || ip.is_broadcast()
        || ip.is_documentation()
        || ip.is_multicast()
        || a == 0
        || (a == 100 && (64..128).contains(&b)) // shared address space (CGNAT)
        || (a == 192 && b == 0 && ip.octets()[2] == 0) // IETF protocol assignments
        || (a == 198 && (b == 18 || b == 19)) // benchmarking
        || a >= 240) // reserved
}

fn is_global_v6(ip: Ipv6Addr) -> bool {
    let first = ip.segments()[0];
    !(ip.is_loopback()
        || ip.is_unspecified()
        || ip.is_multicast()
        || (first & 0xfe00) == 0xfc00 // unique local
        || (first & 0xffc0) == 0xfe80 // link-local
        || (first & 0xffc0) == 0xfec0 // site-local (deprecated, still routable inside sites)
        || (first == 0x2001 && ip.segments()[1] == 0x0db8) // documentation
        || (first == 0x2001 && ip.segments()[1] == 0x0000) // Teredo (embeds an obfuscated IPv4)
        || (first == 0x0064 && ip.segments()[1] == 0xff9b)) // NAT64 (embeds IPv4)
}

pub fn is_global(ip: IpAddr) -> bool {
    match canonical(ip) {
        IpAddr::V4(v4) => is_global_v4(v4),
        IpAddr::V6(v6) => is_global_v6(v6),
    }
}

/// The error the resolver returns for a refused address; the Attempt Runner recognises it.
#[derive(Debug, thiserror::Error)]
#[error("target address {0} is not allowed (private, loopback or otherwise non-global)")]
pub struct Refused(pub IpAddr);

/// The HTTP client's DNS resolver: refuses names resolving to any address outside the allowlist.
#[derive(Debug, Clone)]
pub struct GuardedResolver {
    pub allow: Allowlist,
}

impl Resolve for GuardedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let allow = self.allow.clone();
        Box::pin(async move {
            match addresses(&allow, name.as_str(), 0).await {
                Ok(addrs) => Ok(Box::new(addrs.into_iter()) as Addrs),
                Err(Unreachable::Refused(r)) => {
                    Err(Box::new(r) as Box<dyn std::error::Error + Send + Sync>)
                }
                Err(Unreachable::Resolve(_, e)) => {
                    Err(Box::new(e) as Box<dyn std::error::Error + Send + Sync>)
                }
                Err(e @ Unreachable::NoAddress(_)) => {
                    Err(Box::new(std::io::Error::other(e.to_string()))
                        as Box<dyn std::error::Error + Send + Sync>)
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("ip")
    }

    #[test]
    fn non_global_addresses_are_refused() {
        let none = Allowlist::default();
        for bad in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "0.0.0.0",
            "100.64.0.1",
            "::1",
            "fe80::1",
            "fd00::1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            "::ffff:169.254.169.254",
            "::127.0.0.1",
            "::10.0.0.1",
            "2002:7f00:1::1",
            "2002:a9fe:a9fe::1",
            "2001:0:4136:e378:8000:63bf:3fff:fdd2",
            "64:ff9b::7f00:1",
            "fec0::1",
            "ff02::1",
            "2001:db8::1",
            "198.18.0.1",
            "192.0.0.8",
            "240.0.0.1",
            "224.0.0.1",
            "255.255.255.255",
            "::",
        ] {
            assert!(!none.permits(ip(bad)), "{bad}");
        }
        for good in [
            "93.184.216.34",
            "1.1.1.1",
            "2606:4700:4700::1111",
            "::ffff:1.1.1.1",
            "2002:0101:0101::1",
        ] {
            assert!(none.permits(ip(good)), "{good}");
        }
    }

    #[test]
    fn the_allowlist_opens_only_its_ranges() {
        let allow = Allowlist::parse("127.0.0.0/8, ::1/128").expect("cidrs");
        assert!(allow.permits(ip("127.0.0.1")));
        assert!(allow.permits(ip("::1")));
        assert!(allow.permits(ip("::ffff:127.0.0.1")));
        assert!(!allow.permits(ip("10.0.0.1")));
        assert!(Allowlist::parse("not-a-cidr").is_err());
        assert!(Allowlist::parse("").expect("empty").0.is_empty());
    }
}
