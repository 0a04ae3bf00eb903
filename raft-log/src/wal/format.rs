//! The WAL's on-disk format: frames, segment headers, segment file names. Pure: no I/O.
//!
//! A segment file is a sequence of 8-byte aligned frames, starting with one segment-header
//! frame, then batches, each batch one or more entry or truncate frames closed by one commit
//! frame. After the last batch the file holds zeros (it is preallocated).
//!
//! ```text
//! frame  = header (24 bytes) ++ payload ++ zero padding to a multiple of 8 bytes
//! header = crc32c u32 LE   over bytes 4..24+payload_len (the rest of the header and the payload)
//!          kind   u8       1 entry, 2 commit, 3 truncate, 4 segment header
//!          zero   [u8; 3]
//!          payload_len u32 LE
//!          zero   [u8; 4]
//!          index  u64 LE   entry: its log index; truncate: the first index removed;
//!                          segment header: the segment's base index; commit: 0
//! entry payload          = bincode 2 (serde) of the openraft entry
//! commit payload         = batch_start u64 LE (offset of the batch's first frame)
//!                          ++ batch_crc u32 LE (crc32c of bytes batch_start..commit offset)
//!                          ++ frame_count u32 LE (frames in the batch, commit excluded)
//! segment header payload = magic "CAIRNWAL" ++ format version u32 LE ++ zero u32
//!                          ++ segment id u64 LE
//! ```
//!
//! An all-zero header marks the end of the written part of a segment.

/// Frames start at multiples of this.
pub(crate) const FRAME_ALIGN_BYTES: usize = 8;
/// Length of every frame header.
pub(crate) const HEADER_LEN_BYTES: usize = 24;
/// Length of a commit frame's payload.
const COMMIT_PAYLOAD_LEN_BYTES: usize = 16;
/// Length of a whole commit frame.
pub(crate) const COMMIT_FRAME_LEN_BYTES: usize = HEADER_LEN_BYTES + COMMIT_PAYLOAD_LEN_BYTES;
/// Length of a whole truncate frame.
pub(crate) const TRUNCATE_FRAME_LEN_BYTES: usize = HEADER_LEN_BYTES;
/// Length of a segment-header frame's payload.
const SEGMENT_HEADER_PAYLOAD_LEN_BYTES: usize = 24;
/// Length of a whole segment-header frame: where the first batch of a segment starts.
pub(crate) const SEGMENT_HEADER_LEN_BYTES: usize =
    HEADER_LEN_BYTES + SEGMENT_HEADER_PAYLOAD_LEN_BYTES;
/// The first bytes of a segment header's payload.
pub(crate) const MAGIC: [u8; 8] = *b"CAIRNWAL";
/// The only format version so far.
pub(crate) const FORMAT_VERSION: u32 = 1;
/// The largest payload a frame may declare (an entry larger than this is refused on write and
/// a header claiming more is damage).
pub(crate) const PAYLOAD_LEN_MAX_BYTES: usize = 1 << 30;

/// What a frame is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FrameKind {
    Entry = 1,
    Commit = 2,
    Truncate = 3,
    SegmentHeader = 4,
}

impl FrameKind {
    fn from_byte(byte: u8) -> Option<FrameKind> {
        match byte {
            1 => Some(FrameKind::Entry),
            2 => Some(FrameKind::Commit),
            3 => Some(FrameKind::Truncate),
            4 => Some(FrameKind::SegmentHeader),
            _ => None,
        }
    }
}

/// `len` rounded up to the frame alignment.
pub(crate) fn aligned(len: usize) -> usize {
    len.div_ceil(FRAME_ALIGN_BYTES) * FRAME_ALIGN_BYTES
}

/// The file name of a segment: its base index and its unique id, both zero padded so that
/// names sort by base index.
pub(crate) fn segment_file_name(base_index: u64, segment_id: u64) -> String {
    format!("{base_index:020}-{segment_id:020}.wal")
}

/// Parses a segment file name back into (base index, segment id).
pub(crate) fn parse_segment_file_name(name: &str) -> Option<(u64, u64)> {
    let stem = name.strip_suffix(".wal")?;
    let (base, id) = stem.split_once('-')?;
    if base.len() != 20 || id.len() != 20 {
        return None;
    }
    Some((base.parse().ok()?, id.parse().ok()?))
}

