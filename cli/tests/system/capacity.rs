//! Capacity as a user and an operator meet it, with real processes on a three-node cluster
//! whose nodes ask for a small space quota (`--data-bytes-max`):
//! - the leader sets the cluster's quota to what the members ask for;
//! - a writer that keeps writing is refused RESOURCE_EXHAUSTED naming the quota, the usage
//!   and the write's size, and the NOSPACE alarm is raised on every member (`cairn status`,
//!   `cairn alarm list`); reads, watches and deletes go on; a small new write is refused;
//! - deleting brings usage under the low-water mark, the alarm clears on every member and
//!   writes are accepted again, with no restart;
//! - `cairn alarm disarm` clears a raised alarm;
//! - a tenant quota (`cairn quota set`) refuses a write over it, naming the quota, and
//!   `cairn quota list` shows it.

use crate::client_support;

use std::time::Duration;

use cairn_client::ClientError;
use cairn_proto::v1::{Consistency, WatchListRequest};
use client_support::{
    cairn_at, client_for, default_tenancy, eventually, new_token, thing, unversioned, Cluster,
    ClusterOptions, LEADER_TIMEOUT,
};
use serde_json::Value;

/// What every node asks for: 2 MiB.
const QUOTA_BYTES: u64 = 2 * 1024 * 1024;

fn binary() -> String {
    env!("CARGO_BIN_EXE_cairn").into()
}

async fn status(endpoints: &str) -> Value {
    let run = cairn_at(endpoints, &["status", "-o", "json"]).await;
    assert_eq!(run.code, 0, "{run:?}");
    serde_json::from_str(&run.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {run:?}"))
}

/// The names of the alarms each member reports, in member order.
async fn alarms_per_member(endpoints: &str) -> Vec<Vec<String>> {
    let s = status(endpoints).await;
    s["members"]
        .as_array()
        .expect("members")
        .iter()
        .map(|m| {
            m["alarms"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .map(|x| x["name"].as_str().unwrap_or("").to_string())
                        .collect()
                })
                .unwrap_or_default()
        })
        .collect()
}

/// Waits until the cluster runs at cluster version 0.2, where the capacity rules hold (a
/// new cluster rises to it by itself within seconds). `extra` goes to `cairn status`.
async fn wait_capacity_rules(endpoints: &str, extra: &[&str]) {
    client_support::wait_cluster_version_0_2(endpoints, extra).await;
}

