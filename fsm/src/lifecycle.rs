//! The resource lifecycle above the storage contract (cluster version 0.2,
//! [`crate::Feature::Lifecycle`]): the generation the store sets, finalizers and deletion
//! marks, and the collection of what a removed owner owned.
//!
//! The rules, with Consul's metadata keys so that its controllers' habits carry over:
//! - **Generation.** A write stores `generation` = its own version when it changes `data`
//!   or `metadata` (or creates the resource), else keeps the stored one: a status write
//!   never changes it ([`generation`]).
//! - **Finalizers.** Metadata [`FINALIZERS`] is a whitespace-separated list. A Delete of a
//!   resource that has finalizers only marks it: metadata [`DELETION_TIMESTAMP`] is set to
//!   the proposing leader's time (RFC 3339), and the resource stays ([`delete_decision`]).
//!   A marked resource may only lose finalizers ([`marked_write`]); the write that
//!   removes the last one removes the resource. No one but the store sets the mark.
//! - **Collection.** When a resource is removed (not only marked), the resources naming it
//!   as owner (uid included) are deleted too, by the leader, through the log, at most
//!   [`COLLECT_BATCH_MAX`] per entry ([`crate::Command::Collect`]), their finalizers
//!   honoured: so does a resource whose owner is gone when it is written, or after a
//!   restore. A Delete that asks to orphan adds the finalizer [`ORPHAN_FINALIZER`] to a
//!   resource that owns others; the collection then clears their owner references in
//!   batches and removes that finalizer when none is left.
//!
//! Every function here is pure: the store calls them at apply, in log order.
//!
//! ## Invariants
//! - A stored resource holds [`DELETION_TIMESTAMP`] only if the store set it (a Delete of a
//!   resource with finalizers, an orphaning Delete, the end of its lease, or the collection
//!   of its owner); once set, it never changes while the resource lives.
//! - A marked resource is removed exactly when its last finalizer is.

use std::collections::BTreeMap;

use cairn_proto::google::protobuf::Timestamp;
use cairn_proto::v1::Resource;

use crate::FsmError;

pub use cairn_proto::lifecycle::{finalizers, DELETION_TIMESTAMP, FINALIZERS, ORPHAN_FINALIZER};
/// The most dependents one [`crate::Command::Collect`] entry deletes, marks or orphans.
pub const COLLECT_BATCH_MAX: usize = 256;

/// Whether the metadata holds at least one finalizer.
pub fn has_finalizers(metadata: &BTreeMap<String, String>) -> bool {
    !finalizers(metadata).is_empty()
}

pub use cairn_proto::lifecycle::is_marked;

/// The generation a write stores: the stored one when neither `data` nor `metadata`
/// changes, else the write's own version (`index`).
pub fn generation(stored: Option<&Resource>, given: &Resource, index: u64) -> String {
    match stored {
        Some(s) if s.data == given.data && s.metadata == given.metadata => s.generation.clone(),
        _ => index.to_string(),
    }
}

/// What a Delete that passed its checks does to the stored resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeleteOutcome {
    /// Removed now (what it owned is collected after).
    Remove,
    /// Marked for deletion; with `orphan`, [`ORPHAN_FINALIZER`] is added.
    Mark { orphan: bool },
    /// Already marked: nothing changes.
    AlreadyMarked,
}

/// The delete rule, as a table: `marked` and `has_finalizers` describe the stored
/// resource, `orphan` the request, `has_dependents` whether anything names it as owner.
pub fn delete_decision(
    marked: bool,
    has_finalizers: bool,
    orphan: bool,
    has_dependents: bool,
) -> DeleteOutcome {
    match (marked, orphan && has_dependents, has_finalizers) {
        (true, _, _) => DeleteOutcome::AlreadyMarked,
        (false, true, _) => DeleteOutcome::Mark { orphan: true },
        (false, false, true) => DeleteOutcome::Mark { orphan: false },
        (false, false, false) => DeleteOutcome::Remove,
    }
}

