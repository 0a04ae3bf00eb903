//! Capacity through the store's public interface: the space quota with its NOSPACE alarm,
//! tenant quotas, the bounded history, and that every replica decides the same for the
//! same log whatever its own configuration.

mod common;

use bytes::Bytes;
use cairn_fsm::capacity::{QUOTA_GROUP, QUOTA_GROUP_VERSION, QUOTA_KIND, QUOTA_TYPE_URL};
use cairn_fsm::{Applied, CapacityAction, Command, FsmError, Limits, SpaceState, Store};
use cairn_proto::google::protobuf::Any;
use cairn_proto::v1::{QuotaSpec, Resource};
use common::*;
use proptest::prelude::*;
use prost::Message;

fn capacity(log: &mut Log, action: CapacityAction) -> SpaceState {
    match apply(log, Command::Capacity { action }) {
        Ok(Applied::Capacity(space)) => space,
        other => panic!("capacity command: {other:?}"),
    }
}

/// A service named `name` whose data is `size` bytes.
fn sized(name: &str, size: usize, version: &str) -> Resource {
    let mut r = resource(id(&format!("uid-{name}"), name), version);
    r.data = Some(Any {
        type_url: "type.example/Payload".into(),
        value: Bytes::from(vec![7u8; size]),
    });
    r
}

fn exhausted(result: Result<Applied, FsmError>) -> String {
    match result {
        Err(FsmError::ResourceExhausted { reason, .. }) => reason,
        other => panic!("expected RESOURCE_EXHAUSTED, got {other:?}"),
    }
}

#[test]
fn a_full_cluster_refuses_growth_raises_the_alarm_and_recovers_when_deletes_make_room() {
    let mut log = log_at_0_2(Limits::default());
    capacity(&mut log, CapacityAction::SetQuota(10_000));
    let mut versions = Vec::new();
    // Resources of about 700 accounted bytes: the quota stops one at over 9,300 bytes,
    // above the low-water mark (9,000).
    let mut refused = None;
    for i in 0..20 {
        match log.write(sized(&format!("r{i}"), 400, "")) {
            Ok(Applied::Written(r)) => versions.push((format!("r{i}"), r.version().to_string())),
            other => {
                refused = Some((i, other));
                break;
            }
        }
    }
    let (at, result) = refused.expect("the quota refused a write");
    assert!((12..=16).contains(&at), "refused at write {at}");
    let reason = exhausted(result);
    assert!(
        reason.contains("data_bytes_max = 10000") && reason.contains("usage"),
        "the refusal names the quota and the usage: {reason}"
    );
    let usage = log.store.view().usage();
    assert!(
        usage.bytes <= 10_000,
        "usage never passes the quota: {usage:?}"
    );
    let space = log.store.space();
    assert_eq!(
        space.alarm_index,
        Some(log.index),
        "the refused entry raised NOSPACE"
    );

    // Under the alarm: a small new write is refused too, reads go on, an overwrite that
    // does not grow the resource (its data shrinks by as much as its version grows) and a
    // delete are accepted.
    let reason = exhausted(log.write(sized("tiny", 1, "")));
    assert!(reason.contains("NOSPACE"), "{reason}");
    let (name, version) = versions.remove(0);
    let overwritten = log.put(sized(&name, 398, &version));
    versions.insert(0, (name.clone(), overwritten.version().to_string()));
    assert!(log
        .store
        .view()
        .read(&id(&format!("uid-{name}"), &name))
        .is_ok());

    // Deleting one resource leaves usage above the low-water mark (90 %): still raised.
    let (name, version) = versions.pop().unwrap();
    log.delete(id(&format!("uid-{name}"), &name), &version)
        .unwrap();
    let usage = log.store.view().usage().bytes;
    if usage > 9_000 {
        assert!(
            log.store.space().alarm_index.is_some(),
            "above the mark at {usage}"
        );
        let (name, version) = versions.pop().unwrap();
        log.delete(id(&format!("uid-{name}"), &name), &version)
            .unwrap();
    }
    assert!(log.store.view().usage().bytes <= 9_000);
    assert_eq!(
        log.store.space().alarm_index,
        None,
        "cleared at the low-water mark"
    );
    log.put(sized("after", 10, ""));
}

#[test]
fn disarm_clears_the_alarm_and_the_next_write_over_the_quota_raises_it_again() {
    let mut log = log_at_0_2(Limits::default());
    log.put(sized("a", 4_000, ""));
    // A quota 400 bytes above the usage: the usage is above its low-water mark.
    let usage = log.store.view().usage().bytes;
    let space = capacity(&mut log, CapacityAction::SetQuota(usage + 400));
    assert!(usage > space.low_water_bytes());
    exhausted(log.write(sized("b", 1_000, "")));
    assert!(log.store.space().alarm_index.is_some());
    let space = capacity(&mut log, CapacityAction::DisarmAlarm);
    assert_eq!(space.alarm_index, None);
    log.put(sized("small", 10, ""));
    exhausted(log.write(sized("c", 1_000, "")));
    assert!(log.store.space().alarm_index.is_some(), "raised again");
}

