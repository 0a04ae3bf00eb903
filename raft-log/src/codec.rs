//! How values are laid out on disk: `crc32c (4 bytes, big endian) ++ bincode 2 (serde) payload`.
//!
//! The checksum covers a *domain* (the entry's big-endian index, or the metadata key's name)
//! followed by the payload, so a value that is intact but stored under the wrong key fails too.

use serde::de::DeserializeOwned;
use serde::Serialize;

/// Length of the checksum that prefixes every stored value.
pub(crate) const CHECKSUM_LEN_BYTES: usize = 4;

/// The bincode configuration used for every stored value (never change it in place: it is the
/// on-disk format).
fn bincode_config() -> bincode::config::Configuration {
    bincode::config::standard()
}

// The byte limits of `decode`, smallest first: a payload decodes with the smallest that holds it,
// one larger than 256 MiB (a WAL frame holds at most 1 GiB) with 4 GiB.
const DECODE_LIMIT_64_KIB_BYTES: usize = 64 << 10;
const DECODE_LIMIT_1_MIB_BYTES: usize = 1 << 20;
const DECODE_LIMIT_16_MIB_BYTES: usize = 16 << 20;
const DECODE_LIMIT_256_MIB_BYTES: usize = 256 << 20;
const DECODE_LIMIT_4_GIB_BYTES: usize = 4 << 30;

/// The engine key of the entry at `index`: big-endian, so keys sort by index.
pub(crate) fn entry_key(index: u64) -> [u8; 8] {
    index.to_be_bytes()
}

/// Parses an engine key back into an index; `None` when the key is not 8 bytes long.
pub(crate) fn index_of_key(key: &[u8]) -> Option<u64> {
    let bytes: [u8; 8] = key.try_into().ok()?;
    Some(u64::from_be_bytes(bytes))
}

fn checksum(domain: &[u8], payload: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(domain), payload)
}

/// Prefixes `payload` with its checksum over `domain ++ payload`.
pub(crate) fn seal(domain: &[u8], payload: &[u8]) -> Vec<u8> {
    let mut stored = Vec::with_capacity(CHECKSUM_LEN_BYTES + payload.len());
    stored.extend_from_slice(&checksum(domain, payload).to_be_bytes());
    stored.extend_from_slice(payload);
    debug_assert_eq!(stored.len(), CHECKSUM_LEN_BYTES + payload.len());
    stored
}

/// Verifies the checksum of a stored value and returns its payload.
pub(crate) fn unseal<'a>(domain: &[u8], stored: &'a [u8]) -> Result<&'a [u8], String> {
    if stored.len() < CHECKSUM_LEN_BYTES {
        return Err(format!(
            "stored value is {} bytes long, shorter than its {CHECKSUM_LEN_BYTES}-byte checksum",
            stored.len()
        ));
    }
    let (checksum_bytes, payload) = stored.split_at(CHECKSUM_LEN_BYTES);
    let mut expected = [0u8; CHECKSUM_LEN_BYTES];
    expected.copy_from_slice(checksum_bytes);
    let expected = u32::from_be_bytes(expected);
    let actual = checksum(domain, payload);
    if expected != actual {
        return Err(format!(
            "crc32c mismatch: stored {expected:#010x}, computed {actual:#010x} over {} payload bytes",
            payload.len()
        ));
    }
    Ok(payload)
}

/// Encodes a value with bincode 2 (serde).
pub(crate) fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, bincode::error::EncodeError> {
    bincode::serde::encode_to_vec(value, bincode_config())
}

/// Encodes a value with bincode 2 (serde) at the end of `out`; returns the bytes written.
pub(crate) fn encode_into<T: Serialize>(
    value: &T,
    out: &mut Vec<u8>,
) -> Result<usize, bincode::error::EncodeError> {
    bincode::serde::encode_into_std_write(value, out, bincode_config())
}

