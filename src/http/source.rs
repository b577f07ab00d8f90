//! Who sent a request, for the login limiter: the peer's address, or — only when the peer is a
//! trusted proxy (`ONRAMP_HTTP_TRUSTED_PROXIES`) — the right-most address of `X-Forwarded-For`
//! that is not a trusted proxy itself. IPv6 sources count per /64 (one host's usual share).

use std::fmt;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};

use axum::http::HeaderMap;

/// An address block, `10.0.0.0/8`, `fd00::/8`, or one address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IpNet {
    addr: IpAddr,
    prefix: u8,
}

impl IpNet {
    /// `ip` or `ip/prefix`.
    pub fn parse(s: &str) -> Result<Self, String> {
        let bad = || format!("{s:?} is not an IP address or a CIDR block like 10.0.0.0/8");
        let (ip, prefix) = match s.trim().split_once('/') {
            Some((ip, p)) => (ip, Some(p.parse::<u8>().map_err(|_| bad())?)),
            None => (s.trim(), None),
        };
        let addr = canonical(ip.parse::<IpAddr>().map_err(|_| bad())?);
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = prefix.unwrap_or(max);
        if prefix > max {
            return Err(bad());
        }
        Ok(Self { addr: mask(addr, prefix), prefix })
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        ip.is_ipv4() == self.addr.is_ipv4() && mask(ip, self.prefix) == self.addr
    }
}

impl fmt::Display for IpNet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

/// IPv4-mapped IPv6 addresses (`::ffff:10.0.0.1`) as the IPv4 address they are.
fn canonical(ip: IpAddr) -> IpAddr {
    ip.to_canonical()
}

fn mask(ip: IpAddr, prefix: u8) -> IpAddr {
    match ip {
        IpAddr::V4(v4) => {
            let bits = u32::from(v4) & u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
            IpAddr::from(bits.to_be_bytes())
        }
        IpAddr::V6(v6) => {
            let bits = u128::from(v6) & u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
            IpAddr::V6(Ipv6Addr::from(bits))
        }
    }
}

/// The source a request's failed authentications are counted under.
pub fn client(peer: IpAddr, headers: &HeaderMap, trusted: &[IpNet]) -> IpAddr {
    let is_trusted = |ip: IpAddr| trusted.iter().any(|n| n.contains(ip));
    let mut client = canonical(peer);
    if is_trusted(client) {
        let hops: Vec<&str> = headers
            .get_all("x-forwarded-for")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(str::trim)
            .collect();
        // from the nearest hop outwards; an entry that is no address ends the walk (it could be anything)
        for hop in hops.iter().rev() {
            let Some(ip) = hop.parse::<IpAddr>().ok().or_else(|| hop.parse::<SocketAddr>().ok().map(|s| s.ip())) else {
                break;
            };
            client = canonical(ip);
            if !is_trusted(client) {
                break;
            }
        }
    }
    match client {
        IpAddr::V6(_) => mask(client, 64),
        v4 => v4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn xff(values: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append("x-forwarded-for", v.parse().unwrap());
        }
        h
    }

    #[test]
    fn blocks_parse_and_contain() {
        let n = IpNet::parse("10.1.2.3/8").unwrap();
        assert_eq!(n.to_string(), "10.0.0.0/8");
        assert!(n.contains(ip("10.200.0.1")) && !n.contains(ip("11.0.0.1")));
        assert!(n.contains(ip("::ffff:10.0.0.9")), "IPv4-mapped IPv6 is IPv4");
        assert!(IpNet::parse("192.0.2.7").unwrap().contains(ip("192.0.2.7")));
        assert!(!IpNet::parse("192.0.2.7").unwrap().contains(ip("192.0.2.8")));
        assert!(IpNet::parse("fd00::/8").unwrap().contains(ip("fd12::1")));
        assert!(IpNet::parse("0.0.0.0/0").unwrap().contains(ip("8.8.8.8")));
        for bad in ["", "10.0.0.0/33", "fd00::/129", "example.org", "10.0.0/8", "10.0.0.0/x"] {
            assert!(IpNet::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn forwarded_for_counts_only_from_trusted_proxies() {
        let trusted = [IpNet::parse("10.0.0.0/8").unwrap()];
        let h = xff(&["203.0.113.9, 10.0.0.5"]);
        assert_eq!(client(ip("198.51.100.1"), &h, &trusted), ip("198.51.100.1"), "untrusted peer: XFF ignored");
        assert_eq!(client(ip("10.0.0.2"), &h, &trusted), ip("203.0.113.9"), "right-most untrusted hop");
        let spoofed = xff(&["1.1.1.1", "203.0.113.9"]);
        assert_eq!(client(ip("10.0.0.2"), &spoofed, &trusted), ip("203.0.113.9"), "what the client added is not used");
        assert_eq!(client(ip("10.0.0.2"), &HeaderMap::new(), &trusted), ip("10.0.0.2"));
        assert_eq!(client(ip("10.0.0.2"), &xff(&["junk, 10.0.0.7"]), &trusted), ip("10.0.0.7"));
        assert_eq!(client(ip("10.0.0.2"), &xff(&["203.0.113.9:4711"]), &trusted), ip("203.0.113.9"));
        assert_eq!(client(ip("10.0.0.2"), &h, &[]), ip("10.0.0.2"), "no trusted proxies: the peer");
    }

    #[test]
    fn ipv6_sources_count_per_64() {
        assert_eq!(client(ip("2001:db8:1:2:aaaa::1"), &HeaderMap::new(), &[]), ip("2001:db8:1:2::"));
    }
}
