//! # An example controller, remote or in process
//!
//! Reconciles the status of every `demo.v1.Counter`: a Counter's data is JSON
//! `{"value": N}`; the controller keeps `status["example-controller"]` saying
//! whether N is even or odd (condition `Parity`, TRUE with reason `Even` or
//! `Odd`), or that the data is not such a value (FALSE, reason
//! `InvalidData`). `docs/controller.md` walks through it with the commands.
//!
//! It is written once, against `cairn_client::ResourceApi`, and runs either
//! against a cluster over gRPC (`cairn_client::Client`) or inside the process
//! of an embedded node (`cairn_server::embed::InProcessClient`): see `main.rs`,
//! which picks one.
//!
//! How: a [`WatchCache`] of the Counters, primed before any work; its
//! subscriber queues the key of every Counter written; the worker
//! reconciles each key from the cache, with the store's lifecycle
//! (`docs/contract.md`, section 4b):
//! - a Counter without the controller's finalizer ([`FINALIZER`]) gets it, by a
//!   compare-and-set write of the Counter as read (someone else's write in between, a
//!   conflict, makes it read the Counter again, strongly, and start over, a bounded
//!   number of times);
//! - its status entry is written with a status write, which never conflicts with the
//!   users writing the data, whenever the entry does not say what the data at the
//!   current `generation` calls for (`observed_generation` is that generation, which the
//!   store moves only when the data or metadata change);
//! - a Counter marked for deletion (a user deleted it while it held the finalizer) is
//!   finalized: the controller does its cleanup (here: it logs the last value) and
//!   writes the Counter back without its finalizer, which removes it.
//!
//! Its own writes come back through the cache and find nothing more to do.
//! Level-triggered: each pass decides from the Counter alone.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use cairn_client::{
    CacheEvent, ClientError, ResourceApi, ResourceKey, WatchCache, WatchCacheOptions, WatchSpec,
};
use cairn_proto::google::protobuf::Timestamp;
use cairn_proto::lifecycle;
use cairn_proto::v1::{
    condition, Condition, Consistency, Id, Resource, Status, Tenancy, Type, WriteStatusRequest,
};
use tokio::sync::mpsc;

pub const GROUP: &str = "demo";
pub const KIND: &str = "Counter";
/// The status entry this controller owns.
pub const STATUS_KEY: &str = "example-controller";
/// The condition it keeps there.
pub const CONDITION: &str = "Parity";
/// How many conflicts one reconciliation retries before it leaves the key
/// to its next event.
pub const CONFLICT_RETRIES_MAX: u32 = 16;
/// The finalizer the controller keeps on every Counter: a deleted Counter stays (marked)
/// until the controller has finalized it.
pub const FINALIZER: &str = "example-controller.demo/cleanup";
/// How long a key whose reconciliation failed waits before it is tried again.
pub const RETRY_AFTER: Duration = Duration::from_millis(500);

/// `demo.v1.Counter`.
pub fn counter_type() -> Type {
    Type {
        group: GROUP.into(),
        group_version: "v1".into(),
        kind: KIND.into(),
    }
}

/// The status a Counter's data calls for (without its time stamp).
pub fn desired_status(counter: &Resource) -> Status {
    let (state, reason, message) = match counter_value(counter) {
        Ok(value) => {
            let parity = if value % 2 == 0 { "Even" } else { "Odd" };
            let message = format!("value {value} is {}", parity.to_lowercase());
            (condition::State::True, parity.to_string(), message)
        }
        Err(why) => (
            condition::State::False,
            "InvalidData".to_string(),
            format!("the data must be JSON {{\"value\": <integer>}}: {why}"),
        ),
    };
    Status {
        observed_generation: counter.generation.clone(),
        conditions: vec![Condition {
            r#type: CONDITION.into(),
            state: state as i32,
            reason,
            message,
            resource: None,
        }],
        updated_at: None,
    }
}

