//! Leases and fencing through the store's public interface: what is attached goes with
//! its lease (and watchers see the Deletes), an expiry loses to a keep-alive applied
//! after its verdict, a fence refuses a deposed holder's writes, and leases survive
//! snapshots and restores exactly.

mod common;

use cairn_fsm::{Applied, Command, FsmError, Lease, LeaseApplied, Store, WatchEventKind};
use cairn_proto::v1::{Fence, Reference, Resource};
use common::*;

fn at_0_2() -> Log {
    log_at_0_2(Default::default())
}

fn lease_applied(log: &mut Log, command: Command) -> LeaseApplied {
    match apply(log, command) {
        Ok(Applied::Lease(applied)) => applied,
        other => panic!("lease command: {other:?}"),
    }
}

fn grant(log: &mut Log, ttl_ms: u64) -> Lease {
    match lease_applied(log, Command::LeaseGrant { ttl_ms }) {
        LeaseApplied::Granted(lease) => lease,
        other => panic!("grant: {other:?}"),
    }
}

fn leased(name: &str, lease: u64) -> Resource {
    let mut r = resource(id(&format!("uid-{name}"), name), "");
    r.lease = lease;
    r
}

fn election_ref(name: &str) -> Reference {
    let id = id("", name);
    Reference {
        r#type: id.r#type,
        tenancy: id.tenancy,
        name: name.into(),
        section: String::new(),
    }
}

fn failed_precondition(result: Result<Applied, FsmError>) -> String {
    match result {
        Err(FsmError::FailedPrecondition(why)) => why,
        other => panic!("expected FAILED_PRECONDITION, got {other:?}"),
    }
}

#[test]
fn leases_need_cluster_version_0_2() {
    let mut log = Log::new();
    let why = failed_precondition(apply(&mut log, Command::LeaseGrant { ttl_ms: 1000 }));
    assert!(why.contains("needs cluster version 0.2"), "{why}");
    let write = Command::Write {
        resource: leased("a", 7),
    };
    assert_eq!(write.needs(), Some(cairn_fsm::Feature::Leases));
}

#[test]
fn a_revoked_lease_takes_its_resources_and_their_watchers_see_the_deletes() {
    let mut log = at_0_2();
    let lease = grant(&mut log, 10_000);
    assert_eq!(lease.id, log.index, "a lease's id is its grant's index");
    let other = grant(&mut log, 10_000);
    log.put(leased("a", lease.id));
    log.put(leased("b", lease.id));
    log.put(leased("c", other.id));
    log.put(leased("plain", 0));
    assert_eq!(log.store.view().lease(lease.id).map(|l| l.1), Some(2));
    let mut watch = log
        .store
        .watch(
            filter(services(), tenancy("default", "default"), ""),
            log.index,
        )
        .unwrap();

    let revoked = lease_applied(
        &mut log,
        Command::LeaseRevoke {
            id: lease.id,
            now_ms: 0,
        },
    );
    assert_eq!(
        revoked,
        LeaseApplied::Revoked {
            existed: true,
            deleted: 2
        }
    );
    let (events, closed) = drain(&mut watch);
    assert!(closed.is_none());
    let deletes: Vec<_> = summary(&events)
        .into_iter()
        .map(|(kind, name, _, revision)| (kind, name, revision))
        .collect();
    assert_eq!(
        deletes,
        [
            (WatchEventKind::Delete, "a".to_string(), log.index),
            (WatchEventKind::Delete, "b".to_string(), log.index),
        ]
    );
    let view = log.store.view();
    assert_eq!(
        names(&view.list(&services(), &tenancy("*", "*"), "")),
        ["c", "plain"]
    );
    assert!(view.lease(lease.id).is_none());
    // Revoking again changes nothing; a write naming the dead lease is refused.
    assert_eq!(
        lease_applied(
            &mut log,
            Command::LeaseRevoke {
                id: lease.id,
                now_ms: 0
            }
        ),
        LeaseApplied::Revoked {
            existed: false,
            deleted: 0
        }
    );
    let why = failed_precondition(log.write(leased("d", lease.id)));
    assert!(
        why.contains(&format!("lease {} does not exist", lease.id)),
        "{why}"
    );
}

#[test]
fn a_write_without_the_lease_detaches_the_resource() {
    let mut log = at_0_2();
    let lease = grant(&mut log, 10_000);
    let stored = log.put(leased("a", lease.id));
    let mut again = leased("a", 0);
    again.version = stored.version().to_string();
    log.put(again);
    assert_eq!(log.store.view().lease(lease.id).map(|l| l.1), Some(0));
    lease_applied(
        &mut log,
        Command::LeaseRevoke {
            id: lease.id,
            now_ms: 0,
        },
    );
    assert_eq!(log.store.view().len(), 1, "a detached resource stays");
}