/// Starts a frame at the end of `out` (which must be aligned): writes a header with a
/// placeholder checksum and length. Finish it with [`finish_frame`] once the payload is
/// appended.
pub(crate) fn begin_frame(out: &mut Vec<u8>, kind: FrameKind, index: u64) -> usize {
    assert_eq!(out.len() % FRAME_ALIGN_BYTES, 0, "frames start aligned");
    let start = out.len();
    out.extend_from_slice(&[0u8; 4]);
    out.push(kind as u8);
    out.extend_from_slice(&[0u8; 3]);
    out.extend_from_slice(&[0u8; 4]);
    out.extend_from_slice(&[0u8; 4]);
    out.extend_from_slice(&index.to_le_bytes());
    debug_assert_eq!(out.len() - start, HEADER_LEN_BYTES);
    start
}

/// Finishes the frame begun at `start`: fills in the payload length and the checksum, pads to
/// the alignment. Returns the frame's length, or `None` (and removes the frame) when its
/// payload is longer than [`PAYLOAD_LEN_MAX_BYTES`].
pub(crate) fn finish_frame(out: &mut Vec<u8>, start: usize) -> Option<usize> {
    let payload_len = out.len() - start - HEADER_LEN_BYTES;
    if payload_len > PAYLOAD_LEN_MAX_BYTES {
        out.truncate(start);
        return None;
    }
    out[start + 8..start + 12].copy_from_slice(&(payload_len as u32).to_le_bytes());
    let crc = crc32c::crc32c(&out[start + 4..]);
    out[start..start + 4].copy_from_slice(&crc.to_le_bytes());
    out.resize(start + aligned(HEADER_LEN_BYTES + payload_len), 0);
    let frame_len = out.len() - start;
    debug_assert!(matches!(
        parse_frame(out, start, true),
        Parsed::Frame { len, .. } if len == frame_len
    ));
    Some(frame_len)
}

/// Appends a whole frame carrying `payload`.
pub(crate) fn push_frame(out: &mut Vec<u8>, kind: FrameKind, index: u64, payload: &[u8]) -> usize {
    let start = begin_frame(out, kind, index);
    out.extend_from_slice(payload);
    finish_frame(out, start).expect("internal frames are small")
}

/// Appends a commit frame closing the batch that started at `batch_start` (an offset in the
/// segment), whose bytes (from `batch_start` up to this frame) have checksum `batch_crc`.
pub(crate) fn push_commit(out: &mut Vec<u8>, batch_start: u64, batch_crc: u32, frame_count: u32) {
    let mut payload = [0u8; COMMIT_PAYLOAD_LEN_BYTES];
    payload[..8].copy_from_slice(&batch_start.to_le_bytes());
    payload[8..12].copy_from_slice(&batch_crc.to_le_bytes());
    payload[12..16].copy_from_slice(&frame_count.to_le_bytes());
    let len = push_frame(out, FrameKind::Commit, 0, &payload);
    debug_assert_eq!(len, COMMIT_FRAME_LEN_BYTES);
}

/// The segment-header frame of segment `segment_id` whose first entry will be `base_index`.
pub(crate) fn segment_header(segment_id: u64, base_index: u64) -> Vec<u8> {
    segment_header_of_version(FORMAT_VERSION, segment_id, base_index)
}

/// [`segment_header`] saying format `version` (tests make a newer build's segment with it).
pub(crate) fn segment_header_of_version(version: u32, segment_id: u64, base_index: u64) -> Vec<u8> {
    let mut payload = Vec::with_capacity(SEGMENT_HEADER_PAYLOAD_LEN_BYTES);
    payload.extend_from_slice(&MAGIC);
    payload.extend_from_slice(&version.to_le_bytes());
    payload.extend_from_slice(&0u32.to_le_bytes());
    payload.extend_from_slice(&segment_id.to_le_bytes());
    let mut out = Vec::with_capacity(SEGMENT_HEADER_LEN_BYTES);
    let len = push_frame(&mut out, FrameKind::SegmentHeader, base_index, &payload);
    assert_eq!(len, SEGMENT_HEADER_LEN_BYTES);
    out
}

/// A commit frame's payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Commit {
    pub(crate) batch_start: u64,
    pub(crate) batch_crc: u32,
    pub(crate) frame_count: u32,
}

