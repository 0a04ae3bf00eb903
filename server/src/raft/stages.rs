//! Where a write's time goes: per-stage timings of the leader's write path,
//! for `docs/benchmarks.md`.
//!
//! Off by default (`write_stage_timing = false`): then every recording point
//! costs one relaxed atomic load. On, each write records when it was
//! received by the write batcher, taken into a batch, proposed to openraft
//! and answered; each log index records when the first follower acknowledged
//! it (replicated), when the state machine started applying it (committed:
//! openraft applies an entry right after it commits it) and when it was
//! applied. When a write is answered its stages are turned into intervals and
//! recorded in the histogram `cairn_write_stage_seconds{stage}` (served on
//! the metrics port):
//!
//! | stage | from | to |
//! | --- | --- | --- |
//! | `queue` | received by the batcher | taken into a batch |
//! | `propose` | taken into a batch | handed to openraft |
//! | `replicate` | handed to openraft | first follower acknowledged the entry |
//! | `commit` | first follower acknowledged | apply started (committed) |
//! | `apply` | apply started | applied |
//! | `answer` | applied | the proposer has the outcome |
//! | `total` | received by the batcher | the proposer has the outcome |
//!
//! A single node (no follower) has no `replicate` or `commit` stage.
//!
//! The per-index times live in a ring of [`RING_SLOTS`] slots; a write
//! answered after its slot was reused (more than that many entries later)
//! records only its per-write stages. The slots are written without locks by
//! several tasks: a racing update can leave a slot with a mix of two indexes'
//! times, so intervals that come out negative are dropped. This is a
//! measuring instrument, not state anything depends on.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Per-index slots kept; a power of two.
pub const RING_SLOTS: usize = 4096;

/// Name of the histogram the stages are recorded in.
pub const STAGE_HISTOGRAM: &str = "cairn_write_stage_seconds";

/// One log index's times, as nanoseconds since [`WriteStages::epoch`] (0 = not seen).
#[derive(Default)]
struct Slot {
    index: AtomicU64,
    replicated_ns: AtomicU64,
    apply_started_ns: AtomicU64,
    applied_ns: AtomicU64,
}

/// The stage clock of one node (see the module docs).
pub struct WriteStages {
    enabled: AtomicBool,
    epoch: Instant,
    slots: Box<[Slot]>,
}

/// The per-write times, kept by the proposer of one write or batch.
#[derive(Clone, Copy, Debug)]
pub struct WriteTimes {
    pub received: Instant,
    pub batched: Option<Instant>,
    pub proposed: Option<Instant>,
}

/// Which per-index time to record.
#[derive(Clone, Copy, Debug)]
pub enum IndexStage {
    Replicated,
    ApplyStarted,
    Applied,
}

impl WriteStages {
    pub fn new(enabled: bool) -> WriteStages {
        assert!(
            RING_SLOTS.is_power_of_two(),
            "the ring is indexed by a mask"
        );
        WriteStages {
            enabled: AtomicBool::new(enabled),
            epoch: Instant::now(),
            slots: (0..RING_SLOTS).map(|_| Slot::default()).collect(),
        }
    }

    pub fn enabled(&self) -> bool {
        self.enabled.load(Ordering::Relaxed)
    }

    /// `Some(now)` when timing is on.
    pub fn now(&self) -> Option<Instant> {
        self.enabled().then(Instant::now)
    }

    /// Records that `stage` happened now for every index in `first..=last`
    /// (only the first time it happens for an index).
    pub fn record_indexes(&self, stage: IndexStage, first: u64, last: u64) {
        if !self.enabled() || first > last {
            return;
        }
        // Nanoseconds since the epoch, never 0 (0 means "not seen").
        let now_ns = (self.epoch.elapsed().as_nanos() as u64).max(1);
        // An AppendEntries carries at most a few hundred entries; a range wider
        // than the ring would only overwrite itself.
        let first = first.max(last.saturating_sub(RING_SLOTS as u64 - 1));
        for index in first..=last {
            let slot = &self.slots[index as usize & (RING_SLOTS - 1)];
            if slot.index.swap(index, Ordering::Relaxed) != index {
                slot.replicated_ns.store(0, Ordering::Relaxed);
                slot.apply_started_ns.store(0, Ordering::Relaxed);
                slot.applied_ns.store(0, Ordering::Relaxed);
            }
            let field = match stage {
                IndexStage::Replicated => &slot.replicated_ns,
                IndexStage::ApplyStarted => &slot.apply_started_ns,
                IndexStage::Applied => &slot.applied_ns,
            };
            let _ = field.compare_exchange(0, now_ns, Ordering::Relaxed, Ordering::Relaxed);
        }
    }

