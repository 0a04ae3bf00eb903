//! The table digest (`cairn_fsm::integrity`) as replicas rely on it: two stores that apply
//! the same log hold the same digest at every index; it depends on what is stored, not on
//! the path that led there (a write undone by a delete gives the digest back; a store
//! restored from another's image holds the other's digest); the digests of past indexes
//! are answered from the ones kept; and the CORRUPT alarm goes through the log and into
//! images.

mod common;

use cairn_fsm::integrity::DIGESTS_KEPT;
use cairn_fsm::{Applied, Command, CorruptAlarm, DigestAt, IntegrityAction, Limits};
use common::*;

fn digest(log: &Log) -> u64 {
    match log.store.digest_at(log.store.applied_index()) {
        DigestAt::Known(d) => d,
        other => panic!("the applied index's digest is known: {other:?}"),
    }
}

#[test]
fn replicas_that_apply_the_same_log_hold_the_same_digest_at_every_index() {
    let (mut a, mut b) = (Log::new(), Log::new());
    let mut seen = Vec::new();
    for i in 0..40 {
        let name = format!("svc-{}", i % 7);
        for log in [&mut a, &mut b] {
            if i % 5 == 4 {
                let _ = log.delete(id("", &name), "");
            } else {
                let _ = log.write(resource(id(&format!("u{i}"), &name), ""));
            }
        }
        assert_eq!(digest(&a), digest(&b), "after entry {}", a.index);
        seen.push((a.index, digest(&a)));
    }
    // Past indexes are answered from the digests kept, the same on both.
    for (index, d) in seen {
        assert_eq!(a.store.digest_at(index), DigestAt::Known(d));
        assert_eq!(b.store.digest_at(index), DigestAt::Known(d));
    }
    assert_eq!(
        a.store.digest_at(a.index + 1),
        DigestAt::NotYet {
            applied_index: a.index
        }
    );
}

#[test]
fn the_digest_depends_on_what_is_stored_not_on_how() {
    let mut log = Log::new();
    let empty = digest(&log);
    log.put(resource(id("u1", "a"), ""));
    let with_a = digest(&log);
    assert_ne!(with_a, empty, "a resource changes the digest");
    let b = log.put(resource(id("u2", "b"), ""));
    assert_ne!(digest(&log), with_a);
    log.delete(id("u2", "b"), b.head().version).unwrap();
    assert_eq!(digest(&log), with_a, "a write undone gives the digest back");

    // Another store restored from this one's image holds the same digest.
    let image = log.store.snapshot();
    let applied_index = image.applied_index;
    let other = Log::new();
    let mut restoration = other.store.restore();
    for stored in image {
        restoration.apply(stored.resource()).unwrap();
    }
    restoration.commit(applied_index).unwrap();
    assert_eq!(
        other.store.digest_at(applied_index),
        DigestAt::Known(with_a)
    );
    // Digests from before a restore describe another table: forgotten.
    assert!(matches!(
        other.store.digest_at(applied_index - 1),
        DigestAt::Forgotten { .. }
    ));
}

#[test]
fn only_the_last_digests_are_kept() {
    let mut log = Log::new();
    for _ in 0..DIGESTS_KEPT + 10 {
        log.noop();
    }
    assert!(matches!(log.store.digest_at(1), DigestAt::Forgotten { .. }));
    assert!(matches!(
        log.store.digest_at(log.index - DIGESTS_KEPT as u64 + 2),
        DigestAt::Known(_)
    ));
}

#[test]
fn the_corrupt_alarm_changes_through_the_log_from_cluster_version_0_2() {
    let raise = Command::Integrity {
        action: IntegrityAction::RaiseCorrupt(vec![3]),
    };
    // Under 0.1 it is refused, the same on every replica.
    let mut old = Log::new();
    assert!(apply(&mut old, raise.clone()).is_err());
    assert!(!old.store.corrupt_alarm().is_raised());

    let mut log = log_at_0_2(Limits::default());
    let raised = apply(&mut log, raise).unwrap();
    let expected = CorruptAlarm {
        members: vec![3],
        raised_index: log.index,
    };
    assert_eq!(raised, Applied::Integrity(expected.clone()));
    assert_eq!(log.store.corrupt_alarm(), expected);
    // Images carry it.
    assert_eq!(log.store.snapshot().corrupt, expected);
    apply(
        &mut log,
        Command::Integrity {
            action: IntegrityAction::Disarm,
        },
    )
    .unwrap();
    assert!(!log.store.corrupt_alarm().is_raised());
}
