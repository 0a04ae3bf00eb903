//! Forwarding across a leader failure, with real `cairn` processes: a
//! follower forwards a steady stream of compare-and-set writes while the
//! leader is killed and another is elected.

use crate::support;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cairn_proto::error::ApiError;
use cairn_proto::v1::*;
use support::*;

const LEADER_TIMEOUT: Duration = Duration::from_secs(20);
/// Writes acknowledged before the kill, and again after the election.
const ACKS_PER_PHASE: u64 = 50;

/// Waits (at most 30 s) until `count` reaches `target`.
async fn wait_for_acks(count: &AtomicU64, target: u64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while count.load(Ordering::Relaxed) < target {
        assert!(
            Instant::now() < deadline,
            "only {} of {target} writes acknowledged within 30 s",
            count.load(Ordering::Relaxed)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// What the client saw for one attempted write of sequence number `seq`.
#[derive(Debug)]
enum Seen {
    Acknowledged {
        version: String,
    },
    /// A contract verdict: the write certainly did not apply.
    Refused(ApiError),
    /// Inconsistent: the outcome is unknown.
    Unknown(ApiError),
}

fn sequence_of(r: &Resource) -> u64 {
    let bytes = r.data.as_ref().expect("data").value.as_ref();
    u64::from_be_bytes(bytes.try_into().expect("an 8-byte sequence number"))
}

/// Strongly reads the counter through `address` until it answers (bounded).
async fn current_version(address: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match read(address, "counter", Consistency::Strong).await {
            Ok(r) => return r.version,
            Err(e) => {
                assert!(
                    matches!(e, ApiError::Unavailable(_) | ApiError::Inconsistent(_)),
                    "a strong read failed with a kind outside the contract: {e:?}"
                );
                assert!(Instant::now() < deadline, "no strong read for 30 s: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cas_writes_forwarded_by_a_follower_survive_the_leader_being_killed() {
    // A follower forwards CAS updates of one key (each carrying a sequence
    // number) while the leader is killed with SIGKILL and another elected.
    // Then the key's full history, replayed by a watch, must hold every
    // acknowledged write exactly once at its version, no sequence number
    // twice, no refused or Unavailable write at all; every failure the client
    // saw is a contract kind.
    let mut cluster = Cluster::start(options(3));
    let leader = cluster.wait_for_leader(LEADER_TIMEOUT).await;
    let follower = cluster
        .ids()
        .into_iter()
        .find(|id| *id != leader)
        .expect("a follower");
    let address = cluster.node(follower).client_address.clone();
    let created = write(&address, thing("counter", "u1", "", &0u64.to_be_bytes()))
        .await
        .expect("the counter is created through the follower");

    // Phases: 0 = before the kill, 1 = a new leader is elected, 2 = stop.
    let writer_address = address.clone();
    let (phase_tx, phase_rx) = tokio::sync::watch::channel(0u8);
    let created_version = created.version.clone();
    let acknowledged_count = Arc::new(AtomicU64::new(0));
    let acks = acknowledged_count.clone();
    let writer = tokio::spawn(async move {
        let mut c = client(&writer_address).await;
        // seq -> (phase when sent, what the client saw)
        let mut seen: BTreeMap<u64, (u8, Seen)> = BTreeMap::new();
        let mut version = created_version;
        let mut seq = 1u64;
        loop {
            let phase = *phase_rx.borrow();
            if phase == 2 {
                break;
            }
            let mut request = tonic::Request::new(WriteRequest {
                fence: None,
                resource: Some(thing("counter", "u1", &version, &seq.to_be_bytes())),
            });
            request.set_timeout(Duration::from_secs(3));
            match c.write(request).await {
                Ok(r) => {
                    let r = r.into_inner().resource.expect("a stored resource");
                    assert_eq!(sequence_of(&r), seq);
                    version = r.version.clone();
                    seen.insert(seq, (phase, Seen::Acknowledged { version: r.version }));
                    acks.fetch_add(1, Ordering::Relaxed);
                }
                Err(status) => {
                    assert!(
                        !status.details().is_empty(),
                        "seq {seq}: a raw transport error reached the client: {status:?}"
                    );
                    let e = ApiError::from_status(&status);
                    let outcome = match &e {
                        ApiError::Inconsistent(_) => Seen::Unknown(e),
                        ApiError::Unavailable(_) | ApiError::CasFailure(_) => Seen::Refused(e),
                        other => {
                            panic!("seq {seq}: a kind a forwarded write must not see: {other:?}")
                        }
                    };
                    seen.insert(seq, (phase, outcome));
                    // Learn where the key stands before the next CAS.
                    version = current_version(&writer_address).await;
                }
            }
            seq += 1;
        }
        seen
    });

    wait_for_acks(&acknowledged_count, ACKS_PER_PHASE).await;
    let killed_at = Instant::now();
    cluster.kill(leader);
    let survivors: Vec<u64> = cluster.ids_except(leader);
    let new_leader = cluster
        .wait_for_leader_among(&survivors, LEADER_TIMEOUT)
        .await;
    println!(
        "node {new_leader} leads {:?} after the kill of node {leader}",
        killed_at.elapsed()
    );
    phase_tx.send(1).expect("the writer runs");
    let at_election = acknowledged_count.load(Ordering::Relaxed);
    // One write sent before the election may be acknowledged after it.
    wait_for_acks(&acknowledged_count, at_election + ACKS_PER_PHASE + 1).await;
    phase_tx.send(2).expect("the writer runs");
    let seen = writer.await.expect("the writer finished");

    let acknowledged: BTreeMap<u64, String> = seen
        .iter()
        .filter_map(|(seq, (_, s))| match s {
            Seen::Acknowledged { version } => Some((*seq, version.clone())),
            _ => None,
        })
        .collect();
    let count = |phase: u8, f: fn(&Seen) -> bool| {
        seen.values().filter(|(p, s)| *p == phase && f(s)).count()
    };
    for phase in [0u8, 1] {
        println!(
            "phase {phase}: {} acknowledged, {} refused, {} unknown",
            count(phase, |s| matches!(s, Seen::Acknowledged { .. })),
            count(phase, |s| matches!(s, Seen::Refused(_))),
            count(phase, |s| matches!(s, Seen::Unknown(_))),
        );
    }
    for (seq, (phase, s)) in &seen {
        match s {
            Seen::Unknown(e) | Seen::Refused(e) => println!("seq {seq} (phase {phase}): {e}"),
            Seen::Acknowledged { .. } => {}
        }
    }
    assert!(
        count(0, |s| matches!(s, Seen::Acknowledged { .. })) >= ACKS_PER_PHASE as usize,
        "too few writes acknowledged before the kill"
    );
    assert!(
        count(1, |s| matches!(s, Seen::Acknowledged { .. })) >= ACKS_PER_PHASE as usize,
        "too few writes acknowledged through the follower after the election"
    );

    // The key's whole history, replayed by a watch through the follower.
    let final_version: u64 = current_version(&address).await.parse().unwrap();
    let mut c = client(&address).await;
    let mut stream = c
        .watch_list(WatchListRequest {
            r#type: Some(thing_type()),
            tenancy: Some(tenancy()),
            name_prefix: "counter".into(),
            start_revision: created.version.parse::<u64>().unwrap() - 1,
            ..Default::default()
        })
        .await
        .expect("a replay from the counter's creation")
        .into_inner();
    let mut history: BTreeMap<u64, u64> = BTreeMap::new(); // seq -> version
    loop {
        let event = tokio::time::timeout(Duration::from_secs(10), stream.message())
            .await
            .expect("the replay reaches the final version")
            .expect("the replay does not fail")
            .expect("the replay does not end");
        let Some(watch_event::Event::Upsert(u)) = event.event else {
            panic!("only upserts of the counter: {event:?}");
        };
        let r = u.resource.expect("a resource");
        let seq = sequence_of(&r);
        let version: u64 = r.version.parse().unwrap();
        assert!(
            history.insert(seq, version).is_none(),
            "sequence number {seq} applied twice"
        );
        if version == final_version {
            break;
        }
    }
    for (seq, version) in &acknowledged {
        assert_eq!(
            history.get(seq).map(|v| v.to_string()).as_ref(),
            Some(version),
            "acknowledged write {seq} lost or at another version"
        );
    }
    for (seq, (_, s)) in &seen {
        if let Seen::Refused(e) = s {
            assert!(
                !history.contains_key(seq),
                "write {seq} was reported refused ({e}) but applied"
            );
        }
    }
    for seq in history.keys() {
        assert!(
            *seq == 0 || seen.contains_key(seq),
            "history holds a write {seq} that was never sent"
        );
    }
}
