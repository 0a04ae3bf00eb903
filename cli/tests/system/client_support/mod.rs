//! Helpers for the client's tests against real `cairn` processes: clusters
//! from `jepsen-tests::cluster` (killed on drop), resources, a recorder
//! that checks cache callbacks as they arrive, and a bounded runner for the
//! `cairn` data commands.
#![allow(dead_code)]

use std::collections::HashMap;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cairn_client::{CacheEvent, Client, ClientOptions, ResourceKey, WatchCache};
use cairn_proto::google::protobuf::Any;
use cairn_proto::v1::{Consistency, Id, Resource, Tenancy, Type};
pub use jepsen_tests::cluster::{Cluster, ClusterOptions};
use tokio::io::AsyncWriteExt;

pub const LEADER_TIMEOUT: Duration = Duration::from_secs(30);

pub fn options(nodes: usize) -> ClusterOptions {
    ClusterOptions::new(env!("CARGO_BIN_EXE_cairn"), nodes)
}

pub fn client_options() -> ClientOptions {
    ClientOptions {
        request_timeout: Duration::from_secs(15),
        connect_timeout: Duration::from_millis(500),
        ..ClientOptions::default()
    }
}

pub async fn client_for(endpoints: &[String]) -> Client {
    Client::connect_with(endpoints, client_options())
        .await
        .expect("valid endpoints")
}

pub fn type_of(kind: &str) -> Type {
    Type {
        group: "demo".into(),
        group_version: "v1".into(),
        kind: kind.into(),
    }
}

pub fn default_tenancy() -> Tenancy {
    Tenancy {
        partition: "default".into(),
        namespace: "default".into(),
    }
}

pub fn id(kind: &str, name: &str) -> Id {
    Id {
        uid: String::new(),
        name: name.into(),
        r#type: Some(type_of(kind)),
        tenancy: Some(default_tenancy()),
    }
}

/// A `demo.v1.KIND` resource with JSON data, to be created (no uid, no version).
pub fn thing(kind: &str, name: &str, json: &str) -> Resource {
    Resource {
        id: Some(id(kind, name)),
        data: Some(Any {
            type_url: format!("type.googleapis.com/demo.v1.{kind}"),
            value: bytes::Bytes::copy_from_slice(json.as_bytes()),
        }),
        ..Default::default()
    }
}

/// Every tenancy (a list or watch pattern).
pub fn any_tenancy() -> Tenancy {
    Tenancy {
        partition: "*".into(),
        namespace: "*".into(),
    }
}

/// `demo.KIND` at no group version (a list or watch filter).
pub fn unversioned(kind: &str) -> Type {
    Type {
        group: "demo".into(),
        group_version: String::new(),
        kind: kind.into(),
    }
}