/// Decodes a commit payload.
pub(crate) fn decode_commit(payload: &[u8]) -> Option<Commit> {
    if payload.len() != COMMIT_PAYLOAD_LEN_BYTES {
        return None;
    }
    Some(Commit {
        batch_start: u64::from_le_bytes(payload[..8].try_into().ok()?),
        batch_crc: u32::from_le_bytes(payload[8..12].try_into().ok()?),
        frame_count: u32::from_le_bytes(payload[12..16].try_into().ok()?),
    })
}

/// Checks a segment header frame's payload against the segment it should describe.
/// Why a segment header is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum HeaderProblem {
    /// An intact header of a format version above [`FORMAT_VERSION`]: a newer build wrote it.
    Newer { found: u32 },
    /// Damaged, or not a segment header of this log.
    Damaged(String),
}

/// Checks the header frame of segment `segment_id` (first entry `base_index`).
pub(crate) fn check_segment_header(
    bytes: &[u8],
    segment_id: u64,
    base_index: u64,
    check_crc: bool,
) -> Result<(), HeaderProblem> {
    use HeaderProblem::Damaged;
    match parse_frame(bytes, 0, check_crc) {
        Parsed::Frame {
            kind: FrameKind::SegmentHeader,
            index,
            payload,
            ..
        } => {
            if payload.len() != SEGMENT_HEADER_PAYLOAD_LEN_BYTES || payload[..8] != MAGIC {
                return Err(Damaged(
                    "the segment header does not carry the WAL magic".to_string(),
                ));
            }
            let version = u32::from_le_bytes(payload[8..12].try_into().unwrap_or([0; 4]));
            if version > FORMAT_VERSION {
                return Err(HeaderProblem::Newer { found: version });
            }
            if version != FORMAT_VERSION {
                return Err(Damaged(format!(
                    "segment format version {version}, this build reads version {FORMAT_VERSION}"
                )));
            }
            let id = u64::from_le_bytes(payload[16..24].try_into().unwrap_or([0; 8]));
            if id != segment_id || index != base_index {
                return Err(Damaged(format!(
                    "the segment header names segment {id} with base index {index}, expected segment {segment_id} with base index {base_index}"
                )));
            }
            Ok(())
        }
        Parsed::Frame { kind, .. } => Err(Damaged(format!(
            "the segment starts with a {kind:?} frame, not a segment header"
        ))),
        Parsed::End => Err(Damaged(
            "the segment header is missing (the file starts with zeros)".to_string(),
        )),
        Parsed::Bad { reason } => Err(Damaged(format!("the segment header is damaged: {reason}"))),
    }
}

/// What sits at one position of a segment.
#[derive(Debug)]
pub(crate) enum Parsed<'a> {
    /// Zeros: nothing was written here.
    End,
    /// A well-formed frame (its checksum verified unless told otherwise).
    Frame {
        kind: FrameKind,
        index: u64,
        payload: &'a [u8],
        /// The whole frame's length, padding included.
        len: usize,
    },
    /// Something that is neither zeros nor a valid frame.
    Bad { reason: String },
}

/// Parses the frame at `pos` of `bytes`. Never panics, whatever the bytes.
pub(crate) fn parse_frame(bytes: &[u8], pos: usize, check_crc: bool) -> Parsed<'_> {
    let rest = bytes.get(pos..).unwrap_or(&[]);
    if rest.len() < HEADER_LEN_BYTES {
        return if rest.iter().all(|b| *b == 0) {
            Parsed::End
        } else {
            Parsed::Bad {
                reason: format!(
                    "{} trailing bytes are too short for a frame header",
                    rest.len()
                ),
            }
        };
    }
    let header = &rest[..HEADER_LEN_BYTES];
    if header.iter().all(|b| *b == 0) {
        return Parsed::End;
    }
    let Some(kind) = FrameKind::from_byte(header[4]) else {
        return Parsed::Bad {
            reason: format!("unknown frame kind {}", header[4]),
        };
    };
    if header[5..8] != [0, 0, 0] || header[12..16] != [0, 0, 0, 0] {
        return Parsed::Bad {
            reason: "reserved header bytes are not zero".to_string(),
        };
    }
    let mut len_bytes = [0u8; 4];
    len_bytes.copy_from_slice(&header[8..12]);
    let payload_len = u32::from_le_bytes(len_bytes) as usize;
    if payload_len > PAYLOAD_LEN_MAX_BYTES || HEADER_LEN_BYTES + payload_len > rest.len() {
        return Parsed::Bad {
            reason: format!(
                "the header claims a {payload_len}-byte payload, beyond the end of the segment"
            ),
        };
    }
    let body_end = HEADER_LEN_BYTES + payload_len;
    if check_crc {
        let mut stored = [0u8; 4];
        stored.copy_from_slice(&header[..4]);
        let stored = u32::from_le_bytes(stored);
        let computed = crc32c::crc32c(&rest[4..body_end]);
        if stored != computed {
            return Parsed::Bad {
                reason: format!(
                    "crc32c mismatch: stored {stored:#010x}, computed {computed:#010x} over a {payload_len}-byte payload"
                ),
            };
        }
    }
    let mut index = [0u8; 8];
    index.copy_from_slice(&header[16..24]);
    let len = aligned(body_end).min(rest.len());
    Parsed::Frame {
        kind,
        index: u64::from_le_bytes(index),
        payload: &rest[HEADER_LEN_BYTES..body_end],
        len,
    }
}

