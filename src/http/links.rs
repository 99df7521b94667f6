//! The base of the links this server answers with (`next` and `previous` of the read
//! and management APIs): the configured public URL, or, without one, the request's
//! `Host` only when it names this server, else nothing (links relative to the host the
//! client already reached). A `Host` header is whatever the client wrote, so taking it
//! as it comes would let anyone who can put a request in front of a victim's client (a
//! cache, a proxy with a default site) make the answer point the next page, and the key
//! the client sends with it, at their own host. Nor is the listening address a safe
//! fallback: behind nginx it is the client's own machine, which would receive the key.

use hyper::header::HOST;
use hyper::HeaderMap;

use crate::app::App;

/// `scheme://host[:port]` (and a path prefix, if any) of every link in answers to this
/// request, without a trailing slash; empty (links of path and query only) when there is
/// no public URL and the `Host` is not one of the listener's names.
pub fn base(app: &App, headers: &HeaderMap) -> String {
    if let Some(url) = &app.config.public_url {
        return url.clone();
    }
    let host = headers.get(HOST).and_then(|h| h.to_str().ok());
    match host.and_then(|host| own_authority(host, app.config.listen)) {
        Some(authority) => {
            let https = headers
                .get("x-forwarded-proto")
                .and_then(|h| h.to_str().ok())
                .is_some_and(|s| s.trim().eq_ignore_ascii_case("https"));
            format!("{}://{authority}", if https { "https" } else { "http" })
        }
        None => String::new(),
    }
}

/// The `Host` header rebuilt from its parsed parts when it is one of the listener's own
/// names (`localhost`, the address it is bound to, or a loopback address when it is
/// bound to every interface) with, if any, the listener's port. Parsed strictly (a
/// hostname, IPv4, or bracketed IPv6; a port of digits only) and never echoed, so
/// nothing after the name (`localhost:@evil.example`) can reach a link.
fn own_authority(host: &str, listen: std::net::SocketAddr) -> Option<String> {
    let (name, port) = match host.strip_prefix('[') {
        Some(rest) => {
            let (inside, after) = rest.split_once(']')?;
            let port = match after {
                "" => None,
                _ => Some(after.strip_prefix(':')?),
            };
            let ip: std::net::Ipv6Addr = inside.parse().ok()?;
            (std::net::IpAddr::V6(ip).to_string(), port)
        }
        None => {
            let (name, port) = match host.split_once(':') {
                Some((name, port)) => (name, Some(port)),
                None => (host, None),
            };
            let hostname_char = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '.';
            if name.is_empty() || !name.chars().all(hostname_char) {
                return None;
            }
            (name.to_ascii_lowercase(), port)
        }
    };
    if let Some(port) = port {
        if port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        if port.parse::<u16>().ok()? != listen.port() {
            return None;
        }
    }
    let own = name == "localhost"
        || match name.parse::<std::net::IpAddr>() {
            Ok(ip) => {
                let ip = ip.to_canonical();
                ip == listen.ip().to_canonical()
                    || (listen.ip().is_unspecified() && ip.is_loopback())
            }
            Err(_) => false,
        };
    if !own {
        return None;
    }
    let name = if name.contains(':') {
        format!("[{name}]")
    } else {
        name
    };
    Some(match port {
        Some(_) => format!("{name}:{}", listen.port()),
        None => name,
    })
}

/// `--public-url` checked: `http` or `https`, a host, no query or fragment; returned
/// without a trailing slash.
pub fn public_url(text: &str) -> Result<String, String> {
    let bad = || {
        format!(
            "--public-url {text:?} must be an http:// or https:// URL such as \
             https://flags.example.com, without a query"
        )
    };
    let uri: hyper::Uri = text.trim().parse().map_err(|_| bad())?;
    let scheme = uri.scheme_str().ok_or_else(bad)?;
    let authority = uri.authority().ok_or_else(bad)?;
    if !matches!(scheme, "http" | "https")
        || uri.query().is_some()
        || text.contains('#')
        || authority.as_str().contains('@')
        || authority.host().is_empty()
    {
        return Err(bad());
    }
    let path = uri.path().trim_end_matches('/');
    Ok(format!("{scheme}://{authority}{path}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_listeners_names_are_taken_from_host() {
        let loopback = "127.0.0.1:8000".parse().unwrap();
        let own = |host| own_authority(host, loopback);
        assert_eq!(own("localhost").as_deref(), Some("localhost"));
        assert_eq!(own("LOCALHOST:8000").as_deref(), Some("localhost:8000"));
        assert_eq!(own("127.0.0.1:8000").as_deref(), Some("127.0.0.1:8000"));
        assert_eq!(own("127.0.0.1").as_deref(), Some("127.0.0.1"));
        for no in [
            "evil.example",
            "evil.example:8000",
            "localhost.evil.example",
            "10.0.0.1:8000",
            "[::1",
            "",
            // Userinfo, a second port, or anything after the name must not get through.
            "localhost:@evil.example",
            "localhost:8000@evil.example",
            "localhost:8000:8000",
            "localhost@evil.example",
            "localhost/evil.example",
            "localhost:",
            "localhost:+8000",
            // Only the listener's port.
            "localhost:9000",
            "127.0.0.1:80",
            "localhost:008000x",
            "::1",
        ] {
            assert_eq!(own(no), None, "{no}");
        }
        let any = "[::]:8000".parse().unwrap();
        assert_eq!(
            own_authority("[::1]:8000", any).as_deref(),
            Some("[::1]:8000")
        );
        assert_eq!(own_authority("[0:0::1]", any).as_deref(), Some("[::1]"));
        assert_eq!(own_authority("[::1]:@evil.example", any), None);
        assert_eq!(own_authority("[::1]x", any), None);
        assert_eq!(own_authority("[::1]:9000", any), None);
        assert_eq!(
            own_authority("127.0.0.2", any).as_deref(),
            Some("127.0.0.2")
        );
        assert_eq!(own_authority("203.0.113.9", any), None);
        let public = "203.0.113.9:80".parse().unwrap();
        assert!(own_authority("203.0.113.9", public).is_some());
        assert_eq!(own_authority("203.0.113.10", public), None);
    }

    #[test]
    fn the_public_url_is_checked_and_trimmed() {
        assert_eq!(
            public_url("https://flags.example.com/").unwrap(),
            "https://flags.example.com"
        );
        assert_eq!(
            public_url("http://10.0.0.1:8000/flagpost/").unwrap(),
            "http://10.0.0.1:8000/flagpost"
        );
        for bad in [
            "flags.example.com",
            "ftp://flags.example.com",
            "https://flags.example.com/?a=1",
            "https://user@flags.example.com",
            "https://flags.example.com/#x",
            "",
        ] {
            assert!(public_url(bad).is_err(), "{bad}");
        }
    }
}
