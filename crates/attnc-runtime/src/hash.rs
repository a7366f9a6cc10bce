//! Stable, dependency-free hashes (FNV-1a, and its step over 8-byte words). They name cache entries and check their
//! payloads, so they must give the same value on every machine, build and Rust version
//! (std's `DefaultHasher` promises none of that). Not cryptographic: the cache also stores
//! the full key text and compares it on load, so a collision cannot serve a wrong entry.

const FNV64_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV64_PRIME: u64 = 0x0000_0100_0000_01b3;
const FNV128_OFFSET: u128 = 0x6c62_272e_07bb_0142_62b8_2175_6295_c58d;
const FNV128_PRIME: u128 = 0x0000_0000_0100_0000_0000_0000_0000_013b;

/// FNV-1a, 64 bits. Any single changed byte changes the result (each step is a bijection
/// of the state), which is what the payload checksum needs.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h = FNV64_OFFSET;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(FNV64_PRIME);
    }
    h
}

/// FNV-1a's step over little-endian 8-byte words (the tail zero-padded, the length mixed
/// into the start), 128 bits: cache key names. An eighth of the multiplies of the
/// bytewise FNV-1a: a memory-cache hit hashes its ~700-byte key text on every
/// `Runtime::kernel` call, and bytewise that was 0.7 µs of its ~1.8 on the build machine.
/// Each step is a bijection of the state, like the bytewise one.
pub fn fnv1a128_words(bytes: &[u8]) -> u128 {
    let mut h = FNV128_OFFSET ^ bytes.len() as u128;
    let mut words = bytes.chunks_exact(8);
    for w in &mut words {
        let mut b = [0u8; 8];
        b.copy_from_slice(w);
        h ^= u128::from(u64::from_le_bytes(b));
        h = h.wrapping_mul(FNV128_PRIME);
    }
    let tail = words.remainder();
    if !tail.is_empty() {
        let mut b = [0u8; 8];
        b[..tail.len()].copy_from_slice(tail);
        h ^= u128::from(u64::from_le_bytes(b));
        h = h.wrapping_mul(FNV128_PRIME);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_values() {
        // Published FNV-1a test vectors.
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x8594_4171_f739_67e8);
    }

    /// The word hash tells apart keys that differ in one byte anywhere, in length only
    /// (a zero-padded tail), or in word order; and it never changes for the same bytes
    /// (its values name files on disk).
    #[test]
    fn word_hash_separates_near_keys() {
        let base: Vec<u8> = (0..717u32).map(|i| (i * 7 % 251) as u8).collect();
        let h = fnv1a128_words(&base);
        for i in 0..base.len() {
            let mut b = base.clone();
            b[i] ^= 1;
            assert_ne!(fnv1a128_words(&b), h, "byte {i}");
        }
        let mut padded = base.clone();
        padded.push(0);
        assert_ne!(fnv1a128_words(&padded), h);
        assert_ne!(fnv1a128_words(b"abcdefgh12345678"), fnv1a128_words(b"12345678abcdefgh"));
        assert_ne!(fnv1a128_words(b""), fnv1a128_words(b"\0"));
        assert_eq!(fnv1a128_words(b"format=x\n"), 0x8708_1eba_83aa_ae99_694d_2d08_b8c8_ce74_u128, "stable");
    }
}
