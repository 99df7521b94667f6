//! Edge mode's command-line values: the upstream's URL, durations (`30`, `30s`, `5m`,
//! `24h`, `7d`) and byte sizes (`536870912`, `512M`, `4G`). Plain numbers are seconds
//! and bytes, as the contract's `--upstream-poll SECS` and `--upstream-max-backlog
//! BYTES` say; the suffixes are there because nobody types 86400 correctly twice.

use std::time::Duration;

use crate::config::Upstream;

/// The upstream's settings with the defaults, from `http[s]://host[:port]` (a trailing
/// `/` is dropped; a path, query or other scheme is refused, since every upstream
/// endpoint is at the root of PostHog's ingestion host).
pub fn parse_url(url: &str) -> Result<Upstream, String> {
    let bad = |why: &str| format!("--upstream {url:?}: {why}");
    let uri: hyper::Uri = url.trim().parse().map_err(|_| bad("not a URL"))?;
    match uri.scheme_str() {
        Some("http") | Some("https") => {}
        _ => return Err(bad("give http:// or https://")),
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(bad("no host"));
    }
    if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
        return Err(bad("give only the scheme, host and port"));
    }
    if uri.authority().is_some_and(|a| a.as_str().contains('@')) {
        return Err(bad(
            "credentials do not go in the URL; use upstream_secret_key",
        ));
    }
    Ok(Upstream::new(url.trim()))
}

/// A duration: seconds, or a number with `s`, `m`, `h` or `d`; at least one second.
pub fn seconds(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let (number, unit) = match text.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => (&text[..i], c.to_ascii_lowercase()),
        _ => (text, 's'),
    };
    let scale: u64 = match unit {
        's' => 1,
        'm' => 60,
        'h' => 3600,
        'd' => 86_400,
        _ => return Err("use seconds, or a number with s, m, h or d".into()),
    };
    let n: u64 = number
        .trim()
        .parse()
        .map_err(|_| "not a whole number of seconds".to_string())?;
    match n.checked_mul(scale) {
        Some(0) => Err("must be at least one second".into()),
        Some(secs) => Ok(Duration::from_secs(secs)),
        None => Err("too large".into()),
    }
}

/// A size: bytes, or a number with `K`, `M`, `G` or `T` (powers of 1024, an optional
/// trailing `B` or `iB`).
pub fn bytes(text: &str) -> Result<u64, String> {
    let lower = text.trim().to_ascii_lowercase();
    let lower = lower
        .strip_suffix("ib")
        .or_else(|| lower.strip_suffix('b'))
        .unwrap_or(&lower);
    let (number, shift) = match lower.chars().last() {
        Some('k') => (&lower[..lower.len() - 1], 10),
        Some('m') => (&lower[..lower.len() - 1], 20),
        Some('g') => (&lower[..lower.len() - 1], 30),
        Some('t') => (&lower[..lower.len() - 1], 40),
        _ => (lower, 0),
    };
    let n: u64 = number
        .trim()
        .parse()
        .map_err(|_| "not a size: give bytes, or a number with K, M, G or T".to_string())?;
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| "too large".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let u = parse_url("https://eu.i.posthog.com/").unwrap();
        assert_eq!(u.url, "https://eu.i.posthog.com");
        assert_eq!(
            parse_url("http://127.0.0.1:8010").unwrap().url,
            "http://127.0.0.1:8010"
        );
        for bad in [
            "eu.i.posthog.com",
            "ftp://x",
            "https://x/api",
            "https://x/?a=1",
            "https://user:pw@x",
            "http://",
        ] {
            assert!(parse_url(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn durations() {
        assert_eq!(seconds("30").unwrap(), Duration::from_secs(30));
        assert_eq!(seconds("30s").unwrap(), Duration::from_secs(30));
        assert_eq!(seconds("5m").unwrap(), Duration::from_secs(300));
        assert_eq!(seconds("24h").unwrap(), Duration::from_secs(86_400));
        assert_eq!(seconds("7D").unwrap(), Duration::from_secs(604_800));
        for bad in [
            "",
            "0",
            "0h",
            "-1",
            "1.5h",
            "5w",
            "h",
            "99999999999999999999d",
        ] {
            assert!(seconds(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn sizes() {
        assert_eq!(bytes("1000").unwrap(), 1000);
        assert_eq!(bytes("512M").unwrap(), 512 << 20);
        assert_eq!(bytes("4GiB").unwrap(), 4 << 30);
        assert_eq!(bytes("2gb").unwrap(), 2 << 30);
        assert_eq!(bytes("1k").unwrap(), 1024);
        for bad in ["", "M", "1.5G", "-3", "99999999999T"] {
            assert!(bytes(bad).is_err(), "{bad}");
        }
    }
}
