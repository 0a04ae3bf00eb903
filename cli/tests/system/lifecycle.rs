//! The lifecycle through the `cairn` binary against a real cluster: `-l` selectors on
//! `list`, a delete that only marks a resource with finalizers (and what it prints), the
//! collection of what a deleted owner owned, and `delete --orphan`.

use crate::client_support;

use std::time::Duration;

use client_support::*;
use serde_json::Value;

fn json(run: &Run) -> Value {
    serde_json::from_str(&run.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {run:?}"))
}

const T: &str = "demo.v1.Thing";

async fn write(e: &str, name: &str, extra: &[&str]) -> Value {
    let mut args = vec![
        "write",
        "--type",
        T,
        "--name",
        name,
        "--data-json",
        "{}",
        "-o",
        "json",
    ];
    args.extend(extra);
    let run = cairn_at(e, &args).await;
    assert_eq!(run.code, 0, "{run:?}");
    json(&run)
}

fn uid(v: &Value) -> String {
    v["id"]["uid"].as_str().expect("uid").to_string()
}

async fn names(e: &str, args: &[&str]) -> Vec<String> {
    let mut all = vec!["list", "--type", "demo.Thing", "-o", "json"];
    all.extend(args);
    let run = cairn_at(e, &all).await;
    assert_eq!(run.code, 0, "{run:?}");
    let mut names: Vec<String> = json(&run)["resources"]
        .as_array()
        .expect("resources")
        .iter()
        .map(|r| r["id"]["name"].as_str().unwrap().to_string())
        .collect();
    names.sort();
    names
}

/// Waits until `cairn list` (strong) shows exactly `want`.
async fn until_listed(e: &str, want: &[&str]) {
    let want: Vec<String> = want.iter().map(|s| s.to_string()).collect();
    let listed = eventually(Duration::from_secs(10), || {
        let want = want.clone();
        async move { names(e, &["--consistency", "strong"]).await == want }
    })
    .await;
    assert!(listed, "never listed exactly {want:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn selectors_finalizers_owners_and_orphans_through_the_binary() {
    let cluster = Cluster::start(options(3));
    cluster.wait_for_leader(LEADER_TIMEOUT).await;
    let endpoints = cluster.endpoints().join(",");
    let e = endpoints.as_str();
    wait_cluster_version_0_2(e, &[]).await;

    // -l: only what matches; a bad selector is a usage error naming the field.
    write(e, "a", &["--metadata", "app=web", "--metadata", "env=prod"]).await;
    write(e, "b", &["--metadata", "app=api"]).await;
    assert_eq!(names(e, &["-l", "app=web"]).await, ["a"]);
    assert_eq!(names(e, &["-l", "app in (web,api),env!=prod"]).await, ["b"]);
    let bad = cairn_at(e, &["list", "--type", "demo.Thing", "-l", "app in web"]).await;
    assert_ne!(bad.code, 0);
    assert!(bad.stderr.contains("selector"), "{bad:?}");

    // A resource with finalizers is only marked by a delete.
    write(e, "held", &["--metadata", "finalizers=example.com/cleanup"]).await;
    let run = cairn_at(e, &["delete", "--type", T, "--name", "held"]).await;
    assert_eq!(run.code, 0, "{run:?}");
    assert!(run.stdout.contains("marked for deletion"), "{run:?}");
    let read = cairn_at(e, &["read", "--type", T, "--name", "held", "-o", "json"]).await;
    assert!(
        json(&read)["metadata"]["deletionTimestamp"].is_string(),
        "{read:?}"
    );

    // Deleting an owner deletes what it owned; with --orphan it keeps them.
    let owner = write(e, "owner", &[]).await;
    let owner_ref = format!("{T}/owner/{}", uid(&owner));
    write(e, "child", &["--owner", &owner_ref]).await;
    let kept_owner = write(e, "kept-owner", &[]).await;
    let kept_ref = format!("{T}/kept-owner/{}", uid(&kept_owner));
    write(e, "kept-child", &["--owner", &kept_ref]).await;
    let run = cairn_at(e, &["delete", "--type", T, "--name", "owner"]).await;
    assert_eq!(run.code, 0, "{run:?}");
    let run = cairn_at(
        e,
        &["delete", "--type", T, "--name", "kept-owner", "--orphan"],
    )
    .await;
    assert_eq!(run.code, 0, "{run:?}");
    until_listed(e, &["a", "b", "held", "kept-child"]).await;
    let child = cairn_at(
        e,
        &["read", "--type", T, "--name", "kept-child", "-o", "json"],
    )
    .await;
    assert!(json(&child)["owner"].is_null(), "orphaned: {child:?}");
}
