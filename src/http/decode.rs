//! From an HTTP request to the JSON bytes it carries, the way PostHog's clients send
//! them: the `data` query parameter or the body, form fields, compression hints, gzip
//! (by hint or magic bytes), LZ-String "lz64", and base64 (by hint or by sniffing).
//! Every decompressor is capped so a small bomb cannot exhaust memory.

use std::io::Read;

use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig};
use base64::engine::DecodePaddingMode;
use base64::Engine;
use bytes::Bytes;

use crate::lz64;

/// Standard base64, whether or not the client kept the `=` padding.
const BASE64: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);
const GZIP_MAGIC: [u8; 3] = [0x1f, 0x8b, 0x08];
/// How many leading bytes decide whether an unhinted body looks like base64.
const BASE64_SNIFF_BYTES: usize = 64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    None,
    Gzip,
    Lz64,
    Base64,
}

impl Compression {
    /// A hint's meaning; an unknown value means no compression, not an error.
    pub fn from_hint(hint: &str) -> Compression {
        match hint.trim().to_ascii_lowercase().as_str() {
            "gzip" | "gzip-js" => Compression::Gzip,
            "lz64" | "lz-string" => Compression::Lz64,
            "base64" | "b64" => Compression::Base64,
            _ => Compression::None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    Empty,
    Gzip,
    Lz64(lz64::Error),
    Base64,
    /// Larger than the cap once decompressed.
    TooLarge,
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Empty => f.write_str("the request carries no data"),
            Error::Gzip => f.write_str("the body is not valid gzip"),
            Error::Lz64(e) => write!(f, "the body is not valid lz64: {e}"),
            Error::Base64 => f.write_str("the body is not valid base64"),
            Error::TooLarge => f.write_str("the payload is too large once decompressed"),
        }
    }
}

/// What the query string says about the payload.
#[derive(Debug, Default)]
pub struct Query {
    pub data: Option<String>,
    pub compression: Option<String>,
    /// posthog-js's `_`: the client's send time in milliseconds.
    pub sent_at_ms: Option<i64>,
    pub beacon: bool,
}

impl Query {
    pub fn parse(query: Option<&str>) -> Query {
        let mut q = Query::default();
        for (k, v) in form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
            match &*k {
                "data" if !v.is_empty() => q.data = Some(unform_base64(&v)),
                "compression" => q.compression = Some(v.into_owned()),
                "_" => q.sent_at_ms = v.parse::<f64>().ok().map(|ms| ms as i64),
                "beacon" => q.beacon = v == "1" || v == "true",
                _ => {}
            }
        }
        q
    }
}

/// Form decoding turns base64's `+` into spaces; put them back.
fn unform_base64(v: &str) -> String {
    v.replace(' ', "+")
}

/// A request's payload, found once: the bytes to decode (the `data` query parameter,
/// a form's `data` field, or the body, trimmed) and the compression the first hint
/// names. Deciding where to decode it and decoding it both read this, so a form is
/// parsed, and its `data` field unescaped, only once.
pub struct Located {
    raw: Bytes,
    hint: Compression,
}

impl Located {
    /// Only a form's `data` field and the `data` query parameter are copied; a plain
    /// body is shared.
    pub fn find(
        query: &Query,
        content_type: Option<&str>,
        content_encoding: Option<&str>,
        body: &Bytes,
    ) -> Located {
        let mut form_compression = None;
        let raw = if let Some(data) = &query.data {
            Bytes::copy_from_slice(data.as_bytes())
        } else if content_type.is_some_and(is_form) {
            let mut data = None;
            for (k, v) in form_urlencoded::parse(body) {
                match &*k {
                    "data" => data = Some(unform_base64(&v)),
                    "compression" => form_compression = Some(v.into_owned()),
                    _ => {}
                }
            }
            data.map_or_else(|| body.clone(), |d| Bytes::from(d.into_bytes()))
        } else {
            body.clone()
        };
        let hint = query
            .compression
            .as_deref()
            .or(form_compression.as_deref())
            .or(content_encoding)
            .map_or(Compression::None, Compression::from_hint);
        Located {
            raw: raw.slice_ref(raw.trim_ascii()),
            hint,
        }
    }

    /// Bytes to decode, before decompression.
    pub fn len(&self) -> usize {
        self.raw.len()
    }

    pub fn is_empty(&self) -> bool {
        self.raw.is_empty()
    }