/// Decodes a value with bincode 2 (serde); trailing bytes are an error.
///
/// bincode allocates a string or byte vector at the length its prefix claims before it reads the
/// bytes, so a damaged prefix could ask for terabytes. Its byte limit (which changes decoding
/// only, never the format) is set to the smallest of 64 KiB, 1 MiB, 16 MiB and 256 MiB that holds
/// the payload (else 4 GiB): no prefix can make a decode allocate more than 16 times the payload
/// (or 64 KiB).
pub(crate) fn decode<T: DeserializeOwned>(payload: &[u8]) -> Result<T, String> {
    fn limited<T: DeserializeOwned, const LIMIT: usize>(
        payload: &[u8],
    ) -> Result<(T, usize), bincode::error::DecodeError> {
        bincode::serde::decode_from_slice(payload, bincode_config().with_limit::<LIMIT>())
    }
    let decoded = match payload.len() {
        len if len <= DECODE_LIMIT_64_KIB_BYTES => limited::<T, DECODE_LIMIT_64_KIB_BYTES>(payload),
        len if len <= DECODE_LIMIT_1_MIB_BYTES => limited::<T, DECODE_LIMIT_1_MIB_BYTES>(payload),
        len if len <= DECODE_LIMIT_16_MIB_BYTES => limited::<T, DECODE_LIMIT_16_MIB_BYTES>(payload),
        len if len <= DECODE_LIMIT_256_MIB_BYTES => {
            limited::<T, DECODE_LIMIT_256_MIB_BYTES>(payload)
        }
        _ => limited::<T, DECODE_LIMIT_4_GIB_BYTES>(payload),
    };
    let (value, read_len_bytes): (T, usize) =
        decoded.map_err(|e| format!("bincode decode failed: {e}"))?;
    if read_len_bytes != payload.len() {
        return Err(format!(
            "bincode decode used {read_len_bytes} of {} payload bytes",
            payload.len()
        ));
    }
    Ok(value)
}

/// Seals an encoded entry for storage at `index`.
pub(crate) fn seal_entry(index: u64, payload: &[u8]) -> Vec<u8> {
    seal(&entry_key(index), payload)
}

/// Verifies and decodes the entry stored at `index`.
pub(crate) fn unseal_entry<T: DeserializeOwned>(index: u64, stored: &[u8]) -> Result<T, String> {
    let payload = unseal(&entry_key(index), stored)?;
    decode(payload)
}

/// Seals an encoded metadata value stored under `key`.
pub(crate) fn seal_meta(key: &str, payload: &[u8]) -> Vec<u8> {
    seal(key.as_bytes(), payload)
}

/// Verifies and decodes the metadata value stored under `key`.
pub(crate) fn unseal_meta<T: DeserializeOwned>(key: &str, stored: &[u8]) -> Result<T, String> {
    let payload = unseal(key.as_bytes(), stored)?;
    decode(payload)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sealed_value_round_trips_and_every_flipped_bit_is_detected() {
        // Seals a payload, checks it unseals, then flips each bit in turn and expects an error.
        let payload = encode(&(7u64, "hello".to_string())).expect("encode");
        let stored = seal_entry(42, &payload);
        let back: (u64, String) = unseal_entry(42, &stored).expect("intact value");
        assert_eq!(back, (7, "hello".to_string()));
        for bit in 0..stored.len() * 8 {
            let mut bad = stored.clone();
            bad[bit / 8] ^= 1 << (bit % 8);
            assert!(
                unseal_entry::<(u64, String)>(42, &bad).is_err(),
                "bit {bit}"
            );
        }
    }

    #[test]
    fn value_read_under_another_index_fails_its_checksum() {
        // An intact value moved to another key must not verify.
        let stored = seal_entry(1, &encode(&1u64).expect("encode"));
        assert!(unseal_entry::<u64>(2, &stored).is_err());
        assert!(unseal_entry::<u64>(1, &stored[..2]).is_err());
    }

    #[test]
    fn a_length_prefix_claiming_more_than_the_payload_is_an_error_not_an_allocation() {
        // A string whose length prefix (a bincode varint: 253, then a u64) claims 2^40 bytes in a
        // 20-byte payload: decoding refuses the claim instead of allocating 1 TiB first.
        let mut payload = encode(&(7u64, "hello".to_string())).expect("encode");
        assert_eq!(payload[1], 5, "the string's one-byte length");
        let mut claim = vec![253u8];
        claim.extend_from_slice(&(1u64 << 40).to_le_bytes());
        payload.splice(1..2, claim);
        let error = decode::<(u64, String)>(&payload).expect_err("a claim beyond the payload");
        assert!(error.contains("bincode"), "{error}");
    }

    #[test]
    fn keys_sort_by_index() {
        // Big-endian keys order the same way as the indexes they encode.
        assert!(entry_key(255) < entry_key(256));
        assert_eq!(index_of_key(&entry_key(u64::MAX - 1)), Some(u64::MAX - 1));
        assert_eq!(index_of_key(b"short"), None);
    }
}
