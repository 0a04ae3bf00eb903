//! The retained history of changes: an append-only log of fixed-size chunks
//! whose slots are written once.
//!
//! A [`History`] value is a window `[start, end)` over change sequence
//! numbers plus a shared list of chunks. Cloning it is one `Arc` increment;
//! appending writes one slot of the open chunk in place (readers holding an
//! older window never look past their `end`, so they never see it) and, once
//! per [`CHUNK_CHANGES`] appends, copies the short list of chunk pointers. No
//! change is ever copied, which is what makes publishing a new window after
//! every batch cheap.

use std::collections::VecDeque;
use std::sync::{Arc, OnceLock};

use crate::state::Change;

/// Changes per chunk.
pub(crate) const CHUNK_CHANGES: usize = 64;

struct Chunk {
    /// Sequence number of the first slot.
    first_sequence: u64,
    slots: [OnceLock<Change>; CHUNK_CHANGES],
}

impl Chunk {
    fn new(first_sequence: u64) -> Chunk {
        assert_eq!(
            first_sequence % CHUNK_CHANGES as u64,
            0,
            "chunks are aligned"
        );
        Chunk {
            first_sequence,
            slots: std::array::from_fn(|_| OnceLock::new()),
        }
    }
}

/// A window of retained changes, oldest first, revisions strictly increasing.
#[derive(Clone, Default)]
pub(crate) struct History {
    chunks: Arc<VecDeque<Arc<Chunk>>>,
    /// Sequence number of the oldest retained change.
    start: u64,
    /// One past the sequence number of the newest change.
    end: u64,
}

impl History {
    pub fn len(&self) -> usize {
        (self.end - self.start) as usize
    }

    /// Sequence number of the oldest retained change (`start`).
    pub fn start(&self) -> u64 {
        self.start
    }

    /// One past the newest change's sequence number.
    pub fn end(&self) -> u64 {
        self.end
    }

    /// The change with sequence number `sequence`, if it is in the window.
    pub fn get(&self, sequence: u64) -> Option<&Change> {
        if sequence < self.start || sequence >= self.end {
            return None;
        }
        let first = self.chunks.front()?.first_sequence;
        let chunk = self
            .chunks
            .get(((sequence - first) / CHUNK_CHANGES as u64) as usize)?;
        let change = chunk.slots[(sequence % CHUNK_CHANGES as u64) as usize].get();
        assert!(change.is_some(), "every slot inside the window is written");
        change
    }

    pub fn last(&self) -> Option<&Change> {
        self.end.checked_sub(1).and_then(|s| self.get(s))
    }

    /// The sequence number of the first change with a revision above
    /// `revision` (`end` if none).
    pub fn first_after(&self, revision: u64) -> u64 {
        let (mut low, mut high) = (self.start, self.end);
        while low < high {
            let middle = low + (high - low) / 2;
            let at = self.get(middle).map(|c| c.revision).unwrap_or(u64::MAX);
            if at <= revision {
                low = middle + 1;
            } else {
                high = middle;
            }
        }
        low
    }

    /// Appends a change (writer only).
    pub fn push(&mut self, change: Change) {
        if let Some(last) = self.last() {
            assert!(
                last.revision <= change.revision,
                "history revisions never decrease (a batch's changes share one)"
            );
        }
        let offset = (self.end % CHUNK_CHANGES as u64) as usize;
        if offset == 0 || self.chunks.is_empty() {
            let aligned = self.end - offset as u64;
            Arc::make_mut(&mut self.chunks).push_back(Arc::new(Chunk::new(aligned)));
        }
        let chunk = self
            .chunks
            .back()
            .unwrap_or_else(|| unreachable!("pushed above"));
        assert_eq!(chunk.first_sequence + offset as u64, self.end);
        let written = chunk.slots[offset].set(change);
        assert!(written.is_ok(), "a slot is written once");
        self.end += 1;
    }

    /// Drops the oldest change from the window (writer only); returns its
    /// revision.
    pub fn pop_front(&mut self) -> Option<u64> {
        let revision = self.get(self.start)?.revision;
        self.start += 1;
        let first = self.chunks.front().map(|c| c.first_sequence);
        if let Some(first) = first {
            if self.start >= first + CHUNK_CHANGES as u64 {
                Arc::make_mut(&mut self.chunks).pop_front();
            }
        }
        Some(revision)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn change(revision: u64) -> Change {
        Change {
            revision,
            key: Arc::from("k"),
            before: None,
            after: Some(crate::StoredResource::from_resource(&Default::default())),
        }
    }

    #[test]
    fn a_window_survives_later_appends_and_evictions() {
        // An old clone keeps seeing exactly its changes while the writer moves on.
        let mut h = History::default();
        for r in 1..=100 {
            h.push(change(r * 2));
        }
        let old = h.clone();
        for r in 101..=300 {
            h.push(change(r * 2));
            h.pop_front();
        }
        assert_eq!(old.len(), 100);
        assert_eq!(old.get(0).map(|c| c.revision), Some(2));
        assert_eq!(old.last().map(|c| c.revision), Some(200));
        assert_eq!(h.len(), 100);
        assert_eq!(h.get(h.start()).map(|c| c.revision), Some(402));
        assert!(h.get(h.start() - 1).is_none());
        assert_eq!(h.last().map(|c| c.revision), Some(600));
        assert!(
            h.chunks.len() <= 100 / CHUNK_CHANGES + 2,
            "evicted chunks are released"
        );
    }

    #[test]
    fn first_after_finds_the_first_newer_revision() {
        // Binary search over revisions 10, 20, ..., 1000.
        let mut h = History::default();
        for r in 1..=100 {
            h.push(change(r * 10));
        }
        assert_eq!(h.first_after(0), 0);
        assert_eq!(h.first_after(10), 1);
        assert_eq!(h.first_after(15), 1);
        assert_eq!(h.first_after(1000), 100);
        h.pop_front();
        assert_eq!(h.first_after(0), 1);
    }
}
