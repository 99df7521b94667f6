use super::*;
use serde_json::Value;

const FIXTURE: &str = include_str!("../../../tests/fixtures/lz64_vectors.json");
const NO_LIMIT: usize = usize::MAX;

struct Vector {
    name: String,
    plain: String,
    compressed: String,
}

fn fixture() -> Value {
    serde_json::from_str(FIXTURE).expect("fixture is valid JSON")
}

fn vectors() -> Vec<Vector> {
    fixture()["vectors"]
        .as_array()
        .expect("vectors array")
        .iter()
        .map(|v| Vector {
            name: v["name"].as_str().unwrap().to_owned(),
            plain: v["plain"].as_str().unwrap().to_owned(),
            compressed: v["compressed"].as_str().unwrap().to_owned(),
        })
        .collect()
}

fn vector(name: &str) -> Vector {
    vectors().into_iter().find(|v| v.name == name).unwrap()
}

/// Builds streams code by code, to reach states the real encoder never emits.
#[derive(Default)]
struct Writer {
    bits: Vec<bool>,
}

impl Writer {
    fn code(mut self, value: u64, width: u32) -> Self {
        self.bits.extend((0..width).map(|i| value >> i & 1 == 1));
        self
    }

    fn finish(self) -> String {
        const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        self.bits
            .chunks(6)
            .map(|chunk| {
                let digit = chunk
                    .iter()
                    .enumerate()
                    .fold(0, |d, (i, &bit)| d | usize::from(bit) << (5 - i));
                char::from(ALPHABET[digit])
            })
            .collect()
    }
}

fn decode(input: &str) -> Result<String, Error> {
    decompress_from_base64(input.as_bytes(), NO_LIMIT)
}

#[test]
fn every_vector_round_trips() {
    let vectors = vectors();
    assert!(vectors.len() >= 15);
    for v in &vectors {
        assert_eq!(
            decode(&v.compressed).as_deref(),
            Ok(v.plain.as_str()),
            "{}",
            v.name
        );
    }
}

#[test]
fn cap_is_exact() {
    for v in vectors() {
        let len = v.plain.len();
        let at_limit = decompress_from_base64(v.compressed.as_bytes(), len);
        assert_eq!(at_limit.as_deref(), Ok(v.plain.as_str()), "{}", v.name);
        if len > 0 {
            let over = decompress_from_base64(v.compressed.as_bytes(), len - 1);
            assert_eq!(over, Err(Error::TooLarge), "{}", v.name);
        }
    }
}

#[test]
fn bomb_is_stopped_by_cap() {
    let fixture = fixture();
    let bomb = &fixture["bomb"];
    let input = bomb["compressed"].as_str().unwrap().as_bytes();
    let count = bomb["count"].as_u64().unwrap() as usize;
    let unit = bomb["char"].as_str().unwrap();
    assert!(input.len() * 100 < count, "the bomb should be small");

    for cap in [0, 1, 1024, 64 * 1024, count - 1] {
        assert_eq!(
            decompress_from_base64(input, cap),
            Err(Error::TooLarge),
            "cap {cap}"
        );
    }
    assert_eq!(decompress_from_base64(input, count), Ok(unit.repeat(count)));
}

#[test]
fn empty_input_and_empty_string() {
    assert_eq!(decode(""), Err(Error::Empty));
    // compressToBase64("") is a lone end-of-stream code.
    assert_eq!(decode("Q==="), Ok(String::new()));
    assert_eq!(decompress_from_base64(b"Q===", 0), Ok(String::new()));
    assert_eq!(decode("Q"), Ok(String::new()));
}

#[test]
fn truncated_inputs_are_corrupt() {
    for v in vectors() {
        if v.compressed.len() > 4096 {
            continue; // quadratic in input length; small vectors cover the same paths
        }
        let bytes = v.compressed.as_bytes();
        let mut errors = 0;
        for len in 1..bytes.len() {
            match decompress_from_base64(&bytes[..len], NO_LIMIT) {
                Ok(s) => assert_eq!(s, v.plain, "{} prefix {len}", v.name),
                Err(e) => {
                    assert_eq!(e, Error::Corrupt, "{} prefix {len}", v.name);
                    errors += 1;
                }
            }
        }
        // Dropping real data is caught; only the zero-bit tail (flush bits,
        // `=` padding) can go without changing the result.
        let tail = bytes
            .iter()
            .rev()
            .take_while(|&&b| b == b'=' || b == b'A')
            .count();
        assert!(
            errors + tail >= bytes.len() - 1,
            "{}: {errors} errors",
            v.name
        );
    }
}

