//! One rule for "at most N times per interval": log lines about a noisy source (offending
//! connections, refused peer messages, exhausted descriptors) and rounds of work a peer can
//! provoke (vouching for a stranger) all take a [`RateLimit`].
//!
//! Invariant: within one interval, at most `per_interval` calls of [`RateLimit::take`]
//! succeed; every refused call is counted, and the count is handed to the next successful
//! call (or to [`RateLimit::flush`]) exactly once.

use std::time::{Duration, Instant};

use parking_lot::Mutex;

pub struct RateLimit {
    per_interval: u32,
    interval: Duration,
    window: Mutex<Window>,
}

struct Window {
    started: Option<Instant>,
    taken: u32,
    refused: u64,
}

impl RateLimit {
    pub fn new(per_interval: u32, interval: Duration) -> RateLimit {
        assert!(per_interval > 0, "a rate limit lets something through");
        RateLimit {
            per_interval,
            interval,
            window: Mutex::new(Window {
                started: None,
                taken: 0,
                refused: 0,
            }),
        }
    }

    /// At most once per second.
    pub fn once_a_second() -> RateLimit {
        RateLimit::new(1, Duration::from_secs(1))
    }

    /// `Some(refused)` when this call may go ahead, with the number of calls refused since
    /// the last one that went ahead (to report as `suppressed`); `None` when the interval's
    /// budget is spent (the call is counted).
    pub fn take(&self) -> Option<u64> {
        let mut w = self.window.lock();
        let now = Instant::now();
        if w.started
            .is_none_or(|t| now.duration_since(t) >= self.interval)
        {
            w.started = Some(now);
            w.taken = 0;
        }
        if w.taken >= self.per_interval {
            w.refused += 1;
            return None;
        }
        w.taken += 1;
        Some(std::mem::take(&mut w.refused))
    }

    /// The calls refused since the last that went ahead, once their interval is over
    /// (`None`: none, or the interval is still running): for a periodic "N suppressed" line.
    pub fn flush(&self) -> Option<u64> {
        let mut w = self.window.lock();
        let over = w.started.is_none_or(|t| t.elapsed() >= self.interval);
        (over && w.refused > 0).then(|| std::mem::take(&mut w.refused))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_of_an_interval_goes_ahead_and_the_rest_is_counted_once() {
        let limit = RateLimit::new(2, Duration::from_secs(3600));
        assert_eq!(limit.take(), Some(0));
        assert_eq!(limit.take(), Some(0));
        assert_eq!(limit.take(), None);
        assert_eq!(limit.take(), None);
        assert_eq!(limit.flush(), None, "the interval is still running");
        let next = RateLimit::new(1, Duration::ZERO);
        assert_eq!(next.take(), Some(0));
        // A zero interval is over at once: every call goes ahead.
        assert_eq!(next.take(), Some(0));
    }

    #[test]
    fn refused_calls_are_reported_by_the_next_call_that_goes_ahead_or_by_flush() {
        let limit = RateLimit::new(1, Duration::from_millis(20));
        assert_eq!(limit.take(), Some(0));
        assert_eq!(limit.take(), None);
        assert_eq!(limit.take(), None);
        std::thread::sleep(Duration::from_millis(30));
        assert_eq!(limit.take(), Some(2));
        assert_eq!(limit.take(), None);
        std::thread::sleep(Duration::from_millis(30));
        assert_eq!(limit.flush(), Some(1));
        assert_eq!(limit.flush(), None, "reported once");
        assert_eq!(limit.take(), Some(0));
    }
}
