//! The client's address: the socket peer, or, when the peer is a proxy we trust, the
//! rightmost `X-Forwarded-For` entry that is not itself a trusted proxy (the chain walked
//! from the right, the end our own proxies wrote).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};

use super::Error;

/// The proxies whose `X-Forwarded-For` is believed. Any other peer is the client itself, so
/// a client cannot choose its own `$ip` (or location) by sending the header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TrustedProxies {
    /// Each network truncated to its prefix, so equal lists compare equal.
    pub(super) nets: Vec<IpNet>,
}

impl TrustedProxies {
    /// The default: 127.0.0.0/8 and ::1, for nginx on the same VM.
    pub fn loopback_only() -> Self {
        TrustedProxies {
            nets: vec![
                IpNet::V4(Ipv4Net::new_assert(Ipv4Addr::new(127, 0, 0, 0), 8)),
                IpNet::V6(Ipv6Net::new_assert(Ipv6Addr::LOCALHOST, 128)),
            ],
        }
    }

    /// Parses a comma-separated list of addresses and CIDR networks, e.g.
    /// `127.0.0.1,::1,10.0.0.0/8`. Spaces and empty entries are ignored, so an empty list
    /// trusts nobody. Host bits below the prefix are ignored (`10.1.2.3/8` is `10.0.0.0/8`),
    /// as nginx's `set_real_ip_from` does. An IPv4-mapped entry (`::ffff:10.0.0.0/104`)
    /// means the IPv4 network.
    pub fn parse(list: &str) -> Result<Self, Error> {
        let nets = list
            .split(',')
            .map(str::trim)
            .filter(|entry| !entry.is_empty())
            .map(|entry| {
                parse_net(entry).ok_or_else(|| Error::Proxy {
                    entry: entry.to_owned(),
                })
            })
            .collect::<Result<_, _>>()?;
        Ok(TrustedProxies { nets })
    }

    /// Whether `ip` is a trusted proxy. An IPv4-mapped IPv6 address (what a dual-stack
    /// listener reports for an IPv4 peer) is judged as the IPv4 address it carries.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        self.nets.iter().any(|net| net.contains(&ip))
    }
}

impl Default for TrustedProxies {
    fn default() -> Self {
        TrustedProxies::loopback_only()
    }
}

/// One entry: an address or `address/prefix`, spaces allowed around the slash (the
/// syntax is ours, as lenient as nginx's; the network arithmetic is `ipnet`'s).
fn parse_net(entry: &str) -> Option<IpNet> {
    let (addr, prefix) = match entry.split_once('/') {
        Some((addr, prefix)) => (addr.trim_end(), Some(parse_prefix(prefix.trim_start())?)),
        None => (entry, None),
    };
    let net = match addr.parse::<IpAddr>().ok()? {
        IpAddr::V4(v4) => IpNet::V4(Ipv4Net::new(v4, prefix.unwrap_or(32)).ok()?),
        IpAddr::V6(v6) => match (v6.to_ipv4_mapped(), prefix) {
            (Some(v4), None) => IpNet::V4(Ipv4Net::new(v4, 32).ok()?),
            (Some(v4), Some(p)) if p >= 96 => IpNet::V4(Ipv4Net::new(v4, p - 96).ok()?),
            _ => IpNet::V6(Ipv6Net::new(v6, prefix.unwrap_or(128)).ok()?),
        },
    };
    Some(net.trunc())
}

/// Digits only: `u8::from_str` would also take a leading `+`.
fn parse_prefix(text: &str) -> Option<u8> {
    if text.is_empty() || text.len() > 3 || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

/// The client's address. When the socket peer is a trusted proxy, `X-Forwarded-For` is
/// walked from the right: each entry a trusted proxy appended is passed over, and the
/// first one that is not a trusted proxy is the client, since only the entries to its
/// right were written by proxies we trust (whatever is left of it, the client wrote
/// itself). An entry that does not parse ends the walk at the last good one (the peer,
/// if it is the rightmost). Pass every `X-Forwarded-For` header joined with commas, in
/// order. The result is canonical (`::ffff:1.2.3.4` becomes `1.2.3.4`), so `$ip` has one
/// spelling per client.
///
/// This is nginx's `real_ip_recursive on`: safe behind `$proxy_add_x_forwarded_for`
/// (which appends the client's address to whatever it sent) as behind a proxy that
/// overwrites the header, and behind a chain of proxies once each is in the list.
pub fn client_ip(peer: IpAddr, x_forwarded_for: Option<&[u8]>, trusted: &TrustedProxies) -> IpAddr {
    let mut client = peer.to_canonical();
    if !trusted.contains(client) {
        return client;
    }
    let Some(chain) = x_forwarded_for else {
        return client;
    };
    for entry in chain.rsplit(|&b| b == b',') {
        let Some(ip) = entry_ip(entry) else {
            break;
        };
        client = ip;
        if !trusted.contains(ip) {
            break;
        }
    }
    client
}

/// The address an attempt or a connection is counted against: an IPv6 client by its
/// /64, the block one subscriber holds, so its billions of addresses count as one.
pub fn subscriber(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) => {
            let [a, b, c, d, ..] = v6.segments();
            IpAddr::V6(Ipv6Addr::new(a, b, c, d, 0, 0, 0, 0))
        }
        v4 => v4,
    }
}

fn entry_ip(entry: &[u8]) -> Option<IpAddr> {
    let text = std::str::from_utf8(entry.trim_ascii()).ok()?;
    parse_host(text).map(|ip| ip.to_canonical())
}

/// The leftmost address of an `X-Forwarded-For` value, whoever sent it (/decide uses it for
/// location when present). Accepts surrounding whitespace, `1.2.3.4:5678`, `[::1]` and
/// `[::1]:80`; anything else in the first entry (`unknown`, an empty entry, bad UTF-8) is
/// `None`. The result is canonical, as in [`client_ip`].
pub fn forwarded_for(x_forwarded_for: &[u8]) -> Option<IpAddr> {
    entry_ip(x_forwarded_for.split(|&b| b == b',').next()?)
}

fn parse_host(text: &str) -> Option<IpAddr> {
    if let Some(rest) = text.strip_prefix('[') {
        let (inside, after) = rest.split_once(']')?;
        if !after.is_empty() && !is_port(after.strip_prefix(':')?) {
            return None;
        }
        return inside.parse::<Ipv6Addr>().ok().map(IpAddr::V6);
    }
    if let Ok(ip) = text.parse::<IpAddr>() {
        return Some(ip);
    }
    // Not an address on its own: the only other accepted form is IPv4 with a port, since a
    // bare IPv6 address with a port is ambiguous and proxies bracket it.
    let (host, port) = text.split_once(':')?;
    if !is_port(port) {
        return None;
    }
    host.parse::<Ipv4Addr>().ok().map(IpAddr::V4)
}

fn is_port(text: &str) -> bool {
    !text.is_empty() && text.len() <= 5 && text.bytes().all(|b| b.is_ascii_digit())
}