/// Waits until `condition` holds, polling every 20 ms, at most `limit`.
pub async fn eventually<F, Fut>(limit: Duration, mut condition: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if condition().await {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Records cache events and checks, as they arrive, that no key's version
/// ever goes back or repeats and that every Delete removes what was there.
#[derive(Clone, Default)]
pub struct Recorder {
    inner: Arc<Mutex<RecorderState>>,
}

#[derive(Default)]
struct RecorderState {
    events: usize,
    last: HashMap<ResourceKey, (u64, bool)>,
    violations: Vec<String>,
}

impl Recorder {
    pub fn callback(&self) -> Box<dyn FnMut(&CacheEvent) + Send> {
        let inner = self.inner.clone();
        Box::new(move |event: &CacheEvent| {
            let mut s = inner.lock().expect("recorder lock");
            let r = event.resource();
            let key = ResourceKey::of(r);
            let version: u64 = r.version.parse().unwrap_or(0);
            match (event, s.last.get(&key).copied()) {
                (CacheEvent::Upsert(_), Some((v, _))) if version <= v => {
                    s.violations
                        .push(format!("{key:?}: upsert of version {version} after {v}"));
                }
                (CacheEvent::Delete(_), None) | (CacheEvent::Delete(_), Some((_, true))) => {
                    s.violations
                        .push(format!("{key:?}: delete of a key not cached"));
                }
                (CacheEvent::Delete(_), Some((v, false))) if v != version => {
                    s.violations
                        .push(format!("{key:?}: delete of version {version}, cached {v}"));
                }
                _ => {}
            }
            let deleted = matches!(event, CacheEvent::Delete(_));
            s.last.insert(key, (version, deleted));
            s.events += 1;
        })
    }

    pub fn count(&self) -> usize {
        self.inner.lock().expect("recorder lock").events
    }

    pub fn violations(&self) -> Vec<String> {
        self.inner.lock().expect("recorder lock").violations.clone()
    }
}

/// What a `cairn` command did.
#[derive(Debug)]
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

/// Runs `cairn ARGS` with `stdin`, killed if it takes longer than 60 s.
pub async fn cairn(args: &[&str], stdin: Option<&str>) -> Run {
    cairn_env(args, stdin, &[]).await
}

/// The `CAIRN_*` variables of the data and admin commands: removed from
/// every run, unless the run sets them.
const CLIENT_ENV: [&str; 5] = [
    "CAIRN_ENDPOINTS",
    "CAIRN_TOKEN",
    "CAIRN_CACERT",
    "CAIRN_CERT",
    "CAIRN_KEY",
];

/// As [`cairn`], with the variables `env` set (and no other `CAIRN_*`
/// client variable from the test's environment).
pub async fn cairn_env(args: &[&str], stdin: Option<&str>, env: &[(&str, &str)]) -> Run {
    run_cairn(env!("CARGO_BIN_EXE_cairn"), args, stdin, env).await
}

/// As [`cairn_env`], with the `cairn` binary at `binary` (a test may run another build).
pub async fn run_cairn(
    binary: &str,
    args: &[&str],
    stdin: Option<&str>,
    env: &[(&str, &str)],
) -> Run {
    let mut command = tokio::process::Command::new(binary);
    command.args(args);
    for name in CLIENT_ENV {
        command.env_remove(name);
    }
    command.envs(env.iter().copied());
    let mut child = command
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("cairn starts");
    if let Some(text) = stdin {
        let mut pipe = child.stdin.take().expect("stdin piped");
        pipe.write_all(text.as_bytes()).await.expect("write stdin");
        drop(pipe);
    }
    let output = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("cairn {args:?} did not finish within 60 s"))
        .expect("cairn output");
    Run {
        code: output.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// Creates `count` resources of `kind` named `{prefix}{i}`, 16 at a time.
pub async fn create_many(client: &Client, kind: &str, prefix: &str, count: usize) {
    let mut tasks = tokio::task::JoinSet::new();
    for worker in 0..16 {
        let client = client.clone();
        let (kind, prefix) = (kind.to_string(), prefix.to_string());
        tasks.spawn(async move {
            for i in (worker..count).step_by(16) {
                client
                    .create(thing(&kind, &format!("{prefix}{i:05}"), "{}"))
                    .await
                    .unwrap_or_else(|e| panic!("create {prefix}{i}: {e}"));
            }
        });
    }
    while let Some(r) = tasks.join_next().await {
        r.expect("writer task");
    }
}

/// Sorted name@version of what the cluster holds for `kind` (strong list).
pub async fn cluster_state(client: &Client, kind: &str) -> Vec<String> {
    let listed = client
        .list(unversioned(kind), any_tenancy(), "", Consistency::Strong)
        .await
        .expect("strong list");
    let mut v: Vec<String> = listed
        .resources
        .iter()
        .map(|r| format!("{}@{}", r.id.as_ref().unwrap().name, r.version))
        .collect();
    v.sort();
    v
}

pub fn cache_state(cache: &WatchCache, kind: &str) -> Vec<String> {
    let mut v: Vec<String> = cache
        .list("demo", kind)
        .iter()
        .map(|r| format!("{}@{}", r.id.as_ref().unwrap().name, r.version))
        .collect();
    v.sort();
    v
}

/// `cairn token new`: line 1 the token, line 2 its `token_sha256 = "..."` config line.
pub async fn new_token() -> (String, String) {
    let run = cairn(&["token", "new"], None).await;
    assert_eq!(run.code, 0, "{run:?}");
    let mut lines = run.stdout.lines();
    let token = lines.next().expect("a token line").to_string();
    let hash_line = lines.next().expect("a hash line").to_string();
    assert!(hash_line.starts_with("token_sha256 = \""), "{hash_line}");
    (token, hash_line)
}

/// `cairn ARGS --endpoints ENDPOINTS`, with this build's binary.
pub async fn cairn_at(endpoints: &str, args: &[&str]) -> Run {
    let mut all = args.to_vec();
    all.extend(["--endpoints", endpoints]);
    run_cairn(env!("CARGO_BIN_EXE_cairn"), &all, None, &[]).await
}

/// Waits until the cluster at `endpoints` runs at cluster version 0.2 (a new cluster rises
/// to it by itself within seconds), as `cairn status -o json` with `extra` reports it.
pub async fn wait_cluster_version_0_2(endpoints: &str, extra: &[&str]) {
    let mut args = vec!["status", "-o", "json"];
    args.extend(extra);
    let risen = eventually(Duration::from_secs(20), || {
        let args = args.clone();
        async move {
            let run = cairn_at(endpoints, &args).await;
            serde_json::from_str::<serde_json::Value>(&run.stdout)
                .is_ok_and(|s| s["cluster_version"] == "0.2")
        }
    })
    .await;
    assert!(risen, "the cluster version rises to 0.2");
}
