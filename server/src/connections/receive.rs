//! The minimum receive rate (`receive_bytes_per_second_min`, `receive_stall_timeout_ms`):
//! what a connection owes the node, and whether it keeps up. Pure: no I/O, no clock of its own
//! (every call takes `now`).
//!
//! A connection **owes** bytes while the node waits for the rest of something its client has
//! begun: an HTTP/2 frame it has read part of, a header block (a HEADERS frame without
//! END_HEADERS, until the CONTINUATION frame that ends it), or a request body that a handler
//! is waiting to read. Time spent owing costs credit at the minimum rate; the bytes of request
//! frames (DATA, HEADERS, CONTINUATION) earn it back, up to `rate × stall timeout`. A
//! connection whose credit runs out is too slow, and is closed: one that stalls entirely after
//! the stall timeout, one that trickles 1 byte/s a moment later.
//!
//! Time not owing costs nothing. A watch whose client has sent its request and then nothing
//! for hours owes nothing (its request body has ended); neither does a restore upload while
//! its handler is busy writing what it received (the handler is not waiting for more, and
//! HTTP/2 flow control stops the client). Pings and window updates earn no credit, so they
//! cannot keep a stalled request alive.
//!
//! ## Invariants
//! - `credit <= credit_max`, and the credit changes only by request bytes (up) and time spent
//!   owing (down).
//! - The count of request bodies waiting never goes below zero (asserted).
//! - A [`FrameTracker`] never panics, whatever the bytes.

use tokio::time::Instant;

/// Length of an HTTP/2 frame header (RFC 9113 §4.1).
const FRAME_HEADER_LEN_BYTES: usize = 9;
/// Frame types that carry a request (RFC 9113 §6).
const FRAME_DATA: u8 = 0x0;
const FRAME_HEADERS: u8 = 0x1;
const FRAME_CONTINUATION: u8 = 0x9;
/// The END_HEADERS flag of HEADERS and CONTINUATION frames.
const FLAG_END_HEADERS: u8 = 0x4;

/// Follows the HTTP/2 frames a client sends (after the preface), to know whether a frame or a
/// header block is unfinished and which bytes belong to requests.
#[derive(Debug, Default)]
pub(crate) struct FrameTracker {
    header: [u8; FRAME_HEADER_LEN_BYTES],
    header_filled: usize,
    /// Payload bytes of the current frame not yet seen.
    payload_left: usize,
    /// Whether the current frame carries a request (DATA, HEADERS, CONTINUATION).
    request_frame: bool,
    /// A HEADERS frame came without END_HEADERS, and no CONTINUATION has ended its block.
    header_block_open: bool,
}

impl FrameTracker {
    /// Follows the next `bytes` the client sent; returns how many belong to request frames.
    pub(crate) fn feed(&mut self, mut bytes: &[u8]) -> u64 {
        let mut request_bytes = 0usize;
        while !bytes.is_empty() {
            if self.payload_left > 0 {
                let n = self.payload_left.min(bytes.len());
                if self.request_frame {
                    request_bytes += n;
                }
                self.payload_left -= n;
                bytes = &bytes[n..];
                continue;
            }
            let n = (FRAME_HEADER_LEN_BYTES - self.header_filled).min(bytes.len());
            self.header[self.header_filled..self.header_filled + n].copy_from_slice(&bytes[..n]);
            self.header_filled += n;
            bytes = &bytes[n..];
            if self.header_filled < FRAME_HEADER_LEN_BYTES {
                break;
            }
            self.header_filled = 0;
            let [l0, l1, l2, kind, flags, ..] = self.header;
            self.payload_left = u32::from_be_bytes([0, l0, l1, l2]) as usize;
            self.request_frame = matches!(kind, FRAME_DATA | FRAME_HEADERS | FRAME_CONTINUATION);
            if self.request_frame {
                request_bytes += FRAME_HEADER_LEN_BYTES;
            }
            if matches!(kind, FRAME_HEADERS | FRAME_CONTINUATION) {
                self.header_block_open = flags & FLAG_END_HEADERS == 0;
            }
        }
        request_bytes as u64
    }