/// A 64 KiB payload, as JSON.
fn payload() -> String {
    format!(r#"{{"fill": "{}"}}"#, "x".repeat(64 * 1024))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_cluster_refuses_growth_raises_nospace_everywhere_and_recovers_when_room_is_made() {
    let mut options = ClusterOptions::new(binary(), 3);
    options.extra_args = vec!["--data-bytes-max".into(), QUOTA_BYTES.to_string()];
    let mut cluster = Cluster::start(options);
    cluster.wait_for_leader(LEADER_TIMEOUT).await;
    let endpoints = cluster.endpoints().join(",");
    assert!(
        eventually(Duration::from_secs(20), || async {
            let s = status(&endpoints).await;
            s["members"].as_array().is_some_and(|m| {
                m.iter()
                    .all(|m| m["data_bytes_quota"].as_u64() == Some(QUOTA_BYTES))
            })
        })
        .await,
        "every member applies the quota its members ask for: {}",
        status(&endpoints).await
    );

    // A runaway writer: every write is acknowledged until the quota refuses one.
    let client = client_for(&cluster.endpoints()).await;
    let mut written = Vec::new();
    let refusal = loop {
        let name = format!("r{}", written.len());
        match client.create(thing("Blob", &name, &payload())).await {
            Ok(stored) => written.push(stored),
            Err(e) => break e,
        }
        assert!(
            written.len() < 100,
            "2 MiB hold fewer than 100 resources of 64 KiB"
        );
    };
    let message = refusal.to_string();
    assert!(
        matches!(refusal, ClientError::ResourceExhausted { .. }),
        "refused RESOURCE_EXHAUSTED: {refusal:?}"
    );
    assert!(
        message.contains("data_bytes_max") && message.contains(&QUOTA_BYTES.to_string()),
        "the refusal names the quota: {message}"
    );
    assert!(written.len() >= 25, "{} writes fit in 2 MiB", written.len());

    // NOSPACE on every member, in status and in `cairn alarm list`.
    assert!(
        eventually(Duration::from_secs(10), || async {
            alarms_per_member(&endpoints)
                .await
                .iter()
                .all(|a| a == &["NOSPACE"])
        })
        .await,
        "NOSPACE on every member: {:?}",
        alarms_per_member(&endpoints).await
    );
    let listed = cairn_at(&endpoints, &["alarm", "list"]).await;
    assert_eq!(listed.code, 0, "{listed:?}");
    assert!(listed.stdout.contains("NOSPACE"), "{listed:?}");

    // Reads, watches and deletes go on; a small new write is refused.
    let first = written[0].id.clone().unwrap();
    let read = client.read(first.clone(), Consistency::Strong).await;
    assert!(read.is_ok(), "a read under NOSPACE: {read:?}");
    let mut watch = client
        .watch_list(WatchListRequest {
            r#type: Some(unversioned("Blob")),
            tenancy: Some(default_tenancy()),
            ..Default::default()
        })
        .await
        .expect("a watch under NOSPACE");
    let event = tokio::time::timeout(Duration::from_secs(10), watch.next()).await;
    assert!(
        matches!(event, Ok(Some(Ok(_)))),
        "the watch's snapshot flows: {event:?}"
    );
    let tiny = client.create(thing("Blob", "tiny", "{}")).await;
    assert!(
        matches!(tiny, Err(ClientError::ResourceExhausted { .. })),
        "a small write under NOSPACE: {tiny:?}"
    );

    // Deleting a fifth of the data takes usage under the low-water mark (90 %): the alarm
    // clears on every member and writes are accepted again, with no restart.
    for stored in written.drain(..written.len() / 5 + 1) {
        client
            .delete(stored.id.clone().unwrap(), stored.version.clone())
            .await
            .expect("a delete under NOSPACE");
    }
    assert!(
        eventually(Duration::from_secs(10), || async {
            alarms_per_member(&endpoints)
                .await
                .iter()
                .all(Vec::is_empty)
        })
        .await,
        "the alarm clears on every member: {:?}",
        alarms_per_member(&endpoints).await
    );
    client
        .create(thing("Blob", "after", &payload()))
        .await
        .expect("a write once room was made");

    // Fill up again, then disarm by hand: the alarm is gone until the next refusal.
    loop {
        let name = format!("again{}", written.len());
        match client.create(thing("Blob", &name, &payload())).await {
            Ok(stored) => written.push(stored),
            Err(ClientError::ResourceExhausted { .. }) => break,
            Err(e) => panic!("{e:?}"),
        }
    }
    assert!(
        eventually(Duration::from_secs(10), || async {
            alarms_per_member(&endpoints)
                .await
                .iter()
                .all(|a| a == &["NOSPACE"])
        })
        .await
    );
    let disarmed = cairn_at(&endpoints, &["alarm", "disarm"]).await;
    assert_eq!(disarmed.code, 0, "{disarmed:?}");
    assert!(
        eventually(Duration::from_secs(10), || async {
            alarms_per_member(&endpoints)
                .await
                .iter()
                .all(Vec::is_empty)
        })
        .await,
        "disarmed on every member"
    );
    // No node died on the way.
    for id in cluster.ids() {
        assert!(cluster.is_running(id), "node {id} is running");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_quota_refuses_a_write_over_it_and_names_itself() {
    let cluster = Cluster::start(ClusterOptions::new(binary(), 3));
    cluster.wait_for_leader(LEADER_TIMEOUT).await;
    let endpoints = cluster.endpoints().join(",");
    wait_capacity_rules(&endpoints, &[]).await;
    let set = cairn_at(
        &endpoints,
        &[
            "quota",
            "set",
            "team",
            "--tenancy",
            "default/default",
            "count/demo.Thing=2",
        ],
    )
    .await;
    assert_eq!(set.code, 0, "{set:?}");
    let bad = cairn_at(&endpoints, &["quota", "set", "bad", "pods=2"]).await;
    assert_eq!(bad.code, 2, "a malformed limit is a usage error: {bad:?}");
    assert!(bad.stderr.contains("pods"), "{bad:?}");

    let write = |name: &'static str| {
        let endpoints = endpoints.clone();
        async move {
            cairn_at(
                &endpoints,
                &[
                    "write",
                    "--type",
                    "demo.v1.Thing",
                    "--name",
                    name,
                    "--data-json",
                    "{}",
                ],
            )
            .await
        }
    };
    assert_eq!(write("a").await.code, 0);
    assert_eq!(write("b").await.code, 0);
    let third = write("c").await;
    assert_eq!(third.code, 1, "{third:?}");
    assert!(
        third.stderr.contains("team") && third.stderr.contains("count/demo.Thing"),
        "the refusal names the quota and the limit: {third:?}"
    );
    // Another type in the same tenancy is not limited.
    let other = cairn_at(
        &endpoints,
        &[
            "write",
            "--type",
            "demo.v1.Other",
            "--name",
            "c",
            "--data-json",
            "{}",
        ],
    )
    .await;
    assert_eq!(other.code, 0, "{other:?}");

    let listed = cairn_at(&endpoints, &["quota", "list", "-o", "json"]).await;
    assert_eq!(listed.code, 0, "{listed:?}");
    let rows: Value = serde_json::from_str(&listed.stdout).unwrap();
    assert_eq!(rows[0]["name"], "team", "{rows}");
    assert_eq!(rows[0]["limit"], "count/demo.Thing", "{rows}");
    assert_eq!(rows[0]["value"], 2, "{rows}");

    // Raising the quota lets the write through.
    let raised = cairn_at(&endpoints, &["quota", "set", "team", "count/demo.Thing=3"]).await;
    assert_eq!(raised.code, 0, "{raised:?}");
    assert_eq!(write("c").await.code, 0);
    let deleted = cairn_at(&endpoints, &["quota", "delete", "team"]).await;
    assert_eq!(deleted.code, 0, "{deleted:?}");
    assert_eq!(write("d").await.code, 0, "no quota: no limit");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_grants_quotas_are_set_by_who_may_write_them_and_bind_every_tenant_writer() {
    let dir = tempfile::tempdir().unwrap();
    let (admin, admin_hash) = new_token().await;
    let (tenant, tenant_hash) = new_token().await;
    let (quotas, quotas_hash) = new_token().await;
    let node_token = dir.path().join("node.token");
    std::fs::write(&node_token, &admin).unwrap();
    let config = dir.path().join("node.toml");
    std::fs::write(
        &config,
        format!(
            "[auth]\nnode_token_file = \"{}\"\n\n\
             [[auth.grants]]\nname = \"harness\"\n{admin_hash}\nadmin = true\n\n\
             [[auth.grants]]\nname = \"tenant\"\n{tenant_hash}\n\
             write = {{ types = [\"demo.*\"], tenancies = [\"default/*\"] }}\n\n\
             [[auth.grants]]\nname = \"quota-keeper\"\n{quotas_hash}\n\
             write = {{ types = [\"cairn.Quota\"], tenancies = [\"*\"] }}\n",
            node_token.display()
        ),
    )
    .unwrap();
    let mut options = ClusterOptions::new(binary(), 3);
    options.extra_args = vec!["--config".into(), config.display().to_string()];
    options.admin_token = Some(admin.clone());
    let cluster = Cluster::start(options);
    cluster.wait_for_leader(LEADER_TIMEOUT).await;
    let endpoints = cluster.endpoints().join(",");
    let as_ = |token: &str, args: &[&str]| {
        let mut all: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        all.extend(["--token".into(), token.into()]);
        let endpoints = endpoints.clone();
        async move {
            let all: Vec<&str> = all.iter().map(String::as_str).collect();
            cairn_at(&endpoints, &all).await
        }
    };
    // A tenant writer may not set its own quota.
    let denied = as_(&tenant, &["quota", "set", "mine", "count=1000"]).await;
    assert_eq!(denied.code, 6, "PERMISSION_DENIED: {denied:?}");
    // The quota keeper may.
    wait_capacity_rules(&endpoints, &["--token", &admin]).await;
    let set = as_(&quotas, &["quota", "set", "team", "count/demo.Thing=1"]).await;
    assert_eq!(set.code, 0, "{set:?}");
    let write = |name: &'static str| {
        as_(
            &tenant,
            &[
                "write",
                "--type",
                "demo.v1.Thing",
                "--name",
                name,
                "--data-json",
                "{}",
            ],
        )
    };
    assert_eq!(write("a").await.code, 0);
    let over = write("b").await;
    assert_eq!(over.code, 1, "{over:?}");
    assert!(
        over.stderr.contains("\"team\""),
        "names the quota: {over:?}"
    );
}
