//! The capped decompressors request bodies go through: gzip (concatenated members
//! too), zlib-wrapped or raw deflate, brotli and zstd. Each inflates at most one
//! byte past its cap, so a small bomb is refused as too large instead of exhausting
//! memory, and each gathers its output the same way (see [`read_capped`]). The body
//! is already in memory, so flate2's decoders read it as it is (`bufread`), not
//! through a zeroed 32 KiB buffer of their own for every request.

use std::io::Read;

/// Why a body could not be inflated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Error {
    /// Not a valid stream of the named encoding.
    Corrupt,
    /// Larger than the cap once inflated.
    TooLarge,
}

/// The bodies `Content-Encoding` may name on the v1 capture path, as PostHog's
/// capture lists them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    Gzip,
    /// `deflate`: zlib-wrapped (RFC 1950) when the first byte is `0x78`, else raw
    /// deflate (RFC 1951), the same sniff PostHog's capture and nginx make.
    Deflate,
    Brotli,
    Zstd,
}

impl Encoding {
    /// A `Content-Encoding` value, compared without regard to case; `None` for one
    /// that is not supported.
    pub fn from_header(value: &str) -> Option<Encoding> {
        match value.trim().to_ascii_lowercase().as_str() {
            "gzip" => Some(Encoding::Gzip),
            "deflate" => Some(Encoding::Deflate),
            "br" => Some(Encoding::Brotli),
            "zstd" => Some(Encoding::Zstd),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Encoding::Gzip => "gzip",
            Encoding::Deflate => "deflate",
            Encoding::Brotli => "br",
            Encoding::Zstd => "zstd",
        }
    }
}

/// The first byte of every zlib stream with a 32 KiB window, the only one deflate
/// encoders write.
const ZLIB_FIRST_BYTE: u8 = 0x78;
/// Brotli's input buffer: its own default.
const BROTLI_BUFFER_BYTES: usize = 4096;
/// The largest zstd window a frame may ask for. A frame's window is memory the
/// decoder may hold whatever the output; 8 MiB covers every level up to 19 on the
/// batch sizes clients send (posthog-rs uses the default level, a 2 MiB window at
/// most), where ruzstd's own default of 128 MiB would let one request claim that much.
const ZSTD_MAX_WINDOW_BYTES: u64 = 8 * 1024 * 1024;

/// Inflate `raw` as `encoding`, within `max` bytes of output.
pub fn decode(encoding: Encoding, raw: &[u8], max: usize) -> Result<Vec<u8>, Error> {
    match encoding {
        Encoding::Gzip => gunzip(raw, max),
        Encoding::Deflate if raw.first() == Some(&ZLIB_FIRST_BYTE) => {
            read_capped(flate2::bufread::ZlibDecoder::new(raw), raw.len(), max)
        }
        Encoding::Deflate => read_capped(flate2::bufread::DeflateDecoder::new(raw), raw.len(), max),
        Encoding::Brotli => read_capped(
            brotli_decompressor::Decompressor::new(raw, BROTLI_BUFFER_BYTES),
            raw.len(),
            max,
        ),
        Encoding::Zstd => {
            let decoder = ruzstd::decoding::StreamingDecoder::new_with_max_window_size(
                raw,
                ZSTD_MAX_WINDOW_BYTES,
            )
            .map_err(|_| Error::Corrupt)?;
            read_capped(decoder, raw.len(), max)
        }
    }
}

/// Gunzip, concatenated members too as gzip allows.
pub fn gunzip(raw: &[u8], max: usize) -> Result<Vec<u8>, Error> {
    read_capped(flate2::bufread::MultiGzDecoder::new(raw), raw.len(), max)
}

/// Output is gathered in pieces of at most this size, so growing it never copies a
/// large buffer (which would briefly hold it twice).
pub const PIECE: usize = 1024 * 1024;

