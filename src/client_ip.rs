//! Who the client is (DESIGN §8.2): the peer, or, when the peer is a
//! trusted proxy, the rightmost address in `X-Forwarded-For` that is not
//! trusted. Per-client limits, `X-Real-IP` and logs use it. A peer that is
//! not trusted cannot name another client: its forwarding headers are not
//! read.

use std::net::IpAddr;

use http::header::HeaderName;

use crate::fields::Headers;

use crate::config::ClientIp;

static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// The client behind `peer` as the request's `X-Forwarded-For` tells it,
/// believed only as far as the proxies in `trust` go.
pub fn client_of(peer: IpAddr, headers: &impl Headers, trust: &ClientIp) -> IpAddr {
    let peer = peer.to_canonical();
    if trust.trusted_proxies.is_empty() || !trust.trusts(peer) {
        return peer;
    }
    let mut client = peer;
    let hops = headers
        .all(&X_FORWARDED_FOR)
        .rev()
        .flat_map(|v| v.to_str().unwrap_or("").rsplit(','));
    for hop in hops {
        // An entry that is not an address ends what can be believed: the
        // last proxy that added one is the client as far as we know.
        let Some(ip) = parse_hop(hop) else {
            return client;
        };
        client = ip;
        if !trust.trusts(ip) {
            return ip;
        }
    }
    client
}

/// One `X-Forwarded-For` entry: an address, optionally `[v6]:port` or
/// `v4:port` as some proxies write it.
fn parse_hop(hop: &str) -> Option<IpAddr> {
    let hop = hop.trim();
    if let Ok(ip) = hop.parse::<IpAddr>() {
        return Some(ip.to_canonical());
    }
    if let Some(rest) = hop.strip_prefix('[') {
        return rest.split_once(']')?.0.parse::<IpAddr>().ok();
    }
    let (ip, port) = hop.rsplit_once(':')?;
    port.parse::<u16>().ok()?;
    ip.parse::<std::net::Ipv4Addr>().ok().map(IpAddr::V4)
}

/// The bytes a client is counted under for per-client limits (DESIGN
/// §8.3): an IPv4 address, or the /64 of an IPv6 address (one household or
/// one cloud host gets a whole /64, so counting single v6 addresses would
/// give it unlimited places). Held inline: no allocation per request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LimitKey {
    bytes: [u8; 9],
    len: u8,
}

impl LimitKey {
    /// The key of no client: no per-client limit applies.
    pub const NONE: LimitKey = LimitKey {
        bytes: [0; 9],
        len: 0,
    };

    /// The key bytes, as the store takes them.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }
}

/// The [`LimitKey`] of `ip`.
pub fn limit_key(ip: IpAddr) -> LimitKey {
    let mut bytes = [0u8; 9];
    match ip.to_canonical() {
        IpAddr::V4(v4) => {
            bytes[0] = 4;
            bytes[1..5].copy_from_slice(&v4.octets());
            LimitKey { bytes, len: 5 }
        }
        IpAddr::V6(v6) => {
            bytes[0] = 6;
            bytes[1..9].copy_from_slice(&v6.octets()[..8]);
            LimitKey { bytes, len: 9 }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{HeaderMap, HeaderValue};

    fn trust(nets: &[&str]) -> ClientIp {
        ClientIp {
            trusted_proxies: nets.iter().map(|n| n.parse().unwrap()).collect(),
        }
    }

    fn xff(values: &[&'static str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append("x-forwarded-for", HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn an_untrusted_peer_is_the_client_whatever_it_says() {
        let peer: IpAddr = "203.0.113.9".parse().unwrap();
        let h = xff(&["198.51.100.1"]);
        assert_eq!(client_of(peer, &h, &trust(&[])), peer);
        assert_eq!(client_of(peer, &h, &trust(&["10.0.0.0/8"])), peer);
    }

    #[test]
    fn behind_trusted_proxies_the_rightmost_untrusted_hop_is_the_client() {
        let peer: IpAddr = "10.0.0.2".parse().unwrap();
        let t = trust(&["10.0.0.0/8"]);
        // The client put a spoofed entry first; the proxy appended the truth.
        let h = xff(&["1.2.3.4, 198.51.100.7, 10.0.0.5"]);
        assert_eq!(
            client_of(peer, &h, &t),
            "198.51.100.7".parse::<IpAddr>().unwrap()
        );
        let h = xff(&["1.2.3.4", "198.51.100.7"]);
        assert_eq!(
            client_of(peer, &h, &t),
            "198.51.100.7".parse::<IpAddr>().unwrap()
        );
        // Only trusted hops: the leftmost is as far as we can see.
        let h = xff(&["10.1.1.1, 10.0.0.5"]);
        assert_eq!(
            client_of(peer, &h, &t),
            "10.1.1.1".parse::<IpAddr>().unwrap()
        );
        // Garbage stops the walk at the last believable hop.
        let h = xff(&["198.51.100.7, garbage, 10.0.0.5"]);
        assert_eq!(
            client_of(peer, &h, &t),
            "10.0.0.5".parse::<IpAddr>().unwrap()
        );
        // No header: the proxy itself.
        assert_eq!(client_of(peer, &HeaderMap::new(), &t), peer);
        // Ports as some proxies write them.
        let h = xff(&["198.51.100.7:4711"]);
        assert_eq!(
            client_of(peer, &h, &t),
            "198.51.100.7".parse::<IpAddr>().unwrap()
        );
        let h = xff(&["[2001:db8::1]:4711"]);
        assert_eq!(
            client_of(peer, &h, &t),
            "2001:db8::1".parse::<IpAddr>().unwrap()
        );
    }

    #[test]
    fn an_ipv6_client_is_counted_by_its_64() {
        let a = limit_key("2001:db8:1:2::1".parse().unwrap());
        let b = limit_key("2001:db8:1:2:ffff::9".parse().unwrap());
        let c = limit_key("2001:db8:1:3::1".parse().unwrap());
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_eq!(
            limit_key("::ffff:192.0.2.1".parse().unwrap()),
            limit_key("192.0.2.1".parse().unwrap())
        );
    }
}