/// `resource` marked for deletion at `now_ms` (Unix milliseconds); with `orphan`, with
/// [`ORPHAN_FINALIZER`] added to its finalizers.
pub fn mark(resource: &mut Resource, now_ms: u64, orphan: bool) {
    assert!(!is_marked(&resource.metadata), "a resource is marked once");
    resource
        .metadata
        .insert(DELETION_TIMESTAMP.to_string(), timestamp_of_ms(now_ms));
    if orphan && !finalizers(&resource.metadata).contains(&ORPHAN_FINALIZER) {
        cairn_proto::lifecycle::set_finalizer(&mut resource.metadata, ORPHAN_FINALIZER, true);
    }
    assert!(is_marked(&resource.metadata));
}

/// `resource` without the finalizer `name` (the key goes when the list empties).
pub fn without_finalizer(resource: &mut Resource, name: &str) {
    cairn_proto::lifecycle::set_finalizer(&mut resource.metadata, name, false);
}

/// The RFC 3339 form of a Unix time in milliseconds.
pub fn timestamp_of_ms(now_ms: u64) -> String {
    let t = Timestamp {
        seconds: (now_ms / 1000) as i64,
        nanos: ((now_ms % 1000) * 1_000_000) as i32,
    };
    cairn_proto::rfc3339::format_timestamp(&t).unwrap_or_else(|| "9999-12-31T23:59:59Z".to_string())
}

/// What a write to a marked resource does, when allowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MarkedWrite {
    /// Stored, with fewer finalizers (or none removed).
    Keep,
    /// The last finalizer went: the resource is removed.
    Remove,
}

/// The rule for a write to the marked resource `stored`: it may only remove finalizers,
/// so `given` must hold the same data, owner, lease and metadata (the mark included) but
/// for a subset of the finalizers. Its status may differ (a status write is allowed).
pub fn marked_write(stored: &Resource, given: &Resource) -> Result<MarkedWrite, FsmError> {
    let refuse = |what: &str| {
        Err(FsmError::FailedPrecondition(format!(
            "resource {:?} is marked for deletion (metadata {DELETION_TIMESTAMP} {}): a write \
             may only remove finalizers, and this one changes {what}",
            given.id.as_ref().map(|i| i.name.as_str()).unwrap_or(""),
            stored
                .metadata
                .get(DELETION_TIMESTAMP)
                .map(String::as_str)
                .unwrap_or("")
        )))
    };
    if given.data != stored.data {
        return refuse("data");
    }
    if given.owner != stored.owner {
        return refuse("owner");
    }
    if given.lease != stored.lease {
        return refuse("lease");
    }
    let others = |m: &BTreeMap<String, String>| {
        m.iter()
            .filter(|(k, _)| k.as_str() != FINALIZERS)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect::<BTreeMap<_, _>>()
    };
    if others(&given.metadata) != others(&stored.metadata) {
        return refuse(&format!(
            "metadata other than {FINALIZERS} (the mark {DELETION_TIMESTAMP} included)"
        ));
    }
    let had = finalizers(&stored.metadata);
    let left = finalizers(&given.metadata);
    if let Some(added) = left.iter().find(|f| !had.contains(f)) {
        return refuse(&format!("{FINALIZERS}: it adds {added:?}"));
    }
    Ok(match left.is_empty() {
        true => MarkedWrite::Remove,
        false => MarkedWrite::Keep,
    })
}

