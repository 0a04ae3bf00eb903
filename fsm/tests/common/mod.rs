//! Helpers shared by the integration tests: ids, resources, and a log that
//! hands out increasing indexes.
#![allow(dead_code)]

use bytes::Bytes;
use cairn_fsm::{
    Applied, Command, Event, FsmError, Limits, Store, StoredResource, Watch, WatchEventKind,
    WatchFilter,
};
use cairn_proto::google::protobuf::Any;
use cairn_proto::v1::{Id, Resource, Tenancy, Type};

pub fn ty(group: &str, group_version: &str, kind: &str) -> Type {
    Type {
        group: group.into(),
        group_version: group_version.into(),
        kind: kind.into(),
    }
}

pub fn tenancy(partition: &str, namespace: &str) -> Tenancy {
    Tenancy {
        partition: partition.into(),
        namespace: namespace.into(),
    }
}

/// An id of type catalog/v1/Service in tenancy (default, default).
pub fn id(uid: &str, name: &str) -> Id {
    full_id(
        uid,
        name,
        ty("catalog", "v1", "Service"),
        tenancy("default", "default"),
    )
}

pub fn full_id(uid: &str, name: &str, type_: Type, tenancy: Tenancy) -> Id {
    Id {
        uid: uid.into(),
        name: name.into(),
        r#type: Some(type_),
        tenancy: Some(tenancy),
    }
}

/// A resource with `id`, expected version `version`, and a small payload.
pub fn resource(id: Id, version: &str) -> Resource {
    Resource {
        id: Some(id),
        version: version.into(),
        data: Some(Any {
            type_url: "type.example/Payload".into(),
            value: Bytes::from_static(b"payload"),
        }),
        ..Default::default()
    }
}

pub fn services() -> Type {
    ty("catalog", "v1", "Service")
}

pub fn filter(type_: Type, tenancy: Tenancy, name_prefix: &str) -> WatchFilter {
    WatchFilter {
        type_,
        tenancy,
        name_prefix: name_prefix.into(),
        selector: None,
    }
}

/// A store plus the next log index to apply.
pub struct Log {
    pub store: Store,
    pub index: u64,
}

impl Log {
    pub fn new() -> Log {
        Log::with_limits(Limits::default())
    }

    pub fn with_limits(limits: Limits) -> Log {
        Log {
            store: Store::new(limits),
            index: 0,
        }
    }

    pub fn write(&mut self, resource: Resource) -> Result<Applied, FsmError> {
        self.index += 1;
        self.store.apply(self.index, &Command::Write { resource })
    }

    /// Writes and returns the stored resource; panics on failure.
    pub fn put(&mut self, resource: Resource) -> StoredResource {
        match self.write(resource) {
            Ok(Applied::Written(r)) => r,
            other => panic!("write failed: {other:?}"),
        }
    }

    pub fn delete(&mut self, id: Id, version: &str) -> Result<Applied, FsmError> {
        self.index += 1;
        self.store.apply(
            self.index,
            &Command::Delete {
                id,
                version: version.into(),
                now_ms: 0,
                orphan: false,
            },
        )
    }

    pub fn noop(&mut self) {
        self.index += 1;
        self.store.apply_noop(self.index);
    }
}

/// Every event ready now, and the closing error if the watch ended.
pub fn drain(watch: &mut Watch) -> (Vec<Event>, Option<FsmError>) {
    let mut events = Vec::new();
    loop {
        match watch.try_next() {
            Ok(Some(e)) => events.push(e),
            Ok(None) => return (events, None),
            Err(e) => return (events, Some(e)),
        }
    }
}

/// (kind, name, version, revision) of each event, for compact assertions.
pub fn summary(events: &[Event]) -> Vec<(WatchEventKind, String, String, u64)> {
    events
        .iter()
        .map(|e| {
            let (name, version) = e
                .resource
                .as_ref()
                .map(|r| (r.head().name.to_string(), r.version().to_string()))
                .unwrap_or_default();
            (e.kind, name, version, e.revision)
        })
        .collect()
}

pub fn names(resources: &[StoredResource]) -> Vec<String> {
    let mut v: Vec<String> = resources
        .iter()
        .map(|r| r.head().name.to_string())
        .collect();
    v.sort();
    v
}

/// A log at cluster version 0.2, where the rules of that version (capacity, leases) hold.
pub fn log_at_0_2(limits: Limits) -> Log {
    let mut log = Log::with_limits(limits);
    apply(
        &mut log,
        Command::ClusterVersion {
            action: cairn_fsm::VersionAction::Raise,
            version: cairn_fsm::ClusterVersion::new(0, 2),
        },
    )
    .unwrap();
    log
}

/// Applies `command` at the log's next index.
pub fn apply(log: &mut Log, command: Command) -> Result<Applied, FsmError> {
    log.index += 1;
    log.store.apply(log.index, &command)
}