/// The integer a Counter's data holds, or why it holds none.
fn counter_value(counter: &Resource) -> Result<i64, String> {
    let data = counter.data.as_ref().ok_or("the Counter has no data")?;
    let json: serde_json::Value =
        serde_json::from_slice(&data.value).map_err(|e| format!("not JSON ({e})"))?;
    json.get("value")
        .and_then(serde_json::Value::as_i64)
        .ok_or_else(|| format!("no integer \"value\" in {json}"))
}

/// Whether `counter` already carries `desired` (the time stamp aside).
fn is_reconciled(counter: &Resource, desired: &Status) -> bool {
    counter.status.get(STATUS_KEY).is_some_and(|s| {
        s.observed_generation == desired.observed_generation && s.conditions == desired.conditions
    })
}

fn now() -> Timestamp {
    let since_epoch = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    Timestamp {
        seconds: i64::try_from(since_epoch.as_secs()).unwrap_or(i64::MAX),
        nanos: since_epoch.subsec_nanos() as i32,
    }
}

fn id_of(key: &ResourceKey) -> Id {
    Id {
        uid: String::new(),
        name: key.name.clone(),
        r#type: Some(Type {
            group: key.group.clone(),
            group_version: String::new(),
            kind: key.kind.clone(),
        }),
        tenancy: Some(Tenancy {
            partition: key.partition.clone(),
            namespace: key.namespace.clone(),
        }),
    }
}

/// What one reconciliation did.
#[derive(Debug, Clone, PartialEq)]
pub enum Reconciled {
    /// The Counter needed nothing (or is gone).
    Unchanged,
    /// The Counter's status entry was written: the Counter as stored after it.
    Written(Arc<Resource>),
    /// The Counter was marked for deletion: the controller removed its finalizer, and
    /// with it the Counter.
    Finalized,
}

/// Whether the Counter holds [`FINALIZER`].
fn holds_finalizer(counter: &Resource) -> bool {
    lifecycle::finalizers(&counter.metadata).contains(&FINALIZER)
}

/// The Counter with [`FINALIZER`] added (`present`) or removed.
fn with_finalizer(counter: &Resource, present: bool) -> Resource {
    let mut next = counter.clone();
    lifecycle::set_finalizer(&mut next.metadata, FINALIZER, present);
    next
}

/// A compare-and-set write of `change(current)`, reading the Counter again on a conflict,
/// at most [`CONFLICT_RETRIES_MAX`] times. `None` from `change`: nothing to write.
async fn write_with_retries(
    client: &dyn ResourceApi,
    mut current: Arc<Resource>,
    change: impl Fn(&Resource) -> Option<Resource>,
) -> Result<Option<Arc<Resource>>, ClientError> {
    let id = current.id.clone().unwrap_or_default();
    let mut conflicts = 0;
    loop {
        let Some(next) = change(&current) else {
            return Ok(Some(current));
        };
        match client.write(next).await {
            Ok(written) => return Ok(Some(written)),
            Err(e) if e.is_cas_conflict() && conflicts < CONFLICT_RETRIES_MAX => {
                conflicts += 1;
                tracing::debug!(name = %id.name, conflicts, "conflict; reading the Counter again");
                let mut exact = id.clone();
                exact.uid = String::new();
                current = match client.read(exact, Consistency::Strong).await {
                    Ok(latest) => latest,
                    Err(ClientError::NotFound) => return Ok(None),
                    Err(e) => return Err(e),
                };
            }
            Err(e) => return Err(e),
        }
    }
}