#[test]
fn an_expiry_loses_to_a_keep_alive_applied_after_its_verdict() {
    let mut log = at_0_2();
    let lease = grant(&mut log, 1_000);
    log.put(leased("a", lease.id));
    // The leader judged the grant's renewal; a keep-alive commits before its verdict.
    let kept = lease_applied(
        &mut log,
        Command::LeaseKeepAlive {
            ids: vec![lease.id, 999_999],
        },
    );
    assert_eq!(
        kept,
        LeaseApplied::KeptAlive(vec![(lease.id, 1_000), (999_999, 0)])
    );
    let renewed = log.index;
    let stale = lease_applied(
        &mut log,
        Command::LeaseExpire {
            leases: vec![(lease.id, lease.renewed_revision)],
            now_ms: 0,
        },
    );
    assert_eq!(
        stale,
        LeaseApplied::Expired {
            expired: vec![],
            deleted: 0
        }
    );
    assert_eq!(log.store.view().len(), 1);
    // A verdict on the last renewal revokes it, with what is attached.
    let expired = lease_applied(
        &mut log,
        Command::LeaseExpire {
            leases: vec![(lease.id, renewed)],
            now_ms: 0,
        },
    );
    assert_eq!(
        expired,
        LeaseApplied::Expired {
            expired: vec![lease.id],
            deleted: 1
        }
    );
    assert!(log.store.view().is_empty());
}

#[test]
fn a_fence_refuses_the_writes_of_a_deposed_holder() {
    let mut log = at_0_2();
    let first = grant(&mut log, 1_000);
    let won = log.put(leased("leader", first.id));
    let token: u64 = won.version().parse().unwrap();
    let fenced = |token: u64, name: &str| Command::Fenced {
        fence: Fence {
            election: Some(election_ref("leader")),
            token,
        },
        command: Box::new(Command::Write {
            resource: resource(id(&format!("uid-{name}"), name), ""),
        }),
    };
    assert!(matches!(
        apply(&mut log, fenced(token, "by-first")),
        Ok(Applied::Written(_))
    ));
    // The first holder's lease expires; a second holder wins with a higher token.
    lease_applied(
        &mut log,
        Command::LeaseExpire {
            leases: vec![(first.id, first.renewed_revision)],
            now_ms: 0,
        },
    );
    let why = failed_precondition(apply(&mut log, fenced(token, "late")));
    assert!(why.contains("not held"), "{why}");
    let second = grant(&mut log, 1_000);
    let won = log.put(leased("leader", second.id));
    let second_token: u64 = won.version().parse().unwrap();
    assert!(second_token > token, "tokens only grow");
    let why = failed_precondition(apply(&mut log, fenced(token, "stale")));
    assert!(
        why.contains(&format!("held at token {second_token}")),
        "{why}"
    );
    assert!(matches!(
        apply(&mut log, fenced(second_token, "by-second")),
        Ok(Applied::Written(_))
    ));
    let view = log.store.view();
    assert_eq!(
        names(&view.list(&services(), &tenancy("*", "*"), "")),
        ["by-first", "by-second", "leader"],
        "no write of a deposed holder was applied"
    );
    // A fenced delete and a fenced status write follow the same rule.
    let delete = Command::Fenced {
        fence: Fence {
            election: Some(election_ref("leader")),
            token,
        },
        command: Box::new(Command::Delete {
            id: id("uid-by-second", "by-second"),
            version: String::new(),
            now_ms: 0,
            orphan: false,
        }),
    };
    failed_precondition(apply(&mut log, delete));
}

#[test]
fn leases_survive_a_snapshot_and_an_online_restore_exactly() {
    let mut log = at_0_2();
    let lease = grant(&mut log, 5_000);
    log.put(leased("a", lease.id));
    lease_applied(
        &mut log,
        Command::LeaseKeepAlive {
            ids: vec![lease.id],
        },
    );
    let before = log.store.view().lease(lease.id).unwrap();

    // A Raft snapshot keeps the leases as they are, renewals included.
    let image = log.store.snapshot();
    let at = image.applied_index;
    let leases = image.leases.clone();
    let copy = Store::new(Default::default());
    let mut restoration = copy.restore();
    restoration.set_leases(leases).unwrap();
    restoration.set_cluster_version(log.store.cluster_version());
    for r in image {
        restoration.apply(r.resource()).unwrap();
    }
    restoration.commit(at).unwrap();
    assert_eq!(copy.view().lease(lease.id), Some(before));
    // An image whose resource names a lease it does not hold is refused.
    let mut bad = Store::new(Default::default()).restore();
    let mut stray = leased("x", 77);
    stray.version = "3".into();
    assert!(bad.apply(stray).is_err());

    // An online restore brings the backup's leases, renewed at its commit.
    let mut target = at_0_2();
    let mut backup = leased("restored", lease.id);
    backup.version = "4".into();
    for command in [
        Command::RestoreBegin {
            restore_id: "r".into(),
            resource_count: 1,
            leases: vec![(lease.id, 5_000)],
        },
        Command::RestoreChunk {
            restore_id: "r".into(),
            resources: vec![backup],
        },
        Command::RestoreCommit {
            restore_id: "r".into(),
        },
    ] {
        apply(&mut target, command).unwrap();
    }
    let (restored, attached) = target.store.view().lease(lease.id).unwrap();
    assert_eq!(attached, 1);
    assert_eq!(restored.renewed_revision, target.index);
    // Revoking the restored lease takes the restored resource.
    lease_applied(
        &mut target,
        Command::LeaseRevoke {
            id: lease.id,
            now_ms: 0,
        },
    );
    assert!(target.store.view().is_empty());
    // A grant after a restore that brought higher ids gets an id above them.
    let mut high = at_0_2();
    for command in [
        Command::RestoreBegin {
            restore_id: "h".into(),
            resource_count: 0,
            leases: vec![(1_000, 5_000)],
        },
        Command::RestoreCommit {
            restore_id: "h".into(),
        },
    ] {
        apply(&mut high, command).unwrap();
    }
    assert_eq!(grant(&mut high, 5_000).id, 1_001);
}
