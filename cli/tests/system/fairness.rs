//! Fairness between clients, through the client API on real processes
//! (`docs/operations.md`, "Fairness"):
//! - with grants: a grant limited to 20 requests per second that fires 100 writes at once
//!   gets about its burst and what fits in the wait bound through, and the rest are refused
//!   RESOURCE_EXHAUSTED naming `requests_per_second`; another grant, without a limit, is
//!   served meanwhile without a refusal;
//! - without grants: the node's `client_requests_per_second_max` holds each connection to
//!   its rate, and a second connection is not held back by the first.

use crate::client_support;

use std::path::Path;
use std::time::{Duration, Instant};

use cairn_client::{BearerToken, Client, ClientError, ClientOptions};
use client_support::*;

async fn client_with(endpoints: &[String], token: Option<&str>) -> Client {
    let options = ClientOptions {
        token: token.map(|t| BearerToken::new(t).expect("a valid token")),
        // One attempt per call: a refusal must come back as it is.
        ..client_options()
    };
    Client::connect_with(endpoints, options)
        .await
        .expect("a client")
}

/// Fires `count` creates at once through `client`; returns (accepted, refused by `limit`).
async fn burst(client: &Client, prefix: &str, count: usize, limit: &str) -> (usize, usize) {
    let writes = (0..count).map(|i| {
        let client = client.clone();
        let name = format!("{prefix}-{i}");
        async move { client.create(thing("Thing", &name, "{}")).await }
    });
    let mut accepted = 0;
    let mut refused = 0;
    for result in futures::future::join_all(writes).await {
        match result {
            Ok(_) => accepted += 1,
            Err(ClientError::ResourceExhausted { limit: l, .. }) if l == limit => refused += 1,
            Err(e) => panic!("a write failed otherwise: {e:?}"),
        }
    }
    (accepted, refused)
}

fn write_config(dir: &Path, body: &str) -> String {
    let path = dir.join("node.toml");
    std::fs::write(&path, body).unwrap();
    path.display().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_over_its_rate_is_refused_and_another_grant_is_not_held_back() {
    let dir = tempfile::tempdir().unwrap();
    let (admin, admin_hash) = new_token().await;
    let (runaway, runaway_hash) = new_token().await;
    let (good, good_hash) = new_token().await;
    std::fs::write(dir.path().join("node.token"), &admin).unwrap();
    let config = write_config(
        dir.path(),
        &format!(
            "[auth]\nnode_token_file = \"{}\"\n\n\
             [[auth.grants]]\nname = \"harness\"\n{admin_hash}\nadmin = true\n\n\
             [[auth.grants]]\nname = \"runaway\"\n{runaway_hash}\n\
             write = {{ types = [\"demo.*\"], tenancies = [\"*\"] }}\nrequests_per_second = 20\n\n\
             [[auth.grants]]\nname = \"good\"\n{good_hash}\n\
             write = {{ types = [\"demo.*\"], tenancies = [\"*\"] }}\n",
            dir.path().join("node.token").display()
        ),
    );
    let mut options = options(3);
    options.extra_args = vec!["--config".into(), config];
    options.admin_token = Some(admin.clone());
    let cluster = Cluster::start(options);
    let leader = cluster.wait_for_leader(LEADER_TIMEOUT).await;
    let at_leader = vec![cluster.node(leader).client_address.clone()];
    let runaway = client_with(&at_leader, Some(&runaway)).await;
    let good = client_with(&at_leader, Some(&good)).await;

    let started = Instant::now();
    let (runaway_burst, good_burst) = tokio::join!(
        burst(&runaway, "runaway", 100, "requests_per_second"),
        async {
            // The good grant writes one at a time meanwhile.
            let mut refused = 0;
            for i in 0..10 {
                if good
                    .create(thing("Thing", &format!("good-{i}"), "{}"))
                    .await
                    .is_err()
                {
                    refused += 1;
                }
            }
            refused
        }
    );
    let (accepted, refused) = runaway_burst;
    // 20 at once (the burst), then 20 more within the 1 s wait bound.
    assert!(
        (30..=50).contains(&accepted) && accepted + refused == 100,
        "the runaway got {accepted} through and {refused} refused"
    );
    assert_eq!(good_burst, 0, "the good grant was never refused");
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_grants_each_connection_is_held_to_the_node_rate() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), "client_requests_per_second_max = 20\n");
    let mut options = options(3);
    options.extra_args = vec!["--config".into(), config];
    let cluster = Cluster::start(options);
    let leader = cluster.wait_for_leader(LEADER_TIMEOUT).await;
    let at_leader = vec![cluster.node(leader).client_address.clone()];
    let first = client_with(&at_leader, None).await;
    let second = client_with(&at_leader, None).await;
    let (accepted, refused) = burst(&first, "first", 100, "requests_per_second").await;
    assert!(
        (30..=50).contains(&accepted) && refused > 0,
        "one connection got {accepted} through and {refused} refused"
    );
    // The second connection has its own rate: its burst goes through at once.
    let started = Instant::now();
    let (accepted, refused) = burst(&second, "second", 15, "requests_per_second").await;
    assert_eq!((accepted, refused), (15, 0));
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
}
