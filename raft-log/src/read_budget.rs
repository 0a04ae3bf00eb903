//! The size rule of a bounded read, one piece of code for both engines: entries are taken in
//! index order while their encoded sizes add up to at most `bytes_max`, and the first one is
//! always taken whatever its size (so that an entry larger than the bound can still be read).
//! `bytes_max = u64::MAX` is an unbounded read.

/// Counts what a bounded read has taken so far.
#[derive(Debug)]
pub(crate) struct ReadBudget {
    bytes_max: u64,
    bytes: u64,
    entries: u64,
}

impl ReadBudget {
    pub(crate) fn new(bytes_max: u64) -> ReadBudget {
        ReadBudget {
            bytes_max,
            bytes: 0,
            entries: 0,
        }
    }

    /// Whether the read has no bound, so that nothing needs sizing.
    pub(crate) fn is_unbounded(&self) -> bool {
        self.bytes_max == u64::MAX
    }

    /// Whether the next entry, `len_bytes` long, is taken; counts it if so. Once this says no,
    /// the read stops (a later, smaller entry must not be taken past a gap).
    pub(crate) fn take(&mut self, len_bytes: u64) -> bool {
        let bytes = self.bytes.saturating_add(len_bytes);
        if self.entries > 0 && bytes > self.bytes_max {
            return false;
        }
        self.bytes = bytes;
        self.entries += 1;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_entry_is_always_taken_and_later_ones_only_within_the_bound() {
        let mut budget = ReadBudget::new(10);
        assert!(
            budget.take(25),
            "the first entry, though larger than the bound"
        );
        assert!(!budget.take(1), "nothing after an oversized first entry");

        let mut budget = ReadBudget::new(10);
        assert!(budget.take(4));
        assert!(budget.take(6), "exactly at the bound");
        assert!(!budget.take(1), "one byte past the bound");

        let mut budget = ReadBudget::new(u64::MAX);
        assert!(budget.is_unbounded());
        assert!(budget.take(u64::MAX));
        assert!(
            budget.take(u64::MAX),
            "sizes saturate instead of overflowing"
        );
    }
}
