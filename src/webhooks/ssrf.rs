//! Which receivers a webhook may reach. By default only https, and only
//! public addresses: private, loopback, link-local, shared, multicast and
//! reserved ranges are refused. A URL is checked when it is registered and
//! before every try (a literal IP is never resolved), and a host name is
//! checked where it becomes addresses: [`GuardedResolver`] is the HTTP
//! client's resolver, so the addresses connected to are the ones checked,
//! and a name that resolves to a public address at registration and to a
//! private one later (DNS rebinding) is refused at connect time.
//! `[webhooks] allow_private_networks = true` permits all of it, and plain
//! http, for internal receivers.

use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use reqwest::Url;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UrlRefusal {
    #[error("url is not a valid absolute URL")]
    Malformed,
    #[error("url must use https (plain http only with [webhooks] allow_private_networks)")]
    NotHttps,
    #[error("url must name a host")]
    NoHost,
    #[error("url must not carry a user name or password")]
    Credentials,
    #[error("url points at a private, loopback or link-local address ({0}); refused")]
    PrivateAddress(IpAddr),
    #[error("host {0} resolves only to private, loopback or link-local addresses; refused")]
    PrivateHost(String),
}

/// The URL as it may be called, or why not.
pub fn check_url(text: &str, allow_private: bool) -> Result<Url, UrlRefusal> {
    let url = Url::parse(text).map_err(|_| UrlRefusal::Malformed)?;
    match url.scheme() {
        "https" => {}
        "http" if allow_private => {}
        _ => return Err(UrlRefusal::NotHttps),
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(UrlRefusal::Credentials);
    }
    let host = url
        .host_str()
        .filter(|h| !h.is_empty())
        .ok_or(UrlRefusal::NoHost)?;
    // The parser has normalised IP literals already (`2130706433`,
    // `0x7f.1` are 127.0.0.1 here); IPv6 comes in brackets.
    let literal = host.trim_start_matches('[').trim_end_matches(']');
    if let Ok(ip) = literal.parse::<IpAddr>() {
        if !allow_private && !is_public(ip) {
            return Err(UrlRefusal::PrivateAddress(ip));
        }
    }
    Ok(url)
}

/// Whether `ip` is a globally reachable unicast address.
pub fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_public_v4(v4),
        IpAddr::V6(v6) => is_public_v6(v6),
    }
}

fn is_public_v4(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    !(ip.is_private()
        || ip.is_loopback()
        || ip.is_link_local()
        || ip.is_unspecified()
        || ip.is_broadcast()
        || ip.is_multicast()
        || ip.is_documentation()
        || a == 0
        // Shared address space (carrier-grade NAT), 100.64.0.0/10.
        || (a == 100 && (64..128).contains(&b))
        // IETF protocol assignments, 192.0.0.0/24.
        || (a == 192 && b == 0 && c == 0)
        // Benchmarking, 198.18.0.0/15.
        || (a == 198 && (b == 18 || b == 19))
        // Reserved, 240.0.0.0/4.
        || a >= 240)
}

fn is_public_v6(ip: Ipv6Addr) -> bool {
    if let Some(v4) = ip.to_ipv4_mapped() {
        return is_public_v4(v4);
    }
    let s = ip.segments();
    // NAT64 (64:ff9b::/96) carries an IPv4 address in its last 32 bits.
    if s[0] == 0x64 && s[1] == 0xff9b && s[2..6] == [0, 0, 0, 0] {
        let [.., hi, lo] = s;
        return is_public_v4(Ipv4Addr::from((u32::from(hi) << 16) | u32::from(lo)));
    }
    !(ip.is_loopback()
        || ip.is_unspecified()
        || ip.is_multicast()
        // Unique local, fc00::/7.
        || (s[0] & 0xfe00) == 0xfc00
        // Link-local, fe80::/10, and the old site-local, fec0::/10.
        || (s[0] & 0xffc0) == 0xfe80
        || (s[0] & 0xffc0) == 0xfec0
        // Documentation, 2001:db8::/32.
        || (s[0] == 0x2001 && s[1] == 0x0db8)
        // IPv4-compatible (deprecated) ::a.b.c.d and the rest of ::/96.
        || s[..6] == [0, 0, 0, 0, 0, 0])
}

/// The HTTP client's resolver: the system's answer, without the addresses
/// a webhook may not reach (all of them permitted with
/// `allow_private_networks`). A name left with none is an error, so the
/// client never connects.
#[derive(Debug, Clone, Copy)]
pub struct GuardedResolver {
    pub allow_private: bool,
}

impl Resolve for GuardedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let allow_private = self.allow_private;
        Box::pin(async move {
            let host = name.as_str().to_string();
            let found: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let allowed: Vec<SocketAddr> = found
                .into_iter()
                .filter(|a| allow_private || is_public(a.ip()))
                .collect();
            if allowed.is_empty() {
                return Err(Box::new(UrlRefusal::PrivateHost(host))
                    as Box<dyn std::error::Error + Send + Sync>);
            }
            let addrs: Addrs = Box::new(allowed.into_iter());
            Ok(addrs)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn private_loopback_and_link_local_addresses_are_not_public() {
        for ip in [
            "10.0.0.1",
            "172.16.5.4",
            "192.168.1.1",
            "127.0.0.1",
            "169.254.169.254",
            "0.0.0.0",
            "100.64.0.1",
            "255.255.255.255",
            "::1",
            "::",
            "fe80::1",
            "fd00::1",
            "::ffff:127.0.0.1",
            "::ffff:10.1.2.3",
            "64:ff9b::a9fe:a9fe",
        ] {
            assert!(!is_public(ip.parse().unwrap()), "{ip} counted as public");
        }
        for ip in [
            "1.1.1.1",
            "93.184.216.34",
            "2606:4700:4700::1111",
            "::ffff:8.8.8.8",
        ] {
            assert!(is_public(ip.parse().unwrap()), "{ip} counted as private");
        }
    }

    #[test]
    fn urls_are_https_and_public_unless_private_networks_are_allowed() {
        assert!(check_url("https://hooks.example.com/x", false).is_ok());
        assert_eq!(
            check_url("http://hooks.example.com/x", false),
            Err(UrlRefusal::NotHttps)
        );
        assert_eq!(
            check_url("https://127.0.0.1:9/x", false),
            Err(UrlRefusal::PrivateAddress("127.0.0.1".parse().unwrap()))
        );
        assert_eq!(
            check_url("https://[::1]/x", false),
            Err(UrlRefusal::PrivateAddress("::1".parse().unwrap()))
        );
        assert_eq!(
            check_url("https://u:p@hooks.example.com/", false),
            Err(UrlRefusal::Credentials)
        );
        assert_eq!(check_url("ftp://x/", true), Err(UrlRefusal::NotHttps));
        assert_eq!(check_url("not a url", true), Err(UrlRefusal::Malformed));
        assert!(check_url("http://127.0.0.1:9/x", true).is_ok());
    }

    #[tokio::test]
    async fn the_resolver_drops_private_answers_at_connect_time() {
        let guarded = GuardedResolver {
            allow_private: false,
        };
        let name: Name = "localhost".parse().unwrap();
        let refused = guarded.resolve(name).await.err().unwrap();
        assert!(refused.to_string().contains("localhost"), "{refused}");
        let open = GuardedResolver {
            allow_private: true,
        };
        let addrs: Vec<SocketAddr> = open
            .resolve("localhost".parse().unwrap())
            .await
            .unwrap()
            .collect();
        assert!(addrs.iter().all(|a| a.ip().is_loopback()) && !addrs.is_empty());
    }
}
