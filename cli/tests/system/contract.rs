//! The storage contract (docs/contract.md sections 2–3), black-box over
//! plain gRPC against a running 3-node cluster: the checks of
//! `api_contract` (the same ones the remote `Client` and the in-process
//! client pass, in `in_process.rs`) through [`RawGrpc`], one call per
//! request to one node with no retry or failover, once against the leader
//! and once against each follower. Then what only the wire can ask: reads,
//! lists and watches at a compacted revision, and writes acknowledged by one
//! node seen at once by strong requests on another.
//!
//! The rules run twice, on two clusters: one plaintext without grants, and
//! one serving TLS on both ports with `[[auth.grants]]`, reached over TLS
//! with a token that may read and write everything (a client certificate
//! from `cairn tls init` too, but the token decides). Both runs make their
//! channels with the client library's `Access`; nothing else differs.
//!
//! On a follower, strong checks must pass at once (writes, deletes, strong
//! reads and strong lists are forwarded to the leader or confirmed through
//! its read index); eventual checks (eventual reads and lists, ListByOwner,
//! watches) may retry for a few seconds, as the follower's replica may lag.
//! Each run uses its own group, so runs never see each other's resources.

use crate::api_contract;
use crate::support;

use std::path::Path;
use std::time::{Duration, Instant};

use api_contract::raw::RawGrpc;
use api_contract::{eventually, tenancy, version_number, Target};
use cairn_client::{Access, BearerToken, ClientError};
use cairn_proto::v1::*;
use support::{client_tls, new_token, options, tls_args, tls_init, Cluster, ClusterOptions};

const LEADER_TIMEOUT: Duration = Duration::from_secs(20);
/// Changes the cluster keeps for past reads and watch replays.
const HISTORY_CHANGES_MAX: usize = 200;

