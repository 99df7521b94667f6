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
    let listen = app.config.listen;
    let host = headers.get(HOST).and_then(|h| h.to_str().ok());
    match host {
        Some(host) if is_own_name(host, listen) => {
            let https = headers
                .get("x-forwarded-proto")
                .and_then(|h| h.to_str().ok())
                .is_some_and(|s| s.trim().eq_ignore_ascii_case("https"));
            format!("{}://{host}", if https { "https" } else { "http" })
        }
        _ => String::new(),
    }
}

/// Whether `host` (a Host header: name, IPv4, or bracketed IPv6, with an optional port)
/// is one of the listener's own names: `localhost`, the address it is bound to, or a
/// loopback address when it is bound to every interface.
fn is_own_name(host: &str, listen: std::net::SocketAddr) -> bool {
    let name = match host.strip_prefix('[') {
        Some(rest) => match rest.split_once(']') {
            Some((inside, after)) if after.is_empty() || after.starts_with(':') => inside,
            _ => return false,
        },
        None => host.rsplit_once(':').map_or(host, |(name, _)| name),
    };
    if name.eq_ignore_ascii_case("localhost") {
        return true;
    }
    match name.parse::<std::net::IpAddr>() {
        Ok(ip) => {
            let ip = ip.to_canonical();
            ip == listen.ip().to_canonical() || (listen.ip().is_unspecified() && ip.is_loopback())
        }
        Err(_) => false,
    }
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
        for yes in ["localhost", "LOCALHOST:8000", "127.0.0.1:8000", "127.0.0.1"] {
            assert!(is_own_name(yes, loopback), "{yes}");
        }
        for no in [
            "evil.example",
            "evil.example:8000",
            "localhost.evil.example",
            "10.0.0.1:8000",
            "[::1",
            "",
        ] {
            assert!(!is_own_name(no, loopback), "{no}");
        }
        let any = "[::]:8000".parse().unwrap();
        assert!(is_own_name("[::1]:8000", any));
        assert!(is_own_name("127.0.0.2", any));
        assert!(!is_own_name("203.0.113.9", any));
        let public = "203.0.113.9:80".parse().unwrap();
        assert!(is_own_name("203.0.113.9", public));
        assert!(!is_own_name("203.0.113.10", public));
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
