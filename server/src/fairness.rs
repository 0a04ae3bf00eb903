//! Fairness between the callers of the client port (`docs/operations.md`, "Fairness"), so
//! that one runaway controller cannot starve the others:
//!
//! - **Rate limits per caller.** A caller is a grant (a token or a client certificate), or,
//!   with authentication off, one connection. Each may send at most `requests_per_second`
//!   requests and `bytes_per_second` request bytes (the grant's own, else the node's
//!   `client_requests_per_second_max` and `client_bytes_per_second_max`; 0 = no limit),
//!   with a burst of one second's worth. A request over its caller's rate waits for its turn,
//!   at most `client_rate_wait_ms_max` (and never past its deadline); one that would wait
//!   longer is refused RESOURCE_EXHAUSTED naming the limit, before any work. The decision is
//!   the generic cell rate algorithm ([`gcra`], a pure function).
//! - **Fair queuing of writes.** At most `writes_in_flight_max` writes (writes, deletes,
//!   status writes) are in flight through this node at once. When every slot is taken, the
//!   callers that wait get the slots that free up in turn, one each per round
//!   ([`FairSlots`]), however many requests each has queued: a caller with 64 writes
//!   waiting gets no more turns than one with a single write.
//!
//! Both are per node: a caller that spreads its requests over three nodes gets three
//! times the rate. The state per caller is dropped once it is idle, so the table is bounded
//! by the callers active within a second (and by [`CALLERS_TRACKED_MAX`]).
//!
//! Invariant: a slot is either free, or held by exactly one [`SlotPermit`] (a permit handed
//! to a waiter that went away comes back through its drop); `free + held ==
//! writes_in_flight_max` (asserted).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cairn_proto::error::ApiError;
use tokio::sync::oneshot;
use tokio::time::Instant;

/// Above this many callers with state, idle ones are dropped.
pub const CALLERS_TRACKED_MAX: usize = 4096;

/// The burst a rate allows: one second's worth.
const BURST: Duration = Duration::from_secs(1);

/// The rates of one caller (0 = no limit).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Rates {
    pub requests_per_second: u64,
    pub bytes_per_second: u64,
}

/// The generic cell rate algorithm, in nanoseconds from any fixed point: a caller whose
/// theoretical arrival time is `tat` asks at `now` for a cost of `increment` (the rate's
/// interval times the cost); its burst tolerance is `burst`. Returns the new `tat` and how
/// long to wait before going ahead, or, if that wait would pass `wait_max`, the wait it
/// would need (and nothing changes).
///
/// | tat − now, after adding the increment | decision |
/// |---|---|
/// | ≤ burst | go now |
/// | burst < … ≤ burst + wait_max | wait the difference |
/// | > burst + wait_max | refuse |
pub fn gcra(
    tat: u64,
    now: u64,
    increment: u64,
    burst: u64,
    wait_max: u64,
) -> Result<(u64, u64), u64> {
    let new_tat = tat.max(now).saturating_add(increment);
    let wait = new_tat.saturating_sub(now.saturating_add(burst));
    if wait > wait_max {
        return Err(wait);
    }
    Ok((new_tat, wait))
}

/// The interval a cost of `cost` takes at `per_second` (nanoseconds).
fn increment(cost: u64, per_second: u64) -> u64 {
    (u128::from(cost) * 1_000_000_000 / u128::from(per_second.max(1))).min(u128::from(u64::MAX))
        as u64
}

#[derive(Default)]
struct CallerState {
    requests_tat: u64,
    bytes_tat: u64,
}

/// The rate limits and fair write slots of one node.
pub struct Fairness {
    epoch: Instant,
    wait_max: Duration,
    callers: Mutex<HashMap<String, CallerState>>,
    slots: Arc<FairSlots>,
}

impl Fairness {
    pub fn new(wait_max: Duration, writes_in_flight_max: usize) -> Fairness {
        Fairness {
            epoch: Instant::now(),
            wait_max,
            callers: Mutex::new(HashMap::new()),
            slots: FairSlots::new(writes_in_flight_max),
        }
    }

    fn nanos(&self, at: Instant) -> u64 {
        u64::try_from(at.duration_since(self.epoch).as_nanos()).unwrap_or(u64::MAX)
    }