/// Brings the Counter `current` (as last seen) to what the controller wants of it: its
/// finalizer on, its status entry saying what the data calls for, or, once it is marked
/// for deletion, finalized.
pub async fn reconcile(
    client: &dyn ResourceApi,
    current: Arc<Resource>,
) -> Result<Reconciled, ClientError> {
    if lifecycle::is_marked(&current.metadata) {
        if !holds_finalizer(&current) {
            return Ok(Reconciled::Unchanged);
        }
        // The cleanup a real controller does outside the store goes here.
        tracing::info!(
            name = %current.id.as_ref().map(|i| i.name.as_str()).unwrap_or(""),
            value = ?counter_value(&current).ok(),
            "finalizing a deleted Counter"
        );
        write_with_retries(client, current, |c| {
            holds_finalizer(c).then(|| with_finalizer(c, false))
        })
        .await?;
        return Ok(Reconciled::Finalized);
    }
    // The finalizer first: a Counter deleted from now on waits for the controller.
    let Some(current) = write_with_retries(client, current, |c| {
        (!holds_finalizer(c) && !lifecycle::is_marked(&c.metadata)).then(|| with_finalizer(c, true))
    })
    .await?
    else {
        return Ok(Reconciled::Unchanged);
    };
    let desired = desired_status(&current);
    if is_reconciled(&current, &desired) {
        return Ok(Reconciled::Unchanged);
    }
    // One entry of the status, against the uid only: no conflict with the data's writers.
    let written = client
        .write_status(WriteStatusRequest {
            id: current.id.clone(),
            key: STATUS_KEY.to_string(),
            status: Some(Status {
                updated_at: Some(now()),
                ..desired
            }),
            version: String::new(),
            fence: None,
        })
        .await;
    match written {
        Ok(written) => Ok(Reconciled::Written(written)),
        Err(ClientError::NotFound) => Ok(Reconciled::Unchanged),
        Err(e) => Err(e),
    }
}