#[test]
fn missing_end_marker_is_corrupt() {
    // Literal 'a' and then nothing.
    let input = Writer::default()
        .code(0, 2)
        .code(u64::from(b'a'), 8)
        .finish();
    assert_eq!(decode(&input), Err(Error::Corrupt));
    // An end marker cut off after its first two bits ("01", low bit first)
    // would read as 2 if the missing bit were taken as zero, as LZ-String does.
    let cut = Writer::default()
        .code(0, 2)
        .code(u64::from(b'a'), 8)
        .code(2, 2);
    assert_eq!(cut.bits.len(), 12);
    assert_eq!(decode(&cut.finish()), Err(Error::Corrupt));
    // The real encoding of "ab" with the digits holding the end marker removed.
    let ab = "IYIyA===";
    assert_eq!(decode(ab), Ok("ab".to_owned()));
    assert_eq!(decode(&ab[..3]), Err(Error::Corrupt));
}

#[test]
fn invalid_characters_are_rejected_anywhere() {
    let v = vector("posthog_batch_2k");
    for bad in [
        b' ', b'\n', b'\r', b'\t', b'-', b'_', b'.', b'%', 0, 0x80, 0xFF,
    ] {
        for at in [0, 1, v.compressed.len() / 2, v.compressed.len()] {
            let mut input = v.compressed.clone().into_bytes();
            input.insert(at, bad);
            assert_eq!(
                decompress_from_base64(&input, NO_LIMIT),
                Err(Error::InvalidCharacter),
                "byte {bad:#x} at {at}"
            );
        }
    }
    assert_eq!(decode("Q===\n"), Err(Error::InvalidCharacter));
}

#[test]
fn padding_reads_as_zero_bits() {
    // '=' is value 64: zero in the six bits that are read, like 'A'.
    let v = vector("empty_object");
    let swapped = v.compressed.replace('A', "=");
    assert_ne!(swapped, v.compressed);
    assert_eq!(decode(&swapped), Ok(v.plain));
}

#[test]
fn handcrafted_streams() {
    let a = u64::from(b'a');
    // KwKwK: code 4 is the slot being defined, i.e. "a" + "a".
    let kwkwk = Writer::default()
        .code(0, 2)
        .code(a, 8)
        .code(4, 3)
        .code(2, 3);
    assert_eq!(decode(&kwkwk.finish()), Ok("aaa".to_owned()));

    // A reference past the next free slot.
    let ahead = Writer::default().code(0, 2).code(a, 8).code(5, 3);
    assert_eq!(decode(&ahead.finish()), Err(Error::Corrupt));

    // First code 3 does not exist.
    assert_eq!(decode("w"), Err(Error::Corrupt));

    // 16-bit literals forming a surrogate pair, and a lone one.
    let pair = Writer::default()
        .code(1, 2)
        .code(0xD83D, 16)
        .code(1, 3)
        .code(0xDE00, 16)
        .code(2, 3);
    assert_eq!(decode(&pair.finish()), Ok("\u{1F600}".to_owned()));
    let lone = Writer::default().code(1, 2).code(0xDC00, 16).code(2, 3);
    assert_eq!(decode(&lone.finish()), Ok("\u{FFFD}".to_owned()));
}

#[test]
fn cap_counts_surrogate_pairs_as_four_bytes() {
    let v = vector("one_char_emoji_pair");
    assert_eq!(
        decompress_from_base64(v.compressed.as_bytes(), 3),
        Err(Error::TooLarge)
    );
    assert_eq!(
        decompress_from_base64(v.compressed.as_bytes(), 4),
        Ok(v.plain)
    );
}

struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

#[test]
fn random_bytes_never_panic() {
    let mut rng = XorShift(0x9E37_79B9_7F4A_7C15);
    for _ in 0..100_000 {
        let len = rng.below(48);
        let input: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
        let _ = decompress_from_base64(&input, 1 << 20);
    }
}

#[test]
fn random_base64_never_panics() {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=";
    let mut rng = XorShift(0x2545_F491_4F6C_DD1D);
    let mut decoded = 0;
    for _ in 0..100_000 {
        let len = 1 + rng.below(256);
        let input: Vec<u8> = (0..len)
            .map(|_| ALPHABET[rng.below(ALPHABET.len())])
            .collect();
        match decompress_from_base64(&input, 1 << 20) {
            Ok(_) => decoded += 1,
            Err(e) => assert!(matches!(e, Error::Corrupt | Error::TooLarge), "{e:?}"),
        }
    }
    // Sanity check that the generator reaches past the first code.
    assert!(decoded > 0);
}

#[test]
fn mutated_vectors_never_panic() {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=";
    let v = vector("posthog_batch_2k");
    let mut rng = XorShift(0xD1B5_4A32_D192_ED03);
    for _ in 0..3_000 {
        let mut input = v.compressed.clone().into_bytes();
        for _ in 0..1 + rng.below(3) {
            let at = rng.below(input.len());
            input[at] = ALPHABET[rng.below(ALPHABET.len())];
        }
        let _ = decompress_from_base64(&input, 1 << 20);
    }
}

#[test]
fn errors_display() {
    assert_eq!(Error::Corrupt.to_string(), "lz64 payload is corrupt");
    for e in [Error::InvalidCharacter, Error::TooLarge, Error::Empty] {
        assert!(e.to_string().starts_with("lz64 payload"));
    }
}
