//! From an HTTP request to the JSON bytes it carries, the way PostHog's clients send
//! them: the `data` query parameter or the body, form fields, compression hints, gzip
//! (by hint or magic bytes), LZ-String "lz64", and base64 (by hint or by sniffing).
//! Every decompressor is capped so a small bomb cannot exhaust memory.

use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig};
use base64::engine::DecodePaddingMode;
use base64::Engine;
use bytes::Bytes;

use super::inflate;
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

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("the request carries no data")]
    Empty,
    #[error("the body is not valid gzip")]
    Gzip,
    #[error("the body is not valid lz64: {0}")]
    Lz64(lz64::Error),
    #[error("the body is not valid base64")]
    Base64,
    /// Larger than the cap once decompressed.
    #[error("the payload is too large once decompressed")]
    TooLarge,
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

/// Apply the compression the bytes themselves or the hint call for. The bytes are
/// looked at first, as PostHog's capture looks at gzip's magic bytes before any
/// hint: a gzip stream is inflated and a JSON text is taken as it is whatever the
/// hint says, so a hint that contradicts the body is no error when the body is what
/// it is. Only then does the hint decide:
/// - gzip: a base64 body (a form's `data=`, say) is decoded, then inflated if it is
///   gzip or kept if it is JSON; anything else is not valid gzip.
/// - lz64: a base64 body that decodes to JSON is plain base64 (a form sent with the
///   wrong hint); anything else is LZ-String.
/// - base64: decoded, or refused.
/// - none: base64 by sniffing, else the raw bytes.
///
/// Every choice depends on the bytes alone, never on `max`, so a cap changes only
/// whether the one answer fits. The result is a fresh buffer either way: the JSON
/// parser works in place.
pub fn decompress(raw: &[u8], hint: Compression, max: usize) -> Result<Vec<u8>, Error> {
    let out = if raw.starts_with(&GZIP_MAGIC) {
        gunzip(raw, max)?
    } else if starts_as_json(raw) {
        raw.to_vec()
    } else {
        match hint {
            Compression::Gzip => {
                let decoded = looks_like_base64(raw)
                    .then(|| BASE64.decode(raw).ok())
                    .flatten()
                    .ok_or(Error::Gzip)?;
                if decoded.starts_with(&GZIP_MAGIC) {
                    gunzip(&decoded, max)?
                } else if is_json_text(&decoded) {
                    decoded
                } else {
                    return Err(Error::Gzip);
                }
            }
            Compression::Lz64 => match BASE64.decode(raw) {
                Ok(decoded) if is_json_text(&decoded) => decoded,
                _ => lz64::decompress_from_base64(raw, max)
                    .map_err(|e| match e {
                        // Over the cap is the same answer (413) whatever the compression.
                        lz64::Error::TooLarge => Error::TooLarge,
                        e => Error::Lz64(e),
                    })?
                    .into_bytes(),
            },
            Compression::Base64 => BASE64.decode(raw).map_err(|_| Error::Base64)?,
            Compression::None if looks_like_base64(raw) => {
                BASE64.decode(raw).unwrap_or_else(|_| raw.to_vec())
            }
            Compression::None => raw.to_vec(),
        }
    };
    if out.len() > max {
        return Err(Error::TooLarge);
    }
    Ok(out)
}

fn gunzip(raw: &[u8], max: usize) -> Result<Vec<u8>, Error> {
    inflate::gunzip(raw, max).map_err(|e| match e {
        inflate::Error::Corrupt => Error::Gzip,
        inflate::Error::TooLarge => Error::TooLarge,
    })
}

fn looks_like_base64(raw: &[u8]) -> bool {
    raw.len().is_multiple_of(4)
        && raw
            .iter()
            .take(BASE64_SNIFF_BYTES)
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'='))
}

/// Whether the bytes open and close like a JSON object or array: no base64, lz64 or
/// gzip body does (none of their alphabets has a brace or a bracket), so such a body
/// is JSON whatever its hint says. The parser finds out whether it really is.
fn starts_as_json(bytes: &[u8]) -> bool {
    let t = bytes.trim_ascii();
    matches!(
        (t.first(), t.last()),
        (Some(b'{'), Some(b'}')) | (Some(b'['), Some(b']'))
    )
}

/// [`starts_as_json`] and UTF-8 throughout: what bytes decoded from base64 must be
/// to be taken as the payload. Random bytes (LZ-String's output read as base64) are
/// almost never valid UTF-8 for more than a few bytes.
fn is_json_text(bytes: &[u8]) -> bool {
    starts_as_json(bytes) && std::str::from_utf8(bytes).is_ok()
}

#[cfg(test)]
#[path = "tests/decode.rs"]
mod tests;