/// Read `decoder` to its end, failing once the output would pass `max` bytes: at
/// most `max + 1` bytes are ever inflated. The first piece grows from an estimate
/// (`raw_len` times 8), so output under a piece, the common case, is one buffer that
/// is neither copied into place nor given a piece's worth of memory it does not
/// use; later pieces are allocated at their full size.
pub fn read_capped(mut decoder: impl Read, raw_len: usize, max: usize) -> Result<Vec<u8>, Error> {
    let mut pieces: Vec<Vec<u8>> = Vec::new();
    let mut total = 0usize;
    loop {
        let want = PIECE.min(max.saturating_sub(total).saturating_add(1));
        let mut piece = if pieces.is_empty() {
            Vec::with_capacity((raw_len.saturating_mul(8)).clamp(1024, PIECE).min(want))
        } else {
            Vec::with_capacity(want)
        };
        let n = (&mut decoder)
            .take(want as u64)
            .read_to_end(&mut piece)
            .map_err(|_| Error::Corrupt)?;
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
pub(crate) mod tests {
    use super::*;
    use std::io::Write;

    pub fn gzip(data: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    pub fn encode(encoding: Encoding, data: &[u8]) -> Vec<u8> {
        match encoding {
            Encoding::Gzip => gzip(data),
            Encoding::Deflate => {
                let mut e =
                    flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
                e.write_all(data).unwrap();
                e.finish().unwrap()
            }
            Encoding::Brotli => {
                let mut out = Vec::new();
                {
                    let mut w = brotli::CompressorWriter::new(&mut out, 4096, 5, 22);
                    w.write_all(data).unwrap();
                }
                out
            }
            Encoding::Zstd => {
                ruzstd::encoding::compress_to_vec(data, ruzstd::encoding::CompressionLevel::Fastest)
            }
        }
    }

    fn raw_deflate(data: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    const ALL: [Encoding; 4] = [
        Encoding::Gzip,
        Encoding::Deflate,
        Encoding::Brotli,
        Encoding::Zstd,
    ];

    #[test]
    fn each_encoding_round_trips_within_an_exact_cap() {
        let text = |n: usize| (0..n).map(|i| (i * 7 % 251) as u8).collect::<Vec<u8>>();
        for encoding in ALL {
            for n in [0, 1, 1023, 5000, PIECE + 1] {
                let data = text(n);
                let packed = encode(encoding, &data);
                assert_eq!(
                    decode(encoding, &packed, n).as_deref(),
                    Ok(&data[..]),
                    "{encoding:?} {n}"
                );
                if n > 0 {
                    assert_eq!(
                        decode(encoding, &packed, n - 1),
                        Err(Error::TooLarge),
                        "{encoding:?} {n}"
                    );
                }
            }
        }
    }

    #[test]
    fn bombs_are_too_large_not_memory() {
        // 64 MiB of one byte: each encoding packs it into a few KiB at most.
        let big = vec![b'a'; 64 << 20];
        for encoding in ALL {
            let bomb = encode(encoding, &big);
            assert!(bomb.len() < 256 << 10, "{encoding:?}: {}", bomb.len());
            assert_eq!(
                decode(encoding, &bomb, 1 << 20),
                Err(Error::TooLarge),
                "{encoding:?}"
            );
        }
    }

    #[test]
    fn raw_deflate_too_and_garbage_is_corrupt() {
        let data = br#"{"created_at":"x","batch":[]}"#;
        let raw = raw_deflate(data);
        assert_ne!(raw.first(), Some(&ZLIB_FIRST_BYTE));
        assert_eq!(
            decode(Encoding::Deflate, &raw, 1 << 20).as_deref(),
            Ok(&data[..])
        );
        for encoding in ALL {
            assert_eq!(
                decode(encoding, b"this is not compressed at all", 1 << 20),
                Err(Error::Corrupt),
                "{encoding:?}"
            );
        }
        let g = gzip(data);
        assert_eq!(gunzip(&g[..g.len() - 6], 1 << 20), Err(Error::Corrupt));
    }

    #[test]
    fn gunzip_piece_boundaries_and_members() {
        let text = |n: usize| (0..n).map(|i| (i * 7 % 251) as u8).collect::<Vec<u8>>();
        for n in [1024, PIECE - 1, PIECE, 2 * PIECE + 3] {
            let data = text(n);
            let g = gzip(&data);
            assert_eq!(gunzip(&g, usize::MAX).as_deref(), Ok(&data[..]), "{n}");
            assert_eq!(gunzip(&g, n).as_deref(), Ok(&data[..]), "{n}");
            assert_eq!(gunzip(&g, n - 1), Err(Error::TooLarge), "{n}");
        }
        // Two members, as one stream.
        let two = [gzip(b"ab"), gzip(b"cd")].concat();
        assert_eq!(gunzip(&two, 4).as_deref(), Ok(&b"abcd"[..]));
        assert_eq!(gunzip(&two, 3), Err(Error::TooLarge));
    }

    #[test]
    fn header_values() {
        assert_eq!(Encoding::from_header("GZIP"), Some(Encoding::Gzip));
        assert_eq!(Encoding::from_header("br"), Some(Encoding::Brotli));
        assert_eq!(Encoding::from_header("zstd"), Some(Encoding::Zstd));
        assert_eq!(Encoding::from_header("deflate"), Some(Encoding::Deflate));
        assert_eq!(Encoding::from_header("lz4"), None);
        assert_eq!(Encoding::from_header("gzip-js"), None);
    }
}