/// A committed entry or truncate frame found by [`scan_segment`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ScannedFrame {
    pub(crate) kind: FrameKind,
    pub(crate) index: u64,
    pub(crate) offset: u64,
    pub(crate) len: u32,
}

/// Damage found by [`scan_segment`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Damage {
    /// Offset of the first bad byte region (a bad frame, or a commit that does not match).
    pub(crate) offset: u64,
    pub(crate) reason: String,
    /// Whether a valid commit frame of a *later* batch follows the damage: then the damage is
    /// not a torn tail (a later batch is only written after the earlier one was synced).
    pub(crate) later_batch_committed: bool,
}

/// What one segment holds.
#[derive(Debug, Default)]
pub(crate) struct SegmentScan {
    /// Entry and truncate frames of complete (committed) batches, in file order.
    pub(crate) committed: Vec<ScannedFrame>,
    /// Frames of the batch after the last commit (a torn or unfinished batch), in order.
    pub(crate) uncommitted: Vec<ScannedFrame>,
    /// Where the next batch goes: just after the last valid commit frame.
    pub(crate) end_offset: u64,
    /// The end of the last non-zero byte of the segment.
    pub(crate) nonzero_end: u64,
    /// The first damage, if any.
    pub(crate) damage: Option<Damage>,
}

/// Reads a segment's batches (the header is checked separately). Every batch must end with a
/// commit frame whose batch offset, frame count and batch checksum match what precedes it.
/// Never panics, whatever the bytes.
pub(crate) fn scan_segment(bytes: &[u8], check_crc: bool) -> SegmentScan {
    let mut scan = SegmentScan {
        end_offset: SEGMENT_HEADER_LEN_BYTES as u64,
        nonzero_end: bytes
            .iter()
            .rposition(|b| *b != 0)
            .map(|p| p as u64 + 1)
            .unwrap_or(0),
        ..SegmentScan::default()
    };
    let mut pos = SEGMENT_HEADER_LEN_BYTES;
    let mut batch_start = pos;
    loop {
        match parse_frame(bytes, pos, check_crc) {
            Parsed::End => break,
            Parsed::Bad { reason } => {
                scan.damage = Some(Damage {
                    offset: pos as u64,
                    later_batch_committed: later_commit_exists(bytes, pos, batch_start, check_crc),
                    reason,
                });
                break;
            }
            Parsed::Frame {
                kind,
                index,
                payload,
                len,
            } => match kind {
                FrameKind::Entry | FrameKind::Truncate => {
                    scan.uncommitted.push(ScannedFrame {
                        kind,
                        index,
                        offset: pos as u64,
                        len: len as u32,
                    });
                    pos += len;
                }
                FrameKind::Commit => {
                    let problem = match decode_commit(payload) {
                        None => Some("the commit frame's payload is malformed".to_string()),
                        Some(commit) if commit.batch_start != batch_start as u64 => Some(format!(
                            "the commit frame closes a batch starting at {}, but the batch starts at {batch_start}",
                            commit.batch_start
                        )),
                        Some(commit) if commit.frame_count as usize != scan.uncommitted.len() => {
                            Some(format!(
                                "the commit frame counts {} frames, the batch has {}",
                                commit.frame_count,
                                scan.uncommitted.len()
                            ))
                        }
                        Some(commit)
                            if check_crc
                                && commit.batch_crc != crc32c::crc32c(&bytes[batch_start..pos]) =>
                        {
                            Some("the batch's crc32c does not match its commit frame".to_string())
                        }
                        Some(_) => None,
                    };
                    if let Some(reason) = problem {
                        scan.damage = Some(Damage {
                            offset: pos as u64,
                            later_batch_committed: later_commit_exists(
                                bytes,
                                pos,
                                batch_start,
                                check_crc,
                            ),
                            reason,
                        });
                        break;
                    }
                    scan.committed.append(&mut scan.uncommitted);
                    pos += len;
                    batch_start = pos;
                    scan.end_offset = pos as u64;
                }
                FrameKind::SegmentHeader => {
                    scan.damage = Some(Damage {
                        offset: pos as u64,
                        later_batch_committed: later_commit_exists(
                            bytes,
                            pos,
                            batch_start,
                            check_crc,
                        ),
                        reason: "a second segment header in the middle of the segment".to_string(),
                    });
                    break;
                }
            },
        }
    }
    assert!(scan.end_offset as usize <= bytes.len().max(SEGMENT_HEADER_LEN_BYTES));
    scan
}