/// Runs the controller through `client` until `stop` completes: primes a
/// cache of every Counter, then reconciles each Counter written (every one
/// in the cache at first). Errors of one reconciliation are logged and left
/// to the Counter's next event; the cache re-watches on its own.
pub async fn run(
    client: Arc<dyn ResourceApi>,
    stop: impl Future<Output = ()>,
) -> Result<(), ClientError> {
    let (queue, mut keys) = mpsc::unbounded_channel::<ResourceKey>();
    let retry = queue.clone();
    let cache = WatchCache::start_with(
        client.clone(),
        vec![WatchSpec::new(GROUP, KIND)],
        WatchCacheOptions {
            retry_backoff_max: Duration::from_millis(500),
            ..WatchCacheOptions::default()
        },
        // Short and non-blocking, as a cache callback must be: queue the key.
        vec![Box::new(move |event: &CacheEvent| {
            if let CacheEvent::Upsert(counter) = event {
                let _ = queue.send(ResourceKey::of(counter));
            }
        })],
    )?;
    tokio::pin!(stop);
    tokio::select! {
        _ = cache.wait_primed() => {}
        _ = &mut stop => return Ok(()),
    }
    tracing::info!(counters = cache.len(), "primed; reconciling");
    loop {
        let key = tokio::select! {
            _ = &mut stop => return Ok(()),
            key = keys.recv() => match key {
                Some(key) => key,
                None => return Ok(()),
            },
        };
        // The cache's latest, whatever event queued the key.
        let Some(current) = cache.get(&id_of(&key)) else {
            continue;
        };
        match reconcile(client.as_ref(), current).await {
            Ok(Reconciled::Written(counter)) => {
                let status = &counter.status[STATUS_KEY].conditions[0];
                tracing::info!(
                    counter = %format!("{}/{}/{}", key.partition, key.namespace, key.name),
                    version = %counter.version,
                    reason = %status.reason,
                    "reconciled"
                );
            }
            Ok(Reconciled::Finalized) => {
                tracing::info!(name = %key.name, "finalized");
            }
            Ok(Reconciled::Unchanged) => {}
            Err(e) => {
                // Tried again after a pause (a cluster still below version 0.2 refuses
                // status writes for its first seconds, say); a later event also brings
                // the key back. One pending retry per failure, so as many as keys failed.
                tracing::warn!(name = %key.name, error = %e, "reconciling failed; trying again");
                let retry = retry.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(RETRY_AFTER).await;
                    let _ = retry.send(key);
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_proto::google::protobuf::Any;

    fn counter(data: &str) -> Resource {
        Resource {
            data: Some(Any {
                type_url: "type.googleapis.com/demo.v1.Counter".into(),
                value: data.as_bytes().to_vec().into(),
            }),
            generation: "g1".into(),
            ..Default::default()
        }
    }

    #[test]
    fn the_status_follows_the_value_and_names_bad_data() {
        let even = desired_status(&counter(r#"{"value": 4}"#));
        assert_eq!(even.observed_generation, "g1");
        assert_eq!(even.conditions[0].reason, "Even");
        assert_eq!(even.conditions[0].state, condition::State::True as i32);
        assert_eq!(
            desired_status(&counter(r#"{"value": -3}"#)).conditions[0].reason,
            "Odd"
        );
        for bad in [r#"{"value": "x"}"#, "not json", "{}"] {
            let status = desired_status(&counter(bad));
            assert_eq!(status.conditions[0].reason, "InvalidData", "{bad}");
            assert_eq!(status.conditions[0].state, condition::State::False as i32);
        }
    }

    #[test]
    fn a_counter_with_its_status_needs_nothing_whatever_the_time_stamp() {
        let mut c = counter(r#"{"value": 1}"#);
        let desired = desired_status(&c);
        assert!(!is_reconciled(&c, &desired));
        c.status.insert(
            STATUS_KEY.into(),
            Status {
                updated_at: Some(now()),
                ..desired.clone()
            },
        );
        assert!(is_reconciled(&c, &desired));
    }
}

/// The calls of a [`Client`](cairn_client::Client) with every write, delete and status write
/// fenced by `fence` (an election's [`Leadership::fence`](cairn_client::Leadership::fence)):
/// once another replica won the election, the cluster refuses them (FailedPrecondition),
/// whatever this replica believes. Reads, lists and watches go through as they are.
pub struct Fenced {
    pub client: cairn_client::Client,
    pub fence: cairn_proto::v1::Fence,
}

impl ResourceApi for Fenced {
    fn read(
        &self,
        id: Id,
        consistency: Consistency,
    ) -> cairn_client::api::ApiFuture<'_, Arc<Resource>> {
        ResourceApi::read(&self.client, id, consistency)
    }

    fn write(&self, resource: Resource) -> cairn_client::api::ApiFuture<'_, Arc<Resource>> {
        Box::pin(async move {
            let request = cairn_proto::v1::WriteRequest {
                resource: Some(resource),
                fence: Some(self.fence.clone()),
            };
            self.client.write_request(request).await.map(Arc::new)
        })
    }

    fn delete_request(
        &self,
        mut request: cairn_proto::v1::DeleteRequest,
    ) -> cairn_client::api::ApiFuture<'_, cairn_proto::v1::DeleteResponse> {
        request.fence = Some(self.fence.clone());
        Box::pin(async move { self.client.delete_request(request).await })
    }

    fn write_status(
        &self,
        mut request: cairn_proto::v1::WriteStatusRequest,
    ) -> cairn_client::api::ApiFuture<'_, Arc<Resource>> {
        request.fence = Some(self.fence.clone());
        ResourceApi::write_status(&self.client, request)
    }

    fn list(
        &self,
        request: cairn_proto::v1::ListRequest,
    ) -> cairn_client::api::ApiFuture<'_, cairn_client::Listing> {
        ResourceApi::list(&self.client, request)
    }

    fn list_page(
        &self,
        request: cairn_proto::v1::ListRequest,
    ) -> cairn_client::api::ApiFuture<'_, cairn_client::Listing> {
        ResourceApi::list_page(&self.client, request)
    }

    fn list_by_owner(&self, owner: Id) -> cairn_client::api::ApiFuture<'_, cairn_client::Listing> {
        ResourceApi::list_by_owner(&self.client, owner)
    }

    fn watch_list(
        &self,
        request: cairn_proto::v1::WatchListRequest,
    ) -> cairn_client::api::ApiFuture<'_, cairn_client::Watch> {
        ResourceApi::watch_list(&self.client, request)
    }

    fn watch_progress(
        &self,
        source: &str,
        watch_ids: Vec<u64>,
    ) -> cairn_client::api::ApiFuture<'_, cairn_client::WatchProgress> {
        ResourceApi::watch_progress(&self.client, source, watch_ids)
    }

    fn avoid(&self, source: &str) {
        ResourceApi::avoid(&self.client, source)
    }
}
