//! Shared helpers for the node's integration tests: a cluster of real `cairn`
//! processes (from `jepsen-tests::cluster`) and small raw-gRPC helpers.
#![allow(dead_code)]

use std::time::{Duration, Instant};

use cairn_proto::error::ApiError;
use cairn_proto::v1::resource_service_client::ResourceServiceClient;
use cairn_proto::v1::*;
pub use jepsen_tests::cluster::{Cluster, ClusterOptions};
use tonic::transport::Channel;

pub fn options(nodes: usize) -> ClusterOptions {
    ClusterOptions::new(env!("CARGO_BIN_EXE_cairn"), nodes)
}

pub async fn client(address: &str) -> ResourceServiceClient<Channel> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{address}"))
        .unwrap()
        .connect_timeout(Duration::from_millis(500))
        .timeout(Duration::from_secs(10))
        .connect_lazy();
    // Lists of large test resources exceed tonic's 4 MiB default.
    ResourceServiceClient::new(channel).max_decoding_message_size(64 * 1024 * 1024)
}

pub fn thing_type() -> Type {
    Type {
        group: "demo".into(),
        group_version: "v1".into(),
        kind: "Thing".into(),
    }
}

pub fn tenancy() -> Tenancy {
    Tenancy {
        partition: "default".into(),
        namespace: "default".into(),
    }
}

pub fn id(name: &str, uid: &str) -> Id {
    Id {
        uid: uid.into(),
        name: name.into(),
        r#type: Some(thing_type()),
        tenancy: Some(tenancy()),
    }
}

pub fn thing(name: &str, uid: &str, version: &str, payload: &[u8]) -> Resource {
    Resource {
        id: Some(id(name, uid)),
        version: version.into(),
        data: Some(cairn_proto::google::protobuf::Any {
            type_url: "demo/bytes".into(),
            value: bytes::Bytes::copy_from_slice(payload),
        }),
        ..Default::default()
    }
}

pub async fn write(address: &str, resource: Resource) -> Result<Resource, ApiError> {
    let mut c = client(address).await;
    c.write(WriteRequest {
        resource: Some(resource),
    })
    .await
    .map(|r| {
        r.into_inner()
            .resource
            .expect("a write answers the stored resource")
    })
    .map_err(ApiError::from)
}

pub async fn read(
    address: &str,
    name: &str,
    consistency: Consistency,
) -> Result<Resource, ApiError> {
    let mut c = client(address).await;
    c.read(ReadRequest {
        id: Some(id(name, "")),
        consistency: consistency as i32,
        revision: 0,
    })
    .await
    .map(|r| r.into_inner().resource.expect("a read answers a resource"))
    .map_err(ApiError::from)
}

pub async fn list(address: &str, consistency: Consistency) -> Result<Vec<Resource>, ApiError> {
    let mut c = client(address).await;
    let t = thing_type();
    c.list(ListRequest {
        r#type: Some(t),
        tenancy: Some(Tenancy {
            partition: "*".into(),
            namespace: "*".into(),
        }),
        name_prefix: String::new(),
        consistency: consistency as i32,
        revision: 0,
    })
    .await
    .map(|r| r.into_inner().resources)
    .map_err(ApiError::from)
}

/// Creates `name` through whichever node leads, retrying while there is no
/// leader. `Ok(true)` = acknowledged; `Ok(false)` = the outcome is unknown (an
/// ambiguous failure was followed by a CasFailure on retry: it may have been
/// applied by the first attempt).
pub async fn create_anywhere(
    cluster: &Cluster,
    name: &str,
    payload: &[u8],
    timeout: Duration,
) -> Result<bool, ApiError> {
    let deadline = Instant::now() + timeout;
    let mut ambiguous = false;
    let mut last = ApiError::Unavailable("not tried".into());
    while Instant::now() < deadline {
        for address in cluster.endpoints() {
            match write(&address, thing(name, "u1", "", payload)).await {
                Ok(_) => return Ok(true),
                Err(ApiError::CasFailure(_)) if ambiguous => return Ok(false),
                Err(
                    e @ (ApiError::NotLeader { .. }
                    | ApiError::Unavailable(_)
                    | ApiError::Inconsistent(_)),
                ) => {
                    if !matches!(e, ApiError::NotLeader { .. }) {
                        ambiguous = true;
                    }
                    last = e;
                }
                Err(e) => return Err(e),
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err(last)
}

/// Names of every Thing on `address` (eventual list), sorted.
pub async fn names_on(address: &str) -> Option<Vec<String>> {
    let mut names: Vec<String> = list(address, Consistency::Eventual)
        .await
        .ok()?
        .into_iter()
        .map(|r| r.id.unwrap().name)
        .collect();
    names.sort();
    Some(names)
}

/// Waits until every listed node holds exactly `expected` (eventual lists).
pub async fn wait_converged(
    cluster: &Cluster,
    ids: &[u64],
    expected: &[String],
    timeout: Duration,
) {
    let deadline = Instant::now() + timeout;
    let mut last = vec![];
    while Instant::now() < deadline {
        last.clear();
        let mut all = true;
        for id in ids {
            let got = names_on(&cluster.node(*id).client_address).await;
            if got.as_deref() != Some(expected) {
                all = false;
            }
            last.push((*id, got.map(|g| g.len())));
        }
        if all {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!(
        "nodes did not converge on {} resources: {last:?}; logs in {}",
        expected.len(),
        cluster.root().display()
    );
}

/// Runs the `cairn` binary under test with `args`.
pub fn cairn(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_cairn"))
        .args(args)
        .output()
        .expect("run cairn")
}

/// A command's stdout and stderr, for assertions and failure messages.
pub fn text(o: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}