    /// Whether decoding may produce far more than the request carries (gzip or lz64):
    /// then its cost follows the decompressed cap, not the size of the request.
    pub fn may_expand(&self) -> bool {
        matches!(self.hint, Compression::Gzip | Compression::Lz64)
            || self.raw.starts_with(&GZIP_MAGIC)
    }

    /// The payload, decompressed within `max_decoded` bytes.
    pub fn decode(&self, max_decoded: usize) -> Result<Vec<u8>, Error> {
        if self.raw.is_empty() {
            return Err(Error::Empty);
        }
        decompress(&self.raw, self.hint, max_decoded)
    }

    /// [`decode`](Self::decode), but only as far as `small` bytes of output:
    /// `Ok(None)` when the payload decodes to more (it is then worth decoding
    /// elsewhere), else exactly what `decode(max_decoded)` gives.
    pub fn decode_small(&self, small: usize, max_decoded: usize) -> Result<Option<Vec<u8>>, Error> {
        if small >= max_decoded {
            return self.decode(max_decoded).map(Some);
        }
        match self.decode(small) {
            Err(Error::TooLarge) => Ok(None),
            other => other.map(Some),
        }
    }
}

/// The decoded payload of a request given as a slice. `content_type` and
/// `content_encoding` are the headers' values, if any.
pub fn payload(
    query: &Query,
    content_type: Option<&str>,
    content_encoding: Option<&str>,
    body: &[u8],
    max_decoded: usize,
) -> Result<Vec<u8>, Error> {
    let body = Bytes::copy_from_slice(body);
    Located::find(query, content_type, content_encoding, &body).decode(max_decoded)
}

/// [`Located::may_expand`] for a request given as a slice.
pub fn may_expand(
    query: &Query,
    content_type: Option<&str>,
    content_encoding: Option<&str>,
    body: &[u8],
) -> bool {
    let body = Bytes::copy_from_slice(body);
    Located::find(query, content_type, content_encoding, &body).may_expand()
}

fn is_form(content_type: &str) -> bool {
    content_type
        .trim_start()
        .to_ascii_lowercase()
        .starts_with("application/x-www-form-urlencoded")
}

/// Apply the compression the hint or the bytes themselves call for.
/// The result is a fresh buffer either way: the JSON parser works in place.
pub fn decompress(raw: &[u8], hint: Compression, max: usize) -> Result<Vec<u8>, Error> {
    let out = if hint == Compression::Gzip || raw.starts_with(&GZIP_MAGIC) {
        gunzip(raw, max)?
    } else if hint == Compression::Lz64 {
        lz64::decompress_from_base64(raw, max)
            .map_err(|e| match e {
                // Over the cap is the same answer (413) whatever the compression.
                lz64::Error::TooLarge => Error::TooLarge,
                e => Error::Lz64(e),
            })?
            .into_bytes()
    } else if hint == Compression::Base64 {
        BASE64.decode(raw).map_err(|_| Error::Base64)?
    } else if looks_like_base64(raw) {
        BASE64.decode(raw).unwrap_or_else(|_| raw.to_vec())
    } else {
        raw.to_vec()
    };
    if out.len() > max {
        return Err(Error::TooLarge);
    }
    Ok(out)
}

fn looks_like_base64(raw: &[u8]) -> bool {
    raw.len().is_multiple_of(4)
        && raw
            .iter()
            .take(BASE64_SNIFF_BYTES)
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'='))
}

/// Inflated output is gathered in pieces of at most this size, so growing it never
/// copies a large buffer (which would briefly hold it twice).
const GUNZIP_PIECE: usize = 1024 * 1024;