/// The rule for a write to a resource that is not marked: it may not mark it itself.
pub fn unmarked_write(given: &Resource) -> Result<(), FsmError> {
    match is_marked(&given.metadata) {
        true => Err(FsmError::invalid(
            format!("resource.metadata.{DELETION_TIMESTAMP}"),
            "is set by the store when a resource with finalizers is deleted; a write may not \
             set it",
        )),
        false => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_proto::google::protobuf::Any;

    fn res(data: &[u8], metadata: &[(&str, &str)]) -> Resource {
        Resource {
            data: Some(Any {
                type_url: "t".into(),
                value: data.to_vec().into(),
            }),
            metadata: metadata
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            generation: "7".into(),
            ..Resource::default()
        }
    }

    #[test]
    fn the_delete_rule_as_a_table() {
        use DeleteOutcome::*;
        // (marked, has finalizers, orphan asked, has dependents) -> outcome
        let table = [
            ((false, false, false, false), Remove),
            ((false, false, false, true), Remove),
            ((false, false, true, false), Remove),
            ((false, false, true, true), Mark { orphan: true }),
            ((false, true, false, false), Mark { orphan: false }),
            ((false, true, false, true), Mark { orphan: false }),
            ((false, true, true, true), Mark { orphan: true }),
            ((true, true, false, false), AlreadyMarked),
            ((true, false, true, true), AlreadyMarked),
        ];
        for ((marked, fin, orphan, deps), want) in table {
            assert_eq!(
                delete_decision(marked, fin, orphan, deps),
                want,
                "{marked} {fin} {orphan} {deps}"
            );
        }
    }

    #[test]
    fn generation_moves_with_data_or_metadata_only() {
        let stored = res(b"a", &[("k", "v")]);
        let mut status_only = stored.clone();
        status_only.status.insert("c".into(), Default::default());
        let table = [
            (None, res(b"a", &[]), "9"),
            (Some(&stored), stored.clone(), "7"),
            (Some(&stored), status_only, "7"),
            (Some(&stored), res(b"b", &[("k", "v")]), "9"),
            (Some(&stored), res(b"a", &[("k", "w")]), "9"),
        ];
        for (before, given, want) in table {
            assert_eq!(generation(before, &given, 9), want);
        }
    }

    #[test]
    fn a_marked_resource_may_only_lose_finalizers() {
        let t = ("deletionTimestamp", "2026-11-29T10:00:00Z");
        let stored = res(b"a", &[t, ("finalizers", "x y")]);
        let ok_keep = res(b"a", &[t, ("finalizers", "y")]);
        let ok_remove = res(b"a", &[t, ("finalizers", "  ")]);
        let ok_remove_key = res(b"a", &[t]);
        let mut with_status = stored.clone();
        with_status.status.insert("c".into(), Default::default());
        assert_eq!(marked_write(&stored, &ok_keep), Ok(MarkedWrite::Keep));
        assert_eq!(marked_write(&stored, &with_status), Ok(MarkedWrite::Keep));
        assert_eq!(marked_write(&stored, &ok_remove), Ok(MarkedWrite::Remove));
        assert_eq!(
            marked_write(&stored, &ok_remove_key),
            Ok(MarkedWrite::Remove)
        );
        for (given, names) in [
            (res(b"b", &[t, ("finalizers", "x y")]), "data"),
            (res(b"a", &[t, ("finalizers", "x y z")]), "adds \"z\""),
            (res(b"a", &[("finalizers", "x")]), "metadata other than"),
            (res(b"a", &[t, ("finalizers", "x"), ("k", "v")]), "metadata"),
        ] {
            let error = marked_write(&stored, &given).unwrap_err().to_string();
            assert!(error.contains(names), "{error}");
            assert!(error.contains("may only remove finalizers"), "{error}");
        }
    }

    #[test]
    fn marking_sets_the_time_and_the_orphan_finalizer_once() {
        let mut r = res(b"a", &[("finalizers", "x")]);
        mark(&mut r, 1_764_410_400_123, true);
        assert_eq!(
            r.metadata["deletionTimestamp"],
            "2025-11-29T10:00:00.123000000Z"
        );
        assert_eq!(r.metadata["finalizers"], "x cairn.io/orphan");
        without_finalizer(&mut r, ORPHAN_FINALIZER);
        assert_eq!(r.metadata["finalizers"], "x");
        without_finalizer(&mut r, "x");
        assert!(!r.metadata.contains_key("finalizers"));
        assert!(unmarked_write(&r).is_err(), "a write may not mark");
    }
}