/// Whether a valid commit frame closing a batch that starts after `batch_start` lies beyond
/// `damage_pos`: proof that the damaged batch had been synced before (so it is not a torn
/// tail). Tries every aligned position, since the damaged frame's length cannot be trusted.
fn later_commit_exists(
    bytes: &[u8],
    damage_pos: usize,
    batch_start: usize,
    check_crc: bool,
) -> bool {
    let mut pos = damage_pos + FRAME_ALIGN_BYTES;
    while pos + COMMIT_FRAME_LEN_BYTES <= bytes.len() {
        // Cheap filter before the checksum: the kind byte and the commit payload length.
        if bytes[pos + 4] == FrameKind::Commit as u8
            && bytes[pos + 8..pos + 12] == (COMMIT_PAYLOAD_LEN_BYTES as u32).to_le_bytes()
        {
            if let Parsed::Frame {
                kind: FrameKind::Commit,
                payload,
                ..
            } = parse_frame(bytes, pos, check_crc)
            {
                if decode_commit(payload).is_some_and(|c| c.batch_start > batch_start as u64) {
                    return true;
                }
            }
        }
        pos += FRAME_ALIGN_BYTES;
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A segment with a header and `batches` batches of `per_batch` entry frames each.
    fn segment(batches: u64, per_batch: u64) -> (Vec<u8>, Vec<usize>) {
        let mut bytes = segment_header(7, 1);
        let mut batch_starts = Vec::new();
        let mut index = 1;
        for _ in 0..batches {
            let start = bytes.len();
            batch_starts.push(start);
            for _ in 0..per_batch {
                push_frame(
                    &mut bytes,
                    FrameKind::Entry,
                    index,
                    &index.to_le_bytes().repeat(5),
                );
                index += 1;
            }
            let crc = crc32c::crc32c(&bytes[start..]);
            push_commit(&mut bytes, start as u64, crc, per_batch as u32);
        }
        bytes.resize(bytes.len() + 4096, 0);
        (bytes, batch_starts)
    }

    #[test]
    fn frames_round_trip_and_every_flipped_bit_of_a_frame_is_detected() {
        // Each bit of a frame, flipped, makes it Bad (or, in the zero padding, harmless).
        let mut bytes = Vec::new();
        let len = push_frame(&mut bytes, FrameKind::Entry, 42, b"hello world");
        match parse_frame(&bytes, 0, true) {
            Parsed::Frame {
                kind,
                index,
                payload,
                len: parsed_len,
            } => {
                assert_eq!(
                    (kind, index, payload, parsed_len),
                    (FrameKind::Entry, 42, &b"hello world"[..], len)
                );
            }
            other => panic!("expected a frame, got {other:?}"),
        }
        let body_len = HEADER_LEN_BYTES + 11;
        for bit in 0..body_len * 8 {
            let mut bad = bytes.clone();
            bad[bit / 8] ^= 1 << (bit % 8);
            assert!(
                !matches!(parse_frame(&bad, 0, true), Parsed::Frame { index: 42, payload, .. } if payload == b"hello world"),
                "flipping bit {bit} went unnoticed"
            );
        }
    }

    #[test]
    fn segment_names_sort_by_base_index_and_parse_back() {
        // Names carry the base index and the id, zero padded.
        let name = segment_file_name(12, 3);
        assert_eq!(parse_segment_file_name(&name), Some((12, 3)));
        assert!(segment_file_name(9, 100) < segment_file_name(10, 1));
        assert_eq!(parse_segment_file_name("LOCK"), None);
        assert_eq!(parse_segment_file_name("1-2.wal"), None);
    }

    #[test]
    fn clean_segment_scans_every_committed_frame() {
        // Three batches of four entries: twelve committed frames, nothing damaged.
        let (bytes, _) = segment(3, 4);
        check_segment_header(&bytes, 7, 1, true).expect("header");
        let scan = scan_segment(&bytes, true);
        assert_eq!(scan.damage, None);
        assert!(scan.uncommitted.is_empty());
        let indexes: Vec<u64> = scan.committed.iter().map(|f| f.index).collect();
        assert_eq!(indexes, (1..=12).collect::<Vec<_>>());
        assert!(
            scan.nonzero_end <= scan.end_offset,
            "nothing after the last commit"
        );
    }

    #[test]
    fn batch_without_its_commit_frame_is_uncommitted() {
        // The last batch's commit frame is zeroed (never written): its frames are uncommitted
        // and the end offset is the end of the second batch.
        let (mut bytes, starts) = segment(3, 4);
        let commit_at = bytes.len() - 4096 - COMMIT_FRAME_LEN_BYTES;
        bytes[commit_at..commit_at + COMMIT_FRAME_LEN_BYTES].fill(0);
        let scan = scan_segment(&bytes, true);
        assert_eq!(scan.damage, None);
        assert_eq!(scan.committed.len(), 8);
        assert_eq!(scan.uncommitted.len(), 4);
        assert_eq!(scan.end_offset, starts[2] as u64);
    }

    #[test]
    fn damage_in_the_last_batch_is_torn_but_damage_before_a_later_commit_is_not() {
        // A flipped byte in batch 3 of 3: torn (no later batch). In batch 2 of 3: batch 3's
        // commit proves batch 2 had been synced, so it is damage, not a torn tail.
        let (bytes, starts) = segment(3, 4);
        let mut torn = bytes.clone();
        torn[starts[2] + HEADER_LEN_BYTES + 2] ^= 0xFF;
        let scan = scan_segment(&torn, true);
        let damage = scan.damage.expect("damage found");
        assert!(!damage.later_batch_committed, "{damage:?}");
        assert_eq!(scan.end_offset, starts[2] as u64);

        let mut middle = bytes.clone();
        middle[starts[1] + HEADER_LEN_BYTES + 2] ^= 0xFF;
        let scan = scan_segment(&middle, true);
        let damage = scan.damage.expect("damage found");
        assert!(damage.later_batch_committed, "{damage:?}");
        assert_eq!(damage.offset, starts[1] as u64);
    }

    #[test]
    fn commit_over_a_lost_sector_is_refused_by_the_batch_checksum() {
        // A torn write kept the commit frame but lost the middle of an entry's payload (zeros):
        // the entry frame's own checksum fails first; without frame checksums the batch
        // checksum would catch it.
        let (bytes, starts) = segment(2, 4);
        let mut torn = bytes.clone();
        let payload_at = starts[1] + HEADER_LEN_BYTES;
        torn[payload_at..payload_at + 8].fill(0);
        let scan = scan_segment(&torn, true);
        assert!(scan.damage.is_some());
        assert_eq!(scan.committed.len(), 4);
    }

    #[test]
    fn garbage_never_panics_the_scanner() {
        // Arbitrary bytes after a valid header: the scanner reports, never panics.
        let mut state = 0x1234_5678_9abc_def0u64;
        for round in 0..200 {
            let mut bytes = segment_header(1, 1);
            for _ in 0..(round * 7) {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                bytes.push(state as u8);
            }
            let _ = scan_segment(&bytes, true);
            let _ = scan_segment(&bytes, false);
            let _ = check_segment_header(&bytes[..bytes.len().min(30)], 1, 1, true);
        }
    }
}
