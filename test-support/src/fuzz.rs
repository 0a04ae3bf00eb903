//! The fuzz harnesses' shared parts. Cargo-fuzz needs a nightly toolchain, so
//! every decoder of data from the network or the disk is fuzzed with property
//! tests instead: over arbitrary bytes, and over [`mutations`] of valid
//! encodings, which reach much deeper into a format than random bytes do.
//!
//! Each harness runs [`config`]`(n)`: `n` cases per property for the short pass
//! CI runs, or `PROPTEST_CASES` when it is set (a longer run; see
//! `docs/security.md`). Nothing is persisted between runs: a failure prints
//! the input proptest shrank it to, and that input belongs in the harness's
//! seeds or in a unit test next to the decoder.

use proptest::prelude::*;

/// `default_cases` cases per property, or `PROPTEST_CASES` when set.
pub fn config(default_cases: u32) -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default_cases);
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// One byte-level edit. Positions are taken modulo the length of the bytes
/// at the time of the edit, so every edit applies to any input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mutation {
    /// Overwrite the byte at a position.
    Set(usize, u8),
    /// Insert a byte before a position (or at the end).
    Insert(usize, u8),
    /// Delete the byte at a position.
    Remove(usize),
    /// Keep only the bytes before a position.
    Truncate(usize),
}

/// Byte values on the boundaries that formats care about: zero and one, the sign bit, bincode's
/// varint markers (251, 252 and 253 announce a 2-, 4- and 8-byte integer: a length that claims
/// far more than is there), all ones.
pub const INTERESTING_BYTES: [u8; 9] = [0, 1, 0x7F, 0x80, 251, 252, 253, 0xFE, 0xFF];

/// A byte to write: one of [`INTERESTING_BYTES`] as often as any byte at all.
pub fn byte() -> impl Strategy<Value = u8> {
    prop_oneof![
        any::<u8>(),
        proptest::sample::select(&INTERESTING_BYTES[..])
    ]
}

/// Any one [`Mutation`].
pub fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), byte()).prop_map(|(i, b)| Mutation::Set(i, b)),
        (any::<usize>(), byte()).prop_map(|(i, b)| Mutation::Insert(i, b)),
        any::<usize>().prop_map(Mutation::Remove),
        any::<usize>().prop_map(Mutation::Truncate),
    ]
}

/// One to seven mutations, applied in order.
pub fn mutations() -> impl Strategy<Value = Vec<Mutation>> {
    proptest::collection::vec(mutation(), 1..8)
}

/// Arbitrary bytes, up to `len_max` of them.
pub fn arbitrary_bytes(len_max: usize) -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(any::<u8>(), 0..len_max)
}

/// `bytes` with `mutations` applied in order (an edit of empty bytes that
/// needs a byte to act on is skipped).
pub fn mutate(mut bytes: Vec<u8>, mutations: &[Mutation]) -> Vec<u8> {
    for m in mutations {
        let len = bytes.len();
        match *m {
            Mutation::Set(i, b) if len > 0 => bytes[i % len] = b,
            Mutation::Insert(i, b) => bytes.insert(i % (len + 1), b),
            Mutation::Remove(i) if len > 0 => {
                bytes.remove(i % len);
            }
            Mutation::Truncate(i) => bytes.truncate(i % (len + 1)),
            _ => {}
        }
    }
    bytes
}

/// The first position at which `a` and `b` differ (`None` when they are
/// equal; the shorter length when one is a prefix of the other).
pub fn first_difference(a: &[u8], b: &[u8]) -> Option<usize> {
    if a == b {
        return None;
    }
    Some(
        a.iter()
            .zip(b)
            .position(|(x, y)| x != y)
            .unwrap_or(a.len().min(b.len())),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_mutation_edits_as_named_and_never_panics_on_empty_input() {
        // Positions wrap around the current length; an empty input takes
        // inserts and ignores the rest.
        let bytes = b"abcd".to_vec();
        assert_eq!(mutate(bytes.clone(), &[Mutation::Set(5, b'x')]), b"axcd");
        assert_eq!(
            mutate(bytes.clone(), &[Mutation::Insert(4, b'x')]),
            b"abcdx"
        );
        assert_eq!(mutate(bytes.clone(), &[Mutation::Remove(0)]), b"bcd");
        assert_eq!(mutate(bytes.clone(), &[Mutation::Truncate(2)]), b"ab");
        let all = [
            Mutation::Set(1, 1),
            Mutation::Remove(3),
            Mutation::Truncate(9),
            Mutation::Insert(7, 9),
        ];
        assert_eq!(mutate(Vec::new(), &all), vec![9]);
    }

    #[test]
    fn first_difference_finds_edits_and_truncations() {
        assert_eq!(first_difference(b"abc", b"abc"), None);
        assert_eq!(first_difference(b"abc", b"abd"), Some(2));
        assert_eq!(first_difference(b"abc", b"ab"), Some(2));
        assert_eq!(first_difference(b"", b"a"), Some(0));
    }
}