    /// Whether the client has begun a frame or a header block it has not finished.
    pub(crate) fn owes(&self) -> bool {
        self.header_filled > 0 || self.payload_left > 0 || self.header_block_open
    }
}

/// Credit is kept in bytes × 10^9, so that time (in nanoseconds) times the rate (in bytes per
/// second) is exact.
const UNITS_PER_BYTE: i128 = 1_000_000_000;

/// Where a request body of gRPC messages stands (each message: a compression flag, a
/// big-endian u32 length, then that many bytes), for a method whose requests are a stream
/// (`cairn_proto::request_streaming_paths`). Its reader, waiting between two messages once
/// one has come whole, owes nothing: the client may have nothing more to say for a while
/// (a follower's AppendEntries stream on an idle cluster, a lease's keep-alives), as a
/// watch's client. Before the first message is whole, and inside any message, it owes.
#[derive(Debug, Default)]
pub(crate) struct GrpcMessages {
    prefix: [u8; GRPC_PREFIX_LEN_BYTES],
    prefix_filled: usize,
    /// Bytes of the current message not yet seen.
    message_left: u64,
    /// Messages seen whole.
    whole: u64,
}

/// Length of a gRPC message's prefix: the compression flag and the length.
const GRPC_PREFIX_LEN_BYTES: usize = 5;

impl GrpcMessages {
    /// Follows the next `bytes` of the request body.
    pub(crate) fn feed(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            if self.message_left > 0 {
                let n = (self.message_left.min(bytes.len() as u64)) as usize;
                self.message_left -= n as u64;
                bytes = &bytes[n..];
                if self.message_left == 0 {
                    self.whole += 1;
                }
                continue;
            }
            self.prefix[self.prefix_filled] = bytes[0];
            self.prefix_filled += 1;
            bytes = &bytes[1..];
            if self.prefix_filled == GRPC_PREFIX_LEN_BYTES {
                self.prefix_filled = 0;
                let length = u32::from_be_bytes(self.prefix[1..].try_into().expect("4 bytes"));
                self.message_left = u64::from(length);
                if length == 0 {
                    self.whole += 1;
                }
            }
        }
    }

    /// Whether a reader waiting now waits for the rest of a message it has begun, or for
    /// the first one.
    pub(crate) fn owes(&self) -> bool {
        self.whole == 0 || self.prefix_filled > 0 || self.message_left > 0
    }
}

/// The credit of one connection against the minimum receive rate (see the module docs).
#[derive(Debug)]
pub(crate) struct ReceiveMeter {
    rate_bytes_per_second: u64,
    credit_max: i128,
    credit: i128,
    /// The time the credit was last brought up to date.
    settled_at: Instant,
    /// An unfinished frame or header block.
    frames_owe: bool,
    /// Request bodies whose handler waits for more bytes.
    bodies_waiting: usize,
}

impl ReceiveMeter {
    /// A meter with full credit: `rate_bytes_per_second × stall_timeout`.
    pub(crate) fn new(
        rate_bytes_per_second: u64,
        stall_timeout: std::time::Duration,
        now: Instant,
    ) -> ReceiveMeter {
        assert!(rate_bytes_per_second > 0, "a meter needs a rate");
        let credit_max = i128::from(rate_bytes_per_second) * stall_timeout.as_nanos() as i128;
        ReceiveMeter {
            rate_bytes_per_second,
            credit_max,
            credit: credit_max,
            settled_at: now,
            frames_owe: false,
            bodies_waiting: 0,
        }
    }

    fn owes(&self) -> bool {
        self.frames_owe || self.bodies_waiting > 0
    }

    /// Charges the time spent owing since the last call.
    fn settle(&mut self, now: Instant) {
        if now <= self.settled_at {
            return;
        }
        if self.owes() {
            let elapsed = (now - self.settled_at).as_nanos() as i128;
            self.credit -= i128::from(self.rate_bytes_per_second) * elapsed;
        }
        self.settled_at = now;
    }

