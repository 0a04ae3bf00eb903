//! A poisoned store, one piece of code for both engines: after a failed write or sync the page
//! cache state is unknown, so the store refuses every later request. The first failure is kept
//! whole (for [`crate::LogStore::failure`]) and logged once; a later failure only reaches the
//! work that waited on it, and every later request gets [`LogError::Poisoned`] with the first
//! failure's text.

use std::sync::Arc;

use parking_lot::Mutex;

use crate::LogError;

/// The failure that poisoned a store, if any; shared by its threads and its handle.
#[derive(Debug, Default)]
pub(crate) struct Poison {
    first: Mutex<Option<Arc<LogError>>>,
}

impl Poison {
    /// Poisons the store with `error`, unless an earlier failure did; returns `error`'s text,
    /// the reason given to whoever waited on the failed work.
    pub(crate) fn poison(&self, error: LogError) -> String {
        let reason = error.to_string();
        let mut first = self.first.lock();
        if first.is_none() {
            tracing::error!(%error, "raft log store poisoned");
            *first = Some(Arc::new(error));
        }
        reason
    }

    /// The failure that poisoned the store, whole.
    pub(crate) fn failure(&self) -> Option<Arc<LogError>> {
        self.first.lock().clone()
    }

    /// The reason the store refuses work, if it is poisoned.
    pub(crate) fn reason(&self) -> Option<String> {
        self.first.lock().as_ref().map(|first| first.to_string())
    }

    /// `Err(Poisoned)` once the store is poisoned.
    pub(crate) fn check(&self) -> Result<(), LogError> {
        match self.reason() {
            Some(reason) => Err(Poison::refusal(reason)),
            None => Ok(()),
        }
    }

    /// The error a poisoned store answers with.
    pub(crate) fn refusal(reason: String) -> LogError {
        LogError::Poisoned { reason }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_failure_is_kept_whole_and_named_by_every_refusal() {
        let poison = Poison::default();
        assert!(poison.check().is_ok());
        let first = LogError::io("fdatasync segment", std::io::Error::other("disk full"));
        let first_text = first.to_string();
        assert_eq!(poison.poison(first), first_text);
        let later = LogError::io("write meta", std::io::Error::other("gone"));
        let later_text = later.to_string();
        assert_eq!(
            poison.poison(later),
            later_text,
            "its waiters learn what failed"
        );
        assert!(
            matches!(
                poison.failure().as_deref(),
                Some(LogError::Io { context, .. }) if context == "fdatasync segment"
            ),
            "the first failure is kept whole"
        );
        match poison.check() {
            Err(LogError::Poisoned { reason }) => assert_eq!(reason, first_text),
            other => panic!("expected Poisoned, got {other:?}"),
        }
    }
}