    /// Waits until `caller` may send a request of `bytes` under `rates`, at most until
    /// `deadline` and [`Fairness`]'s wait bound; else RESOURCE_EXHAUSTED naming the limit.
    pub async fn pace(
        &self,
        caller: &str,
        rates: Rates,
        bytes: u64,
        deadline: Instant,
    ) -> Result<(), ApiError> {
        let wait = self.admit(caller, rates, bytes, Instant::now(), deadline)?;
        if !wait.is_zero() {
            metrics::counter!(PACED).increment(1);
            tokio::time::sleep(wait).await;
        }
        Ok(())
    }

    /// [`Fairness::pace`]'s decision at `now_instant`, without the wait: charges `caller`
    /// and returns how long it must wait, or refuses (charging nothing).
    fn admit(
        &self,
        caller: &str,
        rates: Rates,
        bytes: u64,
        now_instant: Instant,
        deadline: Instant,
    ) -> Result<Duration, ApiError> {
        if rates == Rates::default() {
            return Ok(Duration::ZERO);
        }
        let now = self.nanos(now_instant);
        let wait_max = u64::try_from(
            self.wait_max
                .min(deadline.saturating_duration_since(now_instant))
                .as_nanos(),
        )
        .unwrap_or(u64::MAX);
        let burst = BURST.as_nanos() as u64;
        let wait = {
            let mut callers = self.callers.lock().unwrap_or_else(|e| e.into_inner());
            if callers.len() >= CALLERS_TRACKED_MAX {
                // An idle caller's state is the same as none.
                callers.retain(|_, s| s.requests_tat > now || s.bytes_tat > now);
            }
            let state = callers.entry(caller.to_string()).or_default();
            let requests = match rates.requests_per_second {
                0 => None,
                rate => Some(
                    gcra(state.requests_tat, now, increment(1, rate), burst, wait_max)
                        .map_err(|_| refusal("requests_per_second", rate, caller, "requests"))?,
                ),
            };
            let bytes_decision = match rates.bytes_per_second {
                0 => None,
                rate => Some(
                    gcra(
                        state.bytes_tat,
                        now,
                        increment(bytes, rate),
                        burst,
                        wait_max,
                    )
                    .map_err(|_| refusal("bytes_per_second", rate, caller, "request bytes"))?,
                ),
            };
            // Both pass: only now is either charged.
            let mut wait = 0;
            if let Some((tat, w)) = requests {
                state.requests_tat = tat;
                wait = wait.max(w);
            }
            if let Some((tat, w)) = bytes_decision {
                state.bytes_tat = tat;
                wait = wait.max(w);
            }
            wait
        };
        Ok(Duration::from_nanos(wait))
    }

    /// A write slot for `caller`, in its turn among the callers waiting ([`FairSlots`]),
    /// by `deadline`; else RESOURCE_EXHAUSTED naming `writes_in_flight_max`.
    pub async fn write_slot(
        &self,
        caller: &str,
        deadline: Instant,
    ) -> Result<SlotPermit, ApiError> {
        let waiting = self.slots.acquire(caller);
        match tokio::time::timeout_at(deadline, waiting).await {
            Ok(permit) => Ok(permit),
            Err(_) => {
                metrics::counter!(REFUSED, "limit" => "writes_in_flight_max").increment(1);
                Err(ApiError::exhausted(
                    "writes_in_flight_max",
                    self.slots.capacity as u64,
                    "no write slot of this node freed up for this caller before the request's deadline",
                ))
            }
        }
    }
}

fn refusal(limit: &'static str, rate: u64, caller: &str, what: &str) -> ApiError {
    metrics::counter!(REFUSED, "limit" => limit).increment(1);
    ApiError::exhausted(
        limit,
        rate,
        format!("{caller} sends {what} faster than its rate allows, even after waiting its turn"),
    )
}

/// Requests that waited for their caller's rate.
pub const PACED: &str = "cairn_fairness_paced_total";
/// Requests refused by a rate limit or for want of a write slot, by `limit`.
pub const REFUSED: &str = "cairn_fairness_refused_total";

pub fn describe_metrics() {
    metrics::describe_counter!(PACED, "Requests that waited for their caller's rate limit.");
    metrics::describe_counter!(
        REFUSED,
        "Requests refused RESOURCE_EXHAUSTED by a caller's rate limit or for want of a write slot, by limit."
    );
}