    /// The client sent `request_bytes` bytes of request frames; afterwards its frames owe
    /// bytes or not (`frames_owe`).
    pub(crate) fn received(&mut self, request_bytes: u64, frames_owe: bool, now: Instant) {
        self.settle(now);
        let earned = i128::from(request_bytes) * UNITS_PER_BYTE;
        self.credit = self.credit.saturating_add(earned).min(self.credit_max);
        self.frames_owe = frames_owe;
    }

    /// A request body's handler starts (`true`) or stops (`false`) waiting for its bytes.
    pub(crate) fn body_waiting(&mut self, waiting: bool, now: Instant) {
        self.settle(now);
        if waiting {
            self.bodies_waiting += 1;
        } else {
            assert!(
                self.bodies_waiting > 0,
                "a body stops waiting once per wait"
            );
            self.bodies_waiting -= 1;
        }
    }

    /// Whether the connection has fallen further behind the minimum rate than the stall
    /// timeout allows.
    pub(crate) fn exhausted(&mut self, now: Instant) -> bool {
        self.settle(now);
        self.credit < 0
    }

    /// When the credit runs out if nothing more arrives; `None` while nothing is owed.
    pub(crate) fn deadline(&self) -> Option<Instant> {
        if !self.owes() {
            return None;
        }
        let left = self.credit.max(0) / i128::from(self.rate_bytes_per_second);
        let left_ns = u64::try_from(left).unwrap_or(u64::MAX);
        Some(self.settled_at + std::time::Duration::from_nanos(left_ns.saturating_add(1)))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// A frame header: length, type, flags, stream 1.
    fn frame(len: u32, kind: u8, flags: u8) -> Vec<u8> {
        let l = len.to_be_bytes();
        vec![l[1], l[2], l[3], kind, flags, 0, 0, 0, 1]
    }

    #[test]
    fn frames_owe_until_their_payload_and_header_blocks_until_end_headers() {
        let mut t = FrameTracker::default();
        assert!(!t.owes());
        // A SETTINGS frame (type 4) of 6 bytes, fed whole: owes nothing, counts nothing.
        let mut settings = frame(6, 4, 0);
        settings.extend_from_slice(&[0; 6]);
        assert_eq!(t.feed(&settings), 0);
        assert!(!t.owes());
        // A HEADERS frame without END_HEADERS, byte by byte: owes until it ends, and the
        // block stays open until a CONTINUATION with END_HEADERS.
        let mut headers = frame(3, FRAME_HEADERS, 0);
        headers.extend_from_slice(b"abc");
        let mut counted = 0;
        for b in &headers {
            counted += t.feed(&[*b]);
            assert!(t.owes());
        }
        assert_eq!(counted, 12);
        let mut continuation = frame(2, FRAME_CONTINUATION, FLAG_END_HEADERS);
        continuation.extend_from_slice(b"de");
        assert_eq!(t.feed(&continuation), 11);
        assert!(!t.owes());
        // A DATA frame split in two reads owes between them.
        let mut data = frame(4, FRAME_DATA, 1);
        data.extend_from_slice(b"wxyz");
        assert_eq!(t.feed(&data[..10]), 10);
        assert!(t.owes());
        assert_eq!(t.feed(&data[10..]), 3);
        assert!(!t.owes());
    }

    #[test]
    fn garbage_never_panics_the_tracker() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut t = FrameTracker::default();
        for _ in 0..10_000 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let bytes = state.to_le_bytes();
            t.feed(&bytes[..(state % 9) as usize]);
        }
        // A maximal length leaves the tracker owing, without overflow.
        let mut t = FrameTracker::default();
        t.feed(&[0xff, 0xff, 0xff, 0, 0, 0, 0, 0, 1]);
        assert!(t.owes());
    }

    #[test]
    fn a_stalled_request_runs_out_of_credit_after_the_stall_timeout() {
        // 1024 bytes/s, 2 s: a full stall is closed after 2 s, not before.
        let start = Instant::now();
        let mut m = ReceiveMeter::new(1024, Duration::from_secs(2), start);
        m.received(9, true, start);
        assert!(!m.exhausted(start + Duration::from_millis(1_999)));
        let deadline = m.deadline().expect("owing");
        assert!(
            deadline <= start + Duration::from_millis(2_001),
            "{deadline:?}"
        );
        assert!(m.exhausted(start + Duration::from_millis(2_001)));
    }

    #[test]
    fn one_byte_a_second_runs_out_a_little_after_the_stall_timeout() {
        let start = Instant::now();
        let mut m = ReceiveMeter::new(1024, Duration::from_secs(2), start);
        m.body_waiting(true, start);
        let mut t = start;
        let mut seconds = 0;
        while !m.exhausted(t) {
            t += Duration::from_secs(1);
            m.received(1, false, t);
            seconds += 1;
            assert!(seconds < 10, "never ran out");
        }
        assert_eq!(seconds, 3, "2048 bytes of credit drain at 1023 bytes/s");
    }

    #[test]
    fn a_sane_rate_and_time_not_owing_never_run_out() {
        let start = Instant::now();
        let mut m = ReceiveMeter::new(1024, Duration::from_secs(2), start);
        // An upload at 4 KiB/s, in 512-byte pieces every 125 ms, for a minute.
        m.body_waiting(true, start);
        for step in 1..=480u32 {
            let t = start + Duration::from_millis(125) * step;
            assert!(!m.exhausted(t), "step {step}");
            m.received(512, false, t);
        }
        // The handler stops reading (writing to disk): an hour costs nothing.
        let later = start + Duration::from_secs(60);
        m.body_waiting(false, later);
        assert_eq!(m.deadline(), None);
        assert!(!m.exhausted(later + Duration::from_secs(3_600)));
    }

    #[test]
    fn credit_is_capped_so_a_fast_start_buys_no_long_stall() {
        // A megabyte at once earns no more than the 2 s cap.
        let start = Instant::now();
        let mut m = ReceiveMeter::new(1024, Duration::from_secs(2), start);
        m.received(1 << 20, true, start);
        assert!(m.exhausted(start + Duration::from_millis(2_001)));
    }

    #[test]
    fn a_message_stream_owes_inside_a_message_and_before_the_first_only() {
        // (bytes fed so far, in pieces; owes afterwards)
        let message = |length: u32| {
            let mut bytes = vec![0u8];
            bytes.extend_from_slice(&length.to_be_bytes());
            bytes.extend(std::iter::repeat_n(7u8, length as usize));
            bytes
        };
        let two = [message(3), message(2)].concat();
        let table: [(&[&[u8]], bool); 8] = [
            (&[], true),
            (&[&[0, 0, 0]], true),
            (&[&[0, 0, 0, 0, 3]], true),
            (&[&[0, 0, 0, 0, 3, 7, 7]], true),
            (&[&[0, 0, 0, 0, 3, 7, 7, 7]], false),
            (&[&[0, 0, 0, 0, 3], &[7, 7, 7], &[0]], true),
            (&[&two[..9]], true),
            (&[&two[..4], &two[4..]], false),
        ];
        for (pieces, owes) in table {
            let mut messages = GrpcMessages::default();
            for piece in pieces {
                messages.feed(piece);
            }
            assert_eq!(messages.owes(), owes, "{pieces:?}");
        }
        // A message of length zero is whole at its prefix.
        let mut messages = GrpcMessages::default();
        messages.feed(&message(0));
        assert!(!messages.owes());
        // Lengths up to u32::MAX are followed without overflow.
        let mut messages = GrpcMessages::default();
        messages.feed(&[1, 0xff, 0xff, 0xff, 0xff, 1, 2]);
        assert!(messages.owes());
    }

    #[test]
    #[should_panic(expected = "stops waiting once per wait")]
    fn a_body_cannot_stop_waiting_twice() {
        let now = Instant::now();
        let mut m = ReceiveMeter::new(1, Duration::from_secs(1), now);
        m.body_waiting(false, now);
    }
}