    /// Records the stages of a write (or a batch of `writes` writes) that
    /// was answered now, at log `index`.
    pub fn record_answered(&self, times: &WriteTimes, index: Option<u64>, writes: usize) {
        if !self.enabled() {
            return;
        }
        let answered = Instant::now();
        let slot = index.map(|i| (i, &self.slots[i as usize & (RING_SLOTS - 1)]));
        let at = |ns: &AtomicU64| -> Option<Instant> {
            let (i, slot) = slot?;
            if slot.index.load(Ordering::Relaxed) != i {
                return None;
            }
            match ns.load(Ordering::Relaxed) {
                0 => None,
                n => Some(self.epoch + Duration::from_nanos(n)),
            }
        };
        let replicated = slot.and_then(|(_, s)| at(&s.replicated_ns));
        let apply_started = slot.and_then(|(_, s)| at(&s.apply_started_ns));
        let applied = slot.and_then(|(_, s)| at(&s.applied_ns));
        let stages = [
            ("queue", Some(times.received), times.batched),
            ("propose", times.batched, times.proposed),
            ("replicate", times.proposed, replicated),
            ("commit", replicated, apply_started),
            ("apply", apply_started, applied),
            ("answer", applied, Some(answered)),
            ("total", Some(times.received), Some(answered)),
        ];
        for (stage, from, to) in stages {
            if let (Some(from), Some(to)) = (from, to) {
                if to >= from {
                    let seconds = (to - from).as_secs_f64();
                    for _ in 0..writes.max(1) {
                        metrics::histogram!(STAGE_HISTOGRAM, "stage" => stage).record(seconds);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn off_records_nothing_and_reads_no_clock() {
        let stages = WriteStages::new(false);
        assert!(stages.now().is_none());
        stages.record_indexes(IndexStage::Applied, 1, 3);
        for slot in stages.slots.iter() {
            assert_eq!(slot.index.load(Ordering::Relaxed), 0);
        }
    }

    #[test]
    fn an_index_keeps_its_first_time_and_a_reused_slot_forgets_the_old_index() {
        let stages = WriteStages::new(true);
        stages.record_indexes(IndexStage::Replicated, 5, 5);
        let slot = &stages.slots[5];
        let first = slot.replicated_ns.load(Ordering::Relaxed);
        assert_ne!(first, 0);
        std::thread::sleep(Duration::from_millis(2));
        stages.record_indexes(IndexStage::Replicated, 5, 5);
        assert_eq!(slot.replicated_ns.load(Ordering::Relaxed), first);
        // The same slot, one lap later: the old index's times are gone.
        stages.record_indexes(
            IndexStage::Applied,
            5 + RING_SLOTS as u64,
            5 + RING_SLOTS as u64,
        );
        assert_eq!(slot.index.load(Ordering::Relaxed), 5 + RING_SLOTS as u64);
        assert_eq!(slot.replicated_ns.load(Ordering::Relaxed), 0);
        assert_ne!(slot.applied_ns.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn a_range_wider_than_the_ring_records_only_its_last_lap() {
        let stages = WriteStages::new(true);
        stages.record_indexes(IndexStage::ApplyStarted, 1, 3 * RING_SLOTS as u64);
        let lowest = stages
            .slots
            .iter()
            .map(|s| s.index.load(Ordering::Relaxed))
            .min()
            .unwrap();
        assert_eq!(lowest, 2 * RING_SLOTS as u64 + 1);
    }
}