/// `capacity` slots shared by turns among the callers that wait for one.
pub struct FairSlots {
    capacity: usize,
    state: Mutex<SlotsState>,
}

struct SlotsState {
    free: usize,
    /// Per caller, its waiters in arrival order.
    queues: HashMap<String, VecDeque<oneshot::Sender<SlotPermit>>>,
    /// The callers with waiters, in the order of their next turn.
    turns: VecDeque<String>,
}

/// One write slot, given back when dropped.
pub struct SlotPermit {
    slots: Option<Arc<FairSlots>>,
}

impl Drop for SlotPermit {
    fn drop(&mut self) {
        if let Some(slots) = self.slots.take() {
            slots.release();
        }
    }
}

impl FairSlots {
    pub fn new(capacity: usize) -> Arc<FairSlots> {
        assert!(capacity > 0, "at least one write slot");
        Arc::new(FairSlots {
            capacity,
            state: Mutex::new(SlotsState {
                free: capacity,
                queues: HashMap::new(),
                turns: VecDeque::new(),
            }),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, SlotsState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits for a slot in `caller`'s turn.
    pub async fn acquire(self: &Arc<Self>, caller: &str) -> SlotPermit {
        let receiver = {
            let mut state = self.lock();
            if state.free > 0 && state.turns.is_empty() {
                state.free -= 1;
                return SlotPermit {
                    slots: Some(self.clone()),
                };
            }
            let (sender, receiver) = oneshot::channel();
            let queue = state.queues.entry(caller.to_string()).or_default();
            queue.push_back(sender);
            if queue.len() == 1 {
                state.turns.push_back(caller.to_string());
            }
            receiver
        };
        match receiver.await {
            Ok(permit) => permit,
            // The sender is dropped only with its permit sent or the slots gone.
            Err(_) => unreachable!("a waiter's sender is kept until it is given a slot"),
        }
    }

    /// A slot came back: to the next caller in turn that still waits, else to the pool.
    fn release(self: &Arc<Self>) {
        let mut state = self.lock();
        while let Some(caller) = state.turns.pop_front() {
            let Some(queue) = state.queues.get_mut(&caller) else {
                unreachable!("a caller in turn has a queue")
            };
            let Some(sender) = queue.pop_front() else {
                unreachable!("a caller in turn has a waiter")
            };
            if queue.is_empty() {
                state.queues.remove(&caller);
            } else {
                state.turns.push_back(caller);
            }
            let permit = SlotPermit {
                slots: Some(self.clone()),
            };
            match sender.send(permit) {
                Ok(()) => return,
                Err(mut unclaimed) => {
                    // The waiter went away: the slot goes on to the next one (without
                    // this drop coming back here under the lock).
                    unclaimed.slots = None;
                }
            }
        }
        state.free += 1;
        assert!(state.free <= self.capacity, "no more slots free than exist");
        assert!(state.queues.is_empty(), "nobody waits while a slot is free");
    }

    /// Free slots now (for tests).
    pub fn free(&self) -> usize {
        self.lock().free
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    #[test]
    fn the_gcra_table() {
        // (tat, now, increment, burst, wait_max) -> decision
        let table: &[(u64, u64, u64, u64, u64, Result<(u64, u64), u64>)] = &[
            // A fresh caller goes at once.
            (0, 10 * S, S / 10, S, S, Ok((10 * S + S / 10, 0))),
            // Within the burst: at once.
            (
                10 * S + S / 2,
                10 * S,
                S / 10,
                S,
                S,
                Ok((10 * S + 6 * S / 10, 0)),
            ),
            // Past the burst by 0.1 s: wait 0.1 s.
            (11 * S, 10 * S, S / 10, S, S, Ok((11 * S + S / 10, S / 10))),
            // Past the burst by more than wait_max: refused, with the wait it would need.
            (12 * S + S / 2, 10 * S, S / 10, S, S, Err(S + 6 * S / 10)),
            // A cost larger than burst + wait_max is refused even for a fresh caller.
            (0, 10 * S, 3 * S, S, S, Err(2 * S)),
        ];
        for &(tat, now, inc, burst, wait_max, expected) in table {
            assert_eq!(
                gcra(tat, now, inc, burst, wait_max),
                expected,
                "tat {tat} now {now} inc {inc}"
            );
        }
    }

    #[test]
    fn a_rate_allows_its_burst_then_paces_then_refuses() {
        // The caller's clock is given, so the waits are exact: each request is asked at
        // the moment the one before it would have gone ahead.
        let fairness = Fairness::new(Duration::from_millis(500), 8);
        let rates = Rates {
            requests_per_second: 10,
            bytes_per_second: 0,
        };
        let mut now = Instant::now();
        let far = now + Duration::from_secs(60);
        // One second's worth goes at once.
        for _ in 0..10 {
            assert_eq!(
                fairness.admit("runaway", rates, 100, now, far),
                Ok(Duration::ZERO)
            );
        }
        // The next five wait 0.1 s each (asked at once, the fifth waits 0.5 s).
        for n in 1..=5 {
            assert_eq!(
                fairness.admit("runaway", rates, 100, now, far),
                Ok(Duration::from_millis(100 * n))
            );
        }
        // A sixth would wait 0.6 s, past the 0.5 s bound: refused, naming the limit.
        match fairness.admit("runaway", rates, 100, now, far) {
            Err(ApiError::ResourceExhausted { limit, value, .. }) => {
                assert_eq!((limit.as_str(), value), ("requests_per_second", 10));
            }
            other => panic!("{other:?}"),
        }
        // Once the waits have passed, it paces at its rate again.
        now += Duration::from_millis(500);
        assert_eq!(
            fairness.admit("runaway", rates, 100, now, far),
            Ok(Duration::from_millis(100))
        );
        // A deadline nearer than the bound is the bound.
        assert!(fairness
            .admit("runaway", rates, 100, now, now + Duration::from_millis(50))
            .is_err());
        // Another caller is not held back by the first.
        assert_eq!(
            fairness.admit("good", rates, 100, now, far),
            Ok(Duration::ZERO)
        );
        // Bytes: a request larger than a second and a half of the rate is refused.
        let bytes = Rates {
            requests_per_second: 0,
            bytes_per_second: 1000,
        };
        match fairness.admit("big", bytes, 1600, now, far) {
            Err(ApiError::ResourceExhausted { limit, value, .. }) => {
                assert_eq!((limit.as_str(), value), ("bytes_per_second", 1000));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            fairness.admit("big", bytes, 900, now, far),
            Ok(Duration::ZERO)
        );
        // No limits: never charged, never waits.
        assert_eq!(
            fairness.admit("free", Rates::default(), u64::MAX, now, now),
            Ok(Duration::ZERO)
        );
    }

    #[tokio::test]
    async fn freed_slots_go_to_the_waiting_callers_in_turn() {
        let slots = FairSlots::new(1);
        let held = slots.acquire("runaway").await;
        // The runaway queues three writes, then a good caller queues one.
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for (i, caller) in ["runaway", "runaway", "runaway", "good"]
            .into_iter()
            .enumerate()
        {
            let slots = slots.clone();
            let order = order.clone();
            tasks.push(tokio::spawn(async move {
                let permit = slots.acquire(caller).await;
                order.lock().unwrap().push(format!("{caller}{i}"));
                tokio::task::yield_now().await;
                drop(permit);
            }));
            tokio::task::yield_now().await;
        }
        drop(held);
        for t in tasks {
            t.await.unwrap();
        }
        let order = order.lock().unwrap().clone();
        assert_eq!(
            order,
            ["runaway0", "good3", "runaway1", "runaway2"],
            "the good caller's single write is second, not last"
        );
        assert_eq!(slots.free(), 1, "every slot came back");
    }

    #[tokio::test]
    async fn a_waiter_that_gives_up_passes_its_slot_on() {
        let slots = FairSlots::new(1);
        let held = slots.acquire("a").await;
        let gave_up = tokio::time::timeout(Duration::from_millis(10), slots.acquire("b")).await;
        assert!(gave_up.is_err());
        let waiting = {
            let slots = slots.clone();
            tokio::spawn(async move { slots.acquire("c").await })
        };
        tokio::task::yield_now().await;
        drop(held);
        let permit = waiting.await.unwrap();
        drop(permit);
        assert_eq!(slots.free(), 1);
    }
}