/// Gunzip (concatenated members too, as gzip allows), failing once the output would
/// pass `max` bytes: at most `max + 1` bytes are ever inflated. The first piece grows
/// from an estimate, so output under a piece, the common case, is one buffer that is
/// neither copied into place nor given a piece's worth of memory it does not use;
/// later pieces are allocated at their full size.
fn gunzip(raw: &[u8], max: usize) -> Result<Vec<u8>, Error> {
    let mut decoder = flate2::read::MultiGzDecoder::new(raw);
    let mut pieces: Vec<Vec<u8>> = Vec::new();
    let mut total = 0usize;
    loop {
        let want = GUNZIP_PIECE.min(max.saturating_sub(total).saturating_add(1));
        let mut piece = if pieces.is_empty() {
            Vec::with_capacity((raw.len() * 8).clamp(1024, GUNZIP_PIECE).min(want))
        } else {
            Vec::with_capacity(want)
        };
        let n = (&mut decoder)
            .take(want as u64)
            .read_to_end(&mut piece)
            .map_err(|_| Error::Gzip)?;
        total += n;
        if total > max {
            return Err(Error::TooLarge);
        }
        if n > 0 {
            pieces.push(piece);
        }
        // Short of what was asked for: the stream has ended.
        if n < want {
            break;
        }
    }
    if pieces.len() <= 1 {
        return Ok(pieces.pop().unwrap_or_default());
    }
    let mut out = Vec::with_capacity(total);
    for piece in pieces.drain(..) {
        out.extend_from_slice(&piece);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use flate2::write::GzEncoder;
    use std::io::Write;

    const MAX: usize = 1 << 20;

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut e = GzEncoder::new(Vec::new(), flate2::Compression::best());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    fn decode(
        query: &str,
        ct: Option<&str>,
        ce: Option<&str>,
        body: &[u8],
    ) -> Result<Vec<u8>, Error> {
        payload(&Query::parse(Some(query)), ct, ce, body, MAX)
    }

    // Its base64 form contains "+", which form encoding would turn into a space.
    const JSON: &[u8] = br#"{"event":"~~>?"}"#;

    #[test]
    fn plain_and_gzip() {
        assert_eq!(decode("", None, None, JSON).unwrap(), JSON);
        // By magic bytes, whatever the hint says.
        assert_eq!(decode("", None, None, &gzip(JSON)).unwrap(), JSON);
        assert_eq!(
            decode("compression=base64", None, None, &gzip(JSON)).unwrap(),
            JSON
        );
        assert_eq!(
            decode("compression=gzip-js", Some("text/plain"), None, &gzip(JSON)).unwrap(),
            JSON
        );
        assert_eq!(decode("", None, Some("gzip"), &gzip(JSON)).unwrap(), JSON);
        // Hinted gzip that is not gzip.
        assert_eq!(
            decode("compression=gzip", None, None, JSON),
            Err(Error::Gzip)
        );
    }

    #[test]
    fn base64_forms() {
        let b64 = BASE64.encode(JSON);
        assert!(b64.contains('+') || b64.contains('/'));
        let form = format!("data={}&compression=base64", b64.replace('+', "%2B"));
        let ct = Some("application/x-www-form-urlencoded");
        assert_eq!(decode("", ct, None, form.as_bytes()).unwrap(), JSON);
        // A '+' that form encoding turned into a space still decodes.
        let spaced = format!("data={}", b64.replace('+', " "));
        assert_eq!(decode("", ct, None, spaced.as_bytes()).unwrap(), JSON);
        // Sniffed without a hint.
        assert_eq!(decode("", None, None, b64.as_bytes()).unwrap(), JSON);
        // GET with data= in the query string.
        let q = format!("data={}", b64.replace('+', "%2B").replace('/', "%2F"));
        assert_eq!(decode(&q, None, None, b"").unwrap(), JSON);
        // Hinted base64 that is not.
        assert_eq!(
            decode("compression=b64", None, None, b"!!!!"),
            Err(Error::Base64)
        );
        // Looks like base64 but is not: the raw bytes are kept.
        assert_eq!(decode("", None, None, b"abc=abcd").unwrap(), b"abc=abcd");
    }

    #[test]
    fn hints_in_order() {
        assert_eq!(Compression::from_hint("GZIP"), Compression::Gzip);
        assert_eq!(Compression::from_hint("lz-string"), Compression::Lz64);
        assert_eq!(Compression::from_hint("zstd"), Compression::None);
        // The query's hint wins over the header's.
        let b64 = BASE64.encode(JSON);
        assert_eq!(
            decode("compression=base64", None, Some("gzip"), b64.as_bytes()).unwrap(),
            JSON
        );
        // An unknown hint is no compression.
        assert_eq!(
            decode("compression=brotli", None, None, JSON).unwrap(),
            JSON
        );
    }

    #[test]
    fn caps_and_empties() {
        let bomb = gzip(&vec![b'a'; MAX + 1]);
        assert!(bomb.len() < 4096);
        assert_eq!(decode("", None, None, &bomb), Err(Error::TooLarge));
        assert_eq!(
            decode("", None, None, &gzip(&vec![b' '; MAX])).map(|v| v.len()),
            Ok(MAX)
        );
        assert_eq!(decode("", None, None, b"  \n"), Err(Error::Empty));
        assert_eq!(decode("data=", None, None, b""), Err(Error::Empty));
        // Truncated gzip.
        let g = gzip(JSON);
        assert_eq!(decode("", None, None, &g[..g.len() - 6]), Err(Error::Gzip));
    }

    #[test]
    fn gunzip_sizes() {
        // Around the first piece's estimate, one piece, several pieces, the cap.
        let text = |n: usize| (0..n).map(|i| (i * 7 % 251) as u8).collect::<Vec<u8>>();
        for n in [
            0,
            1,
            1023,
            1024,
            5000,
            GUNZIP_PIECE - 1,
            GUNZIP_PIECE,
            GUNZIP_PIECE + 1,
            2 * GUNZIP_PIECE + 3,
        ] {
            let data = text(n);
            let g = gzip(&data);
            assert_eq!(gunzip(&g, usize::MAX).as_deref(), Ok(&data[..]), "{n}");
            assert_eq!(gunzip(&g, n).as_deref(), Ok(&data[..]), "{n}");
            if n > 0 {
                assert_eq!(gunzip(&g, n - 1), Err(Error::TooLarge), "{n}");
            }
        }
        // Two members, as one stream.
        let two = [gzip(b"ab"), gzip(b"cd")].concat();
        assert_eq!(gunzip(&two, 4).as_deref(), Ok(&b"abcd"[..]));
        assert_eq!(gunzip(&two, 3), Err(Error::TooLarge));
    }

    #[test]
    fn small_decodes_as_the_full_one() {
        let big = vec![b'x'; 10_000];
        for (query, body) in [
            ("", gzip(JSON)),
            ("", gzip(&big)),
            ("", JSON.to_vec()),
            ("compression=gzip", JSON.to_vec()),
            ("compression=lz64", b"IZA=".to_vec()),
            ("compression=lz64", b"!!".to_vec()),
            ("", b"   ".to_vec()),
        ] {
            let body = Bytes::from(body);
            let located = Located::find(&Query::parse(Some(query)), None, None, &body);
            for max in [0, 1, 100, MAX] {
                let full = located.decode(max);
                assert_eq!(located.decode_small(MAX, max), full.clone().map(Some));
                match located.decode_small(64, max) {
                    // Left to a full decode, which gives `full` (an error past 64
                    // bytes of output is found there).
                    Ok(None) => assert!(max > 64 && !full.is_ok_and(|v| v.len() <= 64)),
                    small => assert_eq!(small, full.map(Some), "{query} {max}"),
                }
            }
        }
    }

    /// Found by the `decode_body` fuzzer: an lz64 payload over the cap was reported as
    /// invalid lz64 (400) instead of too large (413) like gzip.
    #[test]
    fn lz64_over_the_cap_is_too_large() {
        // lz-string's "a".
        assert_eq!(decompress(b"IZA=", Compression::Lz64, 1), Ok(b"a".to_vec()));
        assert_eq!(
            decompress(b"IZA=", Compression::Lz64, 0),
            Err(Error::TooLarge)
        );
    }

    #[test]
    fn what_may_expand() {
        let expands = |query: &str, ct: Option<&str>, ce: Option<&str>, body: &[u8]| {
            may_expand(&Query::parse(Some(query)), ct, ce, body)
        };
        let form = Some("application/x-www-form-urlencoded");
        assert!(expands("compression=lz64", None, None, b"IZA="));
        assert!(expands(
            "",
            form,
            None,
            b"data=IZA%3D&compression=lz-string"
        ));
        assert!(expands("", None, Some("gzip"), JSON));
        assert!(expands("", None, None, &gzip(JSON)));
        assert!(!expands("", None, None, JSON));
        assert!(!expands("compression=base64", form, None, b"data=e30%3D"));
        assert!(!expands("data=e30%3D", None, None, b""));
    }

    #[test]
    fn query_fields() {
        let q = Query::parse(Some("_=1700000000123&beacon=1&ver=1.2&compression=lz64"));
        assert_eq!(q.sent_at_ms, Some(1_700_000_000_123));
        assert!(q.beacon);
        assert_eq!(q.compression.as_deref(), Some("lz64"));
        assert!(q.data.is_none());
    }
}