#[test]
fn a_write_that_does_not_fit_below_the_low_water_mark_raises_no_alarm() {
    let mut log = log_at_0_2(Limits::default());
    capacity(&mut log, CapacityAction::SetQuota(10_000));
    log.put(sized("a", 1_000, ""));
    exhausted(log.write(sized("huge", 20_000, "")));
    assert_eq!(
        log.store.space().alarm_index,
        None,
        "room is left: no alarm"
    );
    log.put(sized("b", 1_000, ""));
}

#[test]
fn a_raise_proposed_before_the_limit_holds_only_above_the_low_water_mark() {
    let mut log = log_at_0_2(Limits::default());
    capacity(&mut log, CapacityAction::SetQuota(100_000));
    log.put(sized("a", 1_000, ""));
    let space = capacity(&mut log, CapacityAction::RaiseAlarm);
    assert_eq!(
        space.alarm_index, None,
        "far below the quota a raise clears at once"
    );
}

#[test]
fn at_cluster_version_0_1_no_capacity_rule_applies_and_the_command_is_refused() {
    let mut log = Log::new();
    let refused = apply(
        &mut log,
        Command::Capacity {
            action: CapacityAction::SetQuota(1),
        },
    );
    assert!(
        matches!(refused, Err(FsmError::FailedPrecondition(_))),
        "{refused:?}"
    );
    // A quota-shaped resource is an ordinary resource to a 0.1 cluster.
    let mut quota = quota_resource("q", "default", "default", &[("count", 0)]);
    quota.data = None;
    log.put(quota);
    log.put(sized("a", 100_000, ""));
}

fn quota_resource(name: &str, partition: &str, namespace: &str, hard: &[(&str, u64)]) -> Resource {
    let spec = QuotaSpec {
        hard: hard.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
    };
    Resource {
        id: Some(full_id(
            &format!("uid-{name}"),
            name,
            ty(QUOTA_GROUP, QUOTA_GROUP_VERSION, QUOTA_KIND),
            tenancy(partition, namespace),
        )),
        data: Some(Any {
            type_url: QUOTA_TYPE_URL.into(),
            value: Bytes::from(spec.encode_to_vec()),
        }),
        ..Default::default()
    }
}

#[test]
fn a_tenant_quota_limits_its_tenancy_and_type_only() {
    let mut log = log_at_0_2(Limits::default());
    log.put(quota_resource(
        "team-a",
        "default",
        "default",
        &[("count/catalog.Service", 2)],
    ));
    log.put(sized("one", 10, ""));
    let two = log.put(sized("two", 10, ""));
    let refused = log.write(sized("three", 10, ""));
    match &refused {
        Err(FsmError::ResourceExhausted { limit, value, .. }) => {
            assert_eq!(limit, "quota team-a count/catalog.Service");
            assert_eq!(*value, 2);
        }
        other => panic!("{other:?}"),
    }
    // An update of a counted resource passes; another tenancy and another type are free.
    log.put(sized("two", 20, two.version()));
    let mut elsewhere = sized("three", 10, "");
    elsewhere.id.as_mut().unwrap().tenancy = Some(tenancy("default", "other"));
    log.put(elsewhere);
    let mut other_type = sized("three", 10, "");
    other_type.id.as_mut().unwrap().r#type = Some(ty("catalog", "v1", "Node"));
    log.put(other_type);
    // The tenant quota did not raise the cluster's alarm.
    assert_eq!(log.store.space().alarm_index, None);
}