fn contract_options() -> ClusterOptions {
    let mut options = options(3);
    options.extra_args = vec![
        "--history-changes-max".into(),
        HISTORY_CHANGES_MAX.to_string(),
    ];
    options
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_contract_holds_against_the_leader_and_each_follower() {
    // A plaintext cluster without grants, reached without credentials.
    let cluster = Cluster::start(contract_options());
    check_the_contract(&cluster, &Access::plaintext()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_contract_holds_over_tls_with_a_token() {
    // The same rules against a cluster serving TLS on both ports, whose
    // config holds grants: the contract's token may read and write every
    // type in every tenancy (and nothing else: admin calls of the harness
    // use another token). Every call goes over TLS and carries the token.
    let scratch = tempfile::tempdir().unwrap();
    let certs = scratch.path().join("tls");
    tls_init(&certs, &[]);
    let tls = client_tls(&certs);
    let (config, admin_token, token) = grants_config(scratch.path());

    let mut options = contract_options();
    options
        .extra_args
        .extend(["--config".to_string(), config.display().to_string()]);
    options.extra_args.extend(tls_args(&certs));
    options.client_tls = Some(tls.clone());
    options.admin_token = Some(admin_token);
    let cluster = Cluster::start(options);

    let access = Access::from_options(Some(&tls))
        .unwrap()
        .with_token(Some(&token));
    cluster.wait_for_leader(LEADER_TIMEOUT).await;
    // The control: without the token, the same access is refused.
    let anonymous = RawGrpc::new(
        &Access::from_options(Some(&tls)).unwrap(),
        &cluster.node(1).client_address,
    );
    let control = Target {
        api: &anonymous,
        label: "control".into(),
        group: "control".into(),
    };
    let refused = control.strong(control.id("Read", "r", "")).await;
    assert!(
        matches!(refused, Err(ClientError::Unauthenticated(_))),
        "{refused:?}"
    );
    check_the_contract(&cluster, &access).await;
    let log = cluster.log_of(1);
    assert!(
        log.contains("serving TLS on the client port")
            && log.contains("the client port requires a bearer token"),
        "node 1 serves TLS and requires credentials; logs in {}",
        cluster.root().display()
    );
}

/// Writes a config with an admin token (the harness's and the nodes') and
/// a token with read and write on everything; returns the config's path,
/// the admin token and the contract's token.
fn grants_config(dir: &Path) -> (std::path::PathBuf, String, BearerToken) {
    let (admin, admin_hash) = new_token();
    let (everything, everything_hash) = new_token();
    let node_token = dir.join("node.token");
    std::fs::write(&node_token, &admin).unwrap();
    let path = dir.join("grants.toml");
    std::fs::write(
        &path,
        format!(
            r#"[auth]
node_token_file = "{}"

[[auth.grants]]
name = "operators"
{admin_hash}
admin = true

[[auth.grants]]
name = "contract"
{everything_hash}
write = {{ types = ["*"], tenancies = ["*"] }}
"#,
            node_token.display()
        ),
    )
    .unwrap();
    (path, admin, BearerToken::new(everything).unwrap())
}

/// The whole contract, through the leader, then through each follower (in
/// its own group), every channel made by `access`.
async fn check_the_contract(cluster: &Cluster, access: &Access) {
    let leader = cluster.wait_for_leader(LEADER_TIMEOUT).await;
    let mut targets = vec![(leader, "leader")];
    targets.extend(
        cluster
            .ids_except(leader)
            .into_iter()
            .map(|id| (id, "follower")),
    );
    for (run, (node, role)) in targets.into_iter().enumerate() {
        let raw = RawGrpc::new(access, &cluster.node(node).client_address);
        let t = Target {
            api: &raw,
            label: format!("node {node} ({role})"),
            group: format!("contract{run}"),
        };
        let others: Vec<RawGrpc> = cluster
            .ids_except(node)
            .into_iter()
            .map(|id| RawGrpc::new(access, &cluster.node(id).client_address))
            .collect();
        println!("contract run {run}: {}", t.label);
        let started = Instant::now();
        api_contract::check_the_contract(&t).await;
        strong_requests_see_every_acknowledged_write(&t, &others).await;
        compacted_history(&t, &raw).await;
        println!(
            "contract run {run}: {} passed in {:?}",
            t.label,
            started.elapsed()
        );
    }
}

async fn strong_requests_see_every_acknowledged_write(t: &Target<'_>, others: &[RawGrpc]) {
    // A write acknowledged by any node is seen at once by strong reads and
    // lists on this node, and the other way round.
    for (i, other) in others.iter().enumerate() {
        let via_other = Target {
            api: other,
            label: format!("{} via another node", t.label),
            group: t.group.clone(),
        };
        let name = format!("x{i}");
        let w = via_other.put(t.res("Strong", &name, "u1", "", b"x")).await;
        assert_eq!(t.strong(t.id("Strong", &name, "")).await.unwrap(), w);
        let listed = t
            .api
            .list(t.list_request("Strong", tenancy("*", "*"), &name, Consistency::Strong))
            .await
            .unwrap();
        assert_eq!(listed.resources, vec![w]);
        let mine = format!("y{i}");
        let m = t.put(t.res("Strong", &mine, "u1", "", b"x")).await;
        assert_eq!(
            via_other.strong(t.id("Strong", &mine, "")).await.unwrap(),
            m
        );
    }
}

async fn compacted_history(t: &Target<'_>, raw: &RawGrpc) {
    // (beyond) Once more changes than the retained history happened, reads,
    // lists and watches at an older revision fail with Compacted, naming the
    // oldest retained revision.
    let first = t.put(t.res("Compact", "c", "u1", "", b"0")).await;
    let writers = (0..8).map(|worker| async move {
        for i in 0..(HISTORY_CHANGES_MAX / 8 + 2) {
            t.put(t.res("Compact", &format!("f{worker}-{i}"), "u1", "", b"x"))
                .await;
        }
    });
    futures::future::join_all(writers).await;
    let old = version_number(&first);
    let strong = raw
        .read_request(ReadRequest {
            id: Some(t.id("Compact", "c", "")),
            consistency: Consistency::Strong as i32,
            revision: old,
        })
        .await;
    match strong {
        Err(ClientError::Compacted {
            oldest_retained_revision,
        }) => assert!(oldest_retained_revision > old),
        other => panic!("{}: expected Compacted, got {other:?}", t.label),
    }
    let listed = raw
        .list_request(ListRequest {
            revision: old,
            ..t.list_request(
                "Compact",
                tenancy("default", "default"),
                "",
                Consistency::Strong,
            )
        })
        .await;
    assert!(
        matches!(listed, Err(ClientError::Compacted { .. })),
        "{}: {listed:?}",
        t.label
    );
    eventually("a watch from a compacted revision", || async {
        let request = WatchListRequest {
            r#type: Some(t.ty("Compact")),
            tenancy: Some(tenancy("*", "*")),
            start_revision: old,
            ..Default::default()
        };
        match raw.watch_request(request).await {
            Err(ClientError::Compacted { .. }) => Ok(()),
            Ok(_) => Err("opened".to_string()),
            Err(e) => Err(e.to_string()),
        }
    })
    .await;
}