#[test]
fn a_malformed_quota_is_refused_naming_the_field() {
    let mut log = log_at_0_2(Limits::default());
    let bad = quota_resource("q", "default", "default", &[("pods", 3)]);
    match log.write(bad) {
        Err(FsmError::InvalidArgument { field, reason }) => {
            assert!(field.contains("hard"), "{field}");
            assert!(reason.contains("pods"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    let mut no_data = quota_resource("q", "default", "default", &[]);
    no_data.data = None;
    assert!(matches!(
        log.write(no_data),
        Err(FsmError::InvalidArgument { .. })
    ));
}

#[test]
fn the_check_before_proposing_agrees_with_apply() {
    let mut log = log_at_0_2(Limits::default());
    capacity(&mut log, CapacityAction::SetQuota(5_000));
    log.put(sized("a", 3_000, ""));
    let fits = Command::Write {
        resource: sized("b", 500, ""),
    };
    let too_big = Command::Write {
        resource: sized("c", 3_000, ""),
    };
    assert!(log.store.check_capacity(&fits).is_ok());
    assert!(matches!(
        log.store.check_capacity(&too_big),
        Err(FsmError::ResourceExhausted { .. })
    ));
    assert!(log
        .store
        .check_capacity(&Command::Delete {
            id: id("uid-a", "a"),
            version: "1".into(),
            now_ms: 0,
            orphan: false,
        })
        .is_ok());
}

#[test]
fn the_history_holds_at_most_its_bytes_of_older_images() {
    let limits = Limits {
        history_bytes_max: 10_000,
        ..Limits::default()
    };
    let mut log = Log::with_limits(limits);
    let mut version = String::new();
    for _ in 0..100 {
        version = log
            .put(sized("churn", 1_000, &version))
            .version()
            .to_string();
    }
    assert!(
        log.store.history_bytes() <= 10_000,
        "{}",
        log.store.history_bytes()
    );
    assert!(
        log.store.history_bytes() >= 9_000,
        "{}",
        log.store.history_bytes()
    );
    // The newest changes are still served.
    assert!(log.store.view_at(log.index - 5).is_ok());
    assert!(
        log.store.view_at(2).is_err(),
        "old revisions were compacted"
    );
}

/// One step of a random log.
#[derive(Clone, Debug)]
enum Step {
    Write { name: u8, size: u16 },
    Delete { name: u8 },
    Quota(u32),
    Raise,
    Disarm,
    TenantQuota { count: u8 },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => (0u8..12, 0u16..3000).prop_map(|(name, size)| Step::Write { name, size }),
        3 => (0u8..12).prop_map(|name| Step::Delete { name }),
        1 => (0u32..40_000).prop_map(Step::Quota),
        1 => Just(Step::Raise),
        1 => Just(Step::Disarm),
        1 => (0u8..8).prop_map(|count| Step::TenantQuota { count }),
    ]
}

/// The command a step proposes, given the versions stored so far (what a client read).
fn command_of(step: &Step, store: &Store) -> Command {
    let stored = |name: &str| {
        store
            .view()
            .read(&id(&format!("uid-{name}"), name))
            .map(|r| r.version().to_string())
            .unwrap_or_default()
    };
    match step {
        Step::Write { name, size } => {
            let name = format!("r{name}");
            Command::Write {
                resource: sized(&name, *size as usize, &stored(&name)),
            }
        }
        Step::Delete { name } => {
            let name = format!("r{name}");
            Command::Delete {
                id: id(&format!("uid-{name}"), &name),
                version: stored(&name),
                now_ms: 0,
                orphan: false,
            }
        }
        Step::Quota(bytes) => Command::Capacity {
            action: CapacityAction::SetQuota(*bytes as u64),
        },
        Step::Raise => Command::Capacity {
            action: CapacityAction::RaiseAlarm,
        },
        Step::Disarm => Command::Capacity {
            action: CapacityAction::DisarmAlarm,
        },
        Step::TenantQuota { count } => {
            let mut quota = quota_resource("q", "default", "default", &[("count", *count as u64)]);
            quota.version = store
                .view()
                .read(quota.id.as_ref().unwrap())
                .map(|r| r.version().to_string())
                .unwrap_or_default();
            Command::Write { resource: quota }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Two replicas configured differently (history bounds) apply the same log: every
    /// outcome, the usage and the space state agree after every entry, and usage never
    /// passes a quota that was set before the write.
    #[test]
    fn every_replica_reaches_the_same_decision_for_the_same_log(steps in prop::collection::vec(step(), 1..120)) {
        let mut a = log_at_0_2(Limits::default());
        let mut b = log_at_0_2(Limits { history_changes_max: 3, history_bytes_max: 2_000, ..Limits::default() });
        for step in &steps {
            let command = command_of(step, &a.store);
            let quota_before = a.store.space().quota_bytes;
            let usage_before = a.store.view().usage().bytes;
            let ra = apply(&mut a, command.clone());
            let rb = apply(&mut b, command);
            prop_assert_eq!(&ra, &rb);
            prop_assert_eq!(a.store.space(), b.store.space());
            prop_assert_eq!(a.store.view().usage(), b.store.view().usage());
            let usage = a.store.view().usage().bytes;
            if quota_before > 0 && usage > usage_before {
                prop_assert!(usage <= quota_before, "usage {} passed the quota {}", usage, quota_before);
            }
        }
        // Usage is what the table holds, recounted from scratch.
        let recount: u64 = a.store.view().iter().map(|r| {
            let id = r.resource().id.unwrap();
            let key_len = [id.r#type.as_ref().unwrap().group.len(), id.r#type.as_ref().unwrap().kind.len(),
                id.tenancy.as_ref().unwrap().partition.len(), id.tenancy.as_ref().unwrap().namespace.len(),
                id.name.len()].iter().sum::<usize>() + 4;
            r.accounted_bytes(key_len)
        }).sum();
        prop_assert_eq!(a.store.view().usage().bytes, recount);
    }
}
