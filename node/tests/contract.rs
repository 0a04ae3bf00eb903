//! The storage contract (docs/contract.md sections 2–3), black-box over
//! gRPC against a running 3-node cluster: the same rules as the fsm's unit
//! tests, run once against the leader and once against each follower.
//!
//! The rules run twice, on two clusters: one plaintext without grants, and
//! one serving TLS on both ports with `[[auth.grants]]`, reached over TLS
//! with a token that may read and write everything (a client certificate
//! from `cairn tls init` too, but the token decides). Both runs make their
//! channels with the client library's `Access`; nothing else differs.
//!
//! On a follower, strong checks must pass at once (writes, deletes, strong
//! reads and strong lists are forwarded to the leader); eventual checks
//! (eventual reads and lists, ListByOwner, watches) may retry for a few
//! seconds, as the follower's replica may lag. Each run uses its own group,
//! so runs never see each other's resources.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::path::Path;
use std::time::{Duration, Instant};

use cairn_client::{Access, AuthenticatedChannel, BearerToken};
use cairn_proto::error::ApiError;
use cairn_proto::google::protobuf::{Any, Timestamp};
use cairn_proto::v1::resource_service_client::ResourceServiceClient;
use cairn_proto::v1::*;
use support::{client_tls, new_token, options, tls_args, tls_init, Cluster, ClusterOptions};
use tonic::service::interceptor::InterceptedService;

const LEADER_TIMEOUT: Duration = Duration::from_secs(20);
/// How long an eventual check may retry on a lagging node.
const EVENTUAL_TIMEOUT: Duration = Duration::from_secs(5);
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
    let anonymous = Target::new(
        &Access::from_options(Some(&tls)).unwrap(),
        "control",
        &cluster,
        1,
    );
    let refused = anonymous.strong(anonymous.id("Read", "r", "")).await;
    assert!(
        matches!(refused, Err(ApiError::Unauthenticated(_))),
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
        let mut t = Target::new(access, &format!("contract{run}"), cluster, node);
        t.label = format!("node {node} ({role})");
        println!("contract run {run}: {}", t.label);
        let started = Instant::now();
        read_rules(&t).await;
        write_rules(&t).await;
        delete_rules(&t).await;
        list_rules(&t).await;
        list_by_owner_rules(&t).await;
        watch_rules(&t).await;
        strong_requests_see_every_acknowledged_write(&t).await;
        invalid_arguments_name_their_field(&t).await;
        compacted_history(&t).await;
        println!(
            "contract run {run}: {} passed in {:?}",
            t.label,
            started.elapsed()
        );
    }
}

/// The node a run talks to, and the names it uses.
#[derive(Clone)]
struct Target {
    /// Client addresses of the other nodes.
    others: Vec<String>,
    label: String,
    group: String,
    access: Access,
    /// One channel to `address` (connected on first use), carrying the
    /// access's credentials on every call.
    channel: AuthenticatedChannel,
}

fn tenancy(partition: &str, namespace: &str) -> Tenancy {
    Tenancy {
        partition: partition.into(),
        namespace: namespace.into(),
    }
}

fn default_tenancy() -> Tenancy {
    tenancy("default", "default")
}

fn payload(bytes: &[u8]) -> Option<Any> {
    Some(Any {
        type_url: "demo/bytes".into(),
        value: bytes::Bytes::copy_from_slice(bytes),
    })
}

fn version_number(r: &Resource) -> u64 {
    r.version
        .parse()
        .unwrap_or_else(|_| panic!("version {:?} is a decimal index", r.version))
}

/// Retries `check` until it returns Ok or the eventual timeout passes.
async fn eventually<F, Fut, T>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let deadline = Instant::now() + EVENTUAL_TIMEOUT;
    loop {
        match check().await {
            Ok(v) => return v,
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("{what}: not true within {EVENTUAL_TIMEOUT:?}: {e}"),
        }
    }
}

impl Target {
    /// Node `node` of `cluster`, using names in `group`.
    fn new(access: &Access, group: &str, cluster: &Cluster, node: u64) -> Target {
        let address = cluster.node(node).client_address.clone();
        let mut t = Target::at(access, group, &address);
        t.others = cluster
            .ids_except(node)
            .into_iter()
            .map(|id| cluster.node(id).client_address.clone())
            .collect();
        t
    }

    /// The node at `address` (no others), using names in `group`.
    fn at(access: &Access, group: &str, address: &str) -> Target {
        let endpoint = access
            .endpoint(address)
            .expect("a node address")
            .connect_timeout(Duration::from_millis(500))
            .timeout(Duration::from_secs(10));
        let channel = cairn_tls::lazy_channel(endpoint, access.tls.as_ref());
        Target {
            others: vec![],
            label: address.to_string(),
            group: group.to_string(),
            access: access.clone(),
            channel: InterceptedService::new(channel, access.credentials.clone()),
        }
    }

    fn ty(&self, kind: &str) -> Type {
        self.ty_v(kind, "v1")
    }

    fn ty_v(&self, kind: &str, group_version: &str) -> Type {
        Type {
            group: self.group.clone(),
            group_version: group_version.into(),
            kind: kind.into(),
        }
    }

    fn id(&self, kind: &str, name: &str, uid: &str) -> Id {
        Id {
            uid: uid.into(),
            name: name.into(),
            r#type: Some(self.ty(kind)),
            tenancy: Some(default_tenancy()),
        }
    }

    fn res(&self, kind: &str, name: &str, uid: &str, version: &str, data: &[u8]) -> Resource {
        Resource {
            id: Some(self.id(kind, name, uid)),
            version: version.into(),
            data: payload(data),
            ..Default::default()
        }
    }

    async fn c(&self) -> ResourceServiceClient<AuthenticatedChannel> {
        // Lists of large test resources exceed tonic's 4 MiB default.
        ResourceServiceClient::new(self.channel.clone()).max_decoding_message_size(64 * 1024 * 1024)
    }

    async fn write(&self, resource: Resource) -> Result<Resource, ApiError> {
        self.c()
            .await
            .write(WriteRequest {
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

    /// A write that must succeed.
    async fn put(&self, resource: Resource) -> Resource {
        let name = resource
            .id
            .as_ref()
            .map(|i| i.name.clone())
            .unwrap_or_default();
        self.write(resource)
            .await
            .unwrap_or_else(|e| panic!("{}: write {name}: {e}", self.label))
    }

    async fn read_request(&self, request: ReadRequest) -> Result<ReadResponse, ApiError> {
        self.c()
            .await
            .read(request)
            .await
            .map(|r| r.into_inner())
            .map_err(ApiError::from)
    }

    async fn read(&self, id: Id, consistency: Consistency) -> Result<Resource, ApiError> {
        self.read_request(ReadRequest {
            id: Some(id),
            consistency: consistency as i32,
            revision: 0,
        })
        .await
        .map(|r| r.resource.expect("a read answers a resource"))
    }

    async fn strong(&self, id: Id) -> Result<Resource, ApiError> {
        self.read(id, Consistency::Strong).await
    }

    async fn delete(&self, id: Id, version: &str) -> Result<u64, ApiError> {
        self.c()
            .await
            .delete(DeleteRequest {
                id: Some(id),
                version: version.into(),
            })
            .await
            .map(|r| r.into_inner().revision)
            .map_err(ApiError::from)
    }

    async fn list_request(&self, request: ListRequest) -> Result<ListResponse, ApiError> {
        self.c()
            .await
            .list(request)
            .await
            .map(|r| r.into_inner())
            .map_err(ApiError::from)
    }

    async fn list(
        &self,
        kind: &str,
        tenancy: Tenancy,
        prefix: &str,
        consistency: Consistency,
    ) -> Result<ListResponse, ApiError> {
        self.list_request(ListRequest {
            r#type: Some(self.ty(kind)),
            tenancy: Some(tenancy),
            name_prefix: prefix.into(),
            consistency: consistency as i32,
            revision: 0,
            ..ListRequest::default()
        })
        .await
    }

    async fn list_by_owner(&self, owner: Id) -> Result<Vec<Resource>, ApiError> {
        self.c()
            .await
            .list_by_owner(ListByOwnerRequest { owner: Some(owner) })
            .await
            .map(|r| r.into_inner().resources)
            .map_err(ApiError::from)
    }

    async fn watch(
        &self,
        kind: &str,
        prefix: &str,
        start_revision: u64,
    ) -> Result<tonic::Streaming<WatchEvent>, ApiError> {
        self.c()
            .await
            .watch_list(WatchListRequest {
                r#type: Some(self.ty(kind)),
                tenancy: Some(tenancy("*", "*")),
                name_prefix: prefix.into(),
                start_revision,
                ..Default::default()
            })
            .await
            .map(|r| r.into_inner())
            .map_err(ApiError::from)
    }
}

fn names(resources: &[Resource]) -> BTreeSet<String> {
    resources
        .iter()
        .map(|r| r.id.as_ref().expect("an id").name.clone())
        .collect()
}

fn set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|s| s.to_string()).collect()
}

fn assert_invalid(result: Result<impl std::fmt::Debug, ApiError>, field: &str, what: &str) {
    match result {
        Err(ApiError::InvalidArgument { field: f, .. }) => assert_eq!(f, field, "{what}"),
        other => panic!("{what}: expected InvalidArgument naming {field}, got {other:?}"),
    }
}

async fn read_rules(t: &Target) {
    // Reads: NotFound, uid rules, group-version check after the uid check,
    // strong at once, eventual eventually (and never older afterwards).
    let absent = t.strong(t.id("Read", "absent", "")).await;
    assert_eq!(absent, Err(ApiError::NotFound), "{}", t.label);
    let written = t.put(t.res("Read", "r", "u1", "", b"1")).await;
    assert_eq!(t.strong(t.id("Read", "r", "")).await.unwrap(), written);
    assert_eq!(t.strong(t.id("Read", "r", "u1")).await.unwrap(), written);
    assert_eq!(
        t.strong(t.id("Read", "r", "u2")).await,
        Err(ApiError::NotFound),
        "a non-empty uid that differs is NotFound"
    );
    let mut v2 = t.id("Read", "r", "");
    v2.r#type = Some(t.ty_v("Read", "v2"));
    match t.strong(v2.clone()).await {
        Err(ApiError::GroupVersionMismatch { requested, stored }) => {
            assert_eq!(requested.group_version, "v2");
            assert_eq!(*stored, written, "carries the stored resource");
        }
        other => panic!("{}: expected GroupVersionMismatch, got {other:?}", t.label),
    }
    v2.uid = "u2".into();
    assert_eq!(
        t.strong(v2).await,
        Err(ApiError::NotFound),
        "the uid check comes first"
    );
    let seen = eventually("eventual read of a write", || async {
        match t.read(t.id("Read", "r", ""), Consistency::Eventual).await {
            Ok(r) if r == written => Ok(r),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    // Monotonic on one node: after an update, eventual reads move from the
    // old version to the new one and never back.
    let updated = t
        .put(t.res("Read", "r", "u1", &written.version, b"2"))
        .await;
    let mut last = version_number(&seen);
    let deadline = Instant::now() + EVENTUAL_TIMEOUT;
    loop {
        let r = t
            .read(t.id("Read", "r", ""), Consistency::Eventual)
            .await
            .unwrap();
        let v = version_number(&r);
        assert!(
            v >= last,
            "{}: eventual read went back from {last} to {v}",
            t.label
        );
        last = v;
        if r == updated {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{}: never saw the update",
            t.label
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn write_rules(t: &Target) {
    // Writes: compare-and-set in the contract's order; every other field
    // stored exactly; the group version ignored.
    assert!(
        matches!(
            t.write(t.res("Write", "w", "u1", "7", b"x")).await,
            Err(ApiError::CasFailure(_))
        ),
        "a version given but nothing stored"
    );
    let owner = t.id("Owner", "o", "u-owner");
    let rich = Resource {
        id: Some(t.id("Write", "w", "u1")),
        owner: Some(Box::new(owner)),
        version: String::new(),
        generation: "gen-1".into(),
        metadata: BTreeMap::from([
            ("a".to_string(), "1".to_string()),
            ("b".to_string(), "2".to_string()),
        ]),
        status: BTreeMap::from([(
            "controller".to_string(),
            Status {
                observed_generation: "gen-1".into(),
                conditions: vec![Condition {
                    r#type: "Ready".into(),
                    state: condition::State::True as i32,
                    reason: "Fine".into(),
                    message: "all good".into(),
                    resource: Some(Reference {
                        r#type: Some(t.ty("Other")),
                        tenancy: Some(default_tenancy()),
                        name: "ref".into(),
                        section: "s".into(),
                    }),
                }],
                updated_at: Some(Timestamp {
                    seconds: 1_700_000_000,
                    nanos: 5,
                }),
            },
        )]),
        data: payload(b"payload"),
    };
    let created = t.put(rich.clone()).await;
    assert!(version_number(&created) > 0);
    let mut expected = rich.clone();
    expected.version = created.version.clone();
    assert_eq!(created, expected, "every field stored exactly as given");
    assert_eq!(t.strong(t.id("Write", "w", "")).await.unwrap(), expected);

    assert!(
        matches!(
            t.write(t.res("Write", "w", "u1", "", b"x")).await,
            Err(ApiError::CasFailure(_))
        ),
        "an empty version with something stored"
    );
    assert!(
        matches!(
            t.write(t.res("Write", "w", "u2", &created.version, b"x"))
                .await,
            Err(ApiError::WrongUid(_))
        ),
        "another uid"
    );
    assert!(
        matches!(
            t.write(t.res("Write", "w", "", &created.version, b"x"))
                .await,
            Err(ApiError::WrongUid(_))
        ),
        "an empty uid"
    );
    assert!(
        matches!(
            t.write(t.res("Write", "w", "u2", "1", b"x")).await,
            Err(ApiError::WrongUid(_))
        ),
        "the uid is checked before the version"
    );
    assert!(
        matches!(
            t.write(t.res("Write", "w", "u1", "1", b"x")).await,
            Err(ApiError::CasFailure(_))
        ),
        "a stale version"
    );
    let second = t
        .put(t.res("Write", "w", "u1", &created.version, b"2"))
        .await;
    assert!(
        version_number(&second) > version_number(&created),
        "versions increase"
    );
    assert_eq!(second.owner, None, "a write replaces every field");

    // Writes ignore the group version: v2 replaces the v1 resource at the key.
    let mut as_v2 = t.res("Write", "w", "u1", &second.version, b"3");
    as_v2.id.as_mut().unwrap().r#type = Some(t.ty_v("Write", "v2"));
    let third = t.put(as_v2).await;
    assert!(matches!(
        t.strong(t.id("Write", "w", "")).await,
        Err(ApiError::GroupVersionMismatch { .. })
    ));
    let mut read_v2 = t.id("Write", "w", "");
    read_v2.r#type = Some(t.ty_v("Write", "v2"));
    assert_eq!(t.strong(read_v2).await.unwrap(), third);
}

async fn delete_rules(t: &Target) {
    // Deletes: idempotent on nothing stored, no-op on another lifetime,
    // CAS on the version, group version ignored.
    assert!(t.delete(t.id("Delete", "absent", "u1"), "").await.is_ok());
    let d = t.put(t.res("Delete", "d", "u1", "", b"x")).await;
    assert!(t.delete(t.id("Delete", "d", ""), &d.version).await.is_ok());
    assert!(t
        .delete(t.id("Delete", "d", "u9"), &d.version)
        .await
        .is_ok());
    assert_eq!(
        t.strong(t.id("Delete", "d", "")).await.unwrap(),
        d,
        "another lifetime's delete changes nothing"
    );
    assert!(matches!(
        t.delete(t.id("Delete", "d", "u1"), "1").await,
        Err(ApiError::CasFailure(_))
    ));
    assert!(matches!(
        t.delete(t.id("Delete", "d", "u1"), "").await,
        Err(ApiError::CasFailure(_))
    ));
    let mut other_version = t.id("Delete", "d", "u1");
    other_version.r#type = Some(t.ty_v("Delete", "v7"));
    let revision = t.delete(other_version, &d.version).await.unwrap();
    assert!(revision > version_number(&d));
    assert_eq!(
        t.strong(t.id("Delete", "d", "")).await,
        Err(ApiError::NotFound)
    );
    // The key can live again under a new uid.
    let again = t.put(t.res("Delete", "d", "u2", "", b"y")).await;
    assert!(version_number(&again) > revision);
}

async fn list_rules(t: &Target) {
    // Lists: group + kind of any group version; tenancy field by field with
    // "*"; case-sensitive name prefixes; empty results are empty lists.
    let put = |name: &str, kind: &str, p: &str, n: &str, gv: &str| {
        let mut r = t.res(kind, name, "u1", "", b"x");
        let id = r.id.as_mut().unwrap();
        id.r#type = Some(t.ty_v(kind, gv));
        id.tenancy = Some(tenancy(p, n));
        t.put(r)
    };
    put("web-1", "Listed", "p1", "n1", "v1").await;
    put("web-2", "Listed", "p1", "n1", "v1").await;
    put("Web-3", "Listed", "p1", "n1", "v1").await;
    put("db-1", "Listed", "p1", "n1", "v1").await;
    put("web-v2", "Listed", "p1", "n1", "v2").await;
    put("web-4", "Listed", "p1", "n2", "v1").await;
    put("web-5", "Listed", "p2", "n1", "v1").await;
    let last = put("web-6", "Listed", "", "", "v1").await;
    put("web-x", "Other", "p1", "n1", "v1").await;

    let cases: Vec<(Tenancy, &str, BTreeSet<String>)> = vec![
        (
            tenancy("p1", "n1"),
            "",
            set(&["web-1", "web-2", "Web-3", "db-1", "web-v2"]),
        ),
        (
            tenancy("p1", "n1"),
            "web-",
            set(&["web-1", "web-2", "web-v2"]),
        ),
        (
            tenancy("*", "n1"),
            "web",
            set(&["web-1", "web-2", "web-v2", "web-5"]),
        ),
        (
            tenancy("p1", "*"),
            "web",
            set(&["web-1", "web-2", "web-v2", "web-4"]),
        ),
        (
            tenancy("*", "*"),
            "",
            set(&[
                "web-1", "web-2", "Web-3", "db-1", "web-v2", "web-4", "web-5", "web-6",
            ]),
        ),
        (tenancy("", ""), "", set(&["web-6"])),
        (tenancy("", "*"), "", set(&["web-6"])),
        (tenancy("p3", "n1"), "", set(&[])),
        (tenancy("*", "*"), "nothing-", set(&[])),
    ];
    for (tn, prefix, expected) in &cases {
        let strong = t
            .list("Listed", tn.clone(), prefix, Consistency::Strong)
            .await
            .unwrap();
        assert_eq!(
            names(&strong.resources),
            *expected,
            "{}: strong list {tn:?} {prefix:?}",
            t.label
        );
        assert!(
            strong.revision >= version_number(&last),
            "the list reflects the last write"
        );
        eventually("eventual list", || async {
            let l = t
                .list("Listed", tn.clone(), prefix, Consistency::Eventual)
                .await
                .map_err(|e| e.to_string())?;
            if names(&l.resources) == *expected {
                Ok(())
            } else {
                Err(format!("{:?}", names(&l.resources)))
            }
        })
        .await;
    }
    // (beyond) A list at a past revision: before web-6 was written.
    let past = t
        .list_request(ListRequest {
            r#type: Some(t.ty("Listed")),
            tenancy: Some(tenancy("*", "*")),
            name_prefix: String::new(),
            consistency: Consistency::Strong as i32,
            revision: version_number(&last) - 1,
            ..ListRequest::default()
        })
        .await
        .unwrap();
    assert_eq!(past.revision, version_number(&last) - 1);
    assert!(!names(&past.resources).contains("web-6"));
    assert_eq!(past.resources.len(), 7);
}

async fn list_by_owner_rules(t: &Target) {
    // ListByOwner: owner equal on group, kind, tenancy, name and uid (group
    // version ignored); deleting the owner leaves the owned; deleting an
    // owned resource removes it. A local read: eventual on a follower.
    let owner = t.put(t.res("Owner", "boss", "u1", "", b"x")).await;
    let owner_id = owner.id.clone().unwrap();
    let owned = |name: &str, owner: Id| {
        let mut r = t.res("Owned", name, "u1", "", b"x");
        r.owner = Some(Box::new(owner));
        t.put(r)
    };
    let a = owned("a", owner_id.clone()).await;
    owned("b", owner_id.clone()).await;
    let mut other_life = owner_id.clone();
    other_life.uid = "u2".into();
    owned("c", other_life.clone()).await;
    let mut other_version = owner_id.clone();
    other_version.r#type = Some(t.ty_v("Owner", "v9"));
    owned("d", other_version.clone()).await;

    let expect = |query: Id, expected: BTreeSet<String>| async move {
        eventually("list by owner", || {
            let query = query.clone();
            let expected = expected.clone();
            async move {
                let got = names(&t.list_by_owner(query).await.map_err(|e| e.to_string())?);
                if got == expected {
                    Ok(())
                } else {
                    Err(format!("{got:?} != {expected:?}"))
                }
            }
        })
        .await
    };
    expect(owner_id.clone(), set(&["a", "b", "d"])).await;
    expect(other_version.clone(), set(&["a", "b", "d"])).await;
    expect(other_life, set(&["c"])).await;
    let mut unknown = owner_id.clone();
    unknown.uid = "u9".into();
    expect(unknown, set(&[])).await;

    t.delete(owner_id.clone(), &owner.version).await.unwrap();
    // Wait until this node has applied the owner's delete, then check the
    // owned resources are untouched.
    eventually("owner deleted locally", || async {
        match t
            .read(t.id("Owner", "boss", ""), Consistency::Eventual)
            .await
        {
            Err(ApiError::NotFound) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    expect(owner_id.clone(), set(&["a", "b", "d"])).await;
    t.delete(a.id.clone().unwrap(), &a.version).await.unwrap();
    expect(owner_id, set(&["b", "d"])).await;
}

/// The next event of a watch, within the eventual timeout.
async fn next_event(stream: &mut tonic::Streaming<WatchEvent>, label: &str) -> WatchEvent {
    tokio::time::timeout(EVENTUAL_TIMEOUT, stream.message())
        .await
        .unwrap_or_else(|_| panic!("{label}: no watch event within {EVENTUAL_TIMEOUT:?}"))
        .unwrap_or_else(|e| panic!("{label}: watch failed: {e}"))
        .unwrap_or_else(|| panic!("{label}: watch ended"))
}

async fn watch_rules(t: &Target) {
    // Watches: a snapshot then exactly one EndOfSnapshot (first when nothing
    // matches); then every write and delete in commit order, no event for
    // no-op deletes; each event's state readable on the node at once; (beyond)
    // a watch from a revision replays the changes after it.
    let mut empty = t.watch("Watched", "none-", 0).await.unwrap();
    assert!(matches!(
        next_event(&mut empty, &t.label).await.event,
        Some(watch_event::Event::EndOfSnapshot(_))
    ));

    let w1 = t.put(t.res("Watched", "w1", "u1", "", b"1")).await;
    let w2 = t.put(t.res("Watched", "w2", "u1", "", b"1")).await;
    let mut stream = t.watch("Watched", "w", 0).await.unwrap();
    // The snapshot and the live events together hold w1 and w2 once each (a
    // follower's snapshot may not have them yet).
    let mut snapshot = BTreeMap::new();
    loop {
        let e = next_event(&mut stream, &t.label).await;
        match e.event.unwrap() {
            watch_event::Event::Upsert(u) => {
                let r = u.resource.unwrap();
                assert!(
                    snapshot.insert(r.id.clone().unwrap().name, r).is_none(),
                    "no duplicate in the snapshot"
                );
            }
            watch_event::Event::EndOfSnapshot(_) => break,
            other => panic!("{}: unexpected snapshot event {other:?}", t.label),
        }
    }
    let mut pending: BTreeMap<String, Resource> = [w1.clone(), w2.clone()]
        .into_iter()
        .map(|r| (r.id.clone().unwrap().name, r))
        .filter(|(name, _)| !snapshot.contains_key(name))
        .collect();
    for r in snapshot.values() {
        assert!(*r == w1 || *r == w2, "the snapshot holds what was written");
    }
    while !pending.is_empty() {
        let e = next_event(&mut stream, &t.label).await;
        match e.event.unwrap() {
            watch_event::Event::Upsert(u) => {
                let r = u.resource.unwrap();
                let name = r.id.clone().unwrap().name;
                assert_eq!(
                    pending.remove(&name),
                    Some(r),
                    "a lagging write arrives live, once"
                );
            }
            other => panic!("{}: unexpected event {other:?}", t.label),
        }
    }

    // Live changes, including no-op deletes, then a sentinel write.
    let w3 = t.put(t.res("Watched", "w3", "u1", "", b"1")).await;
    let w1b = t.put(t.res("Watched", "w1", "u1", &w1.version, b"2")).await;
    let w2_deleted_at = t
        .delete(t.id("Watched", "w2", "u1"), &w2.version)
        .await
        .unwrap();
    t.delete(t.id("Watched", "w9", "u1"), "").await.unwrap(); // nothing stored
    t.delete(t.id("Watched", "w3", "other"), &w3.version)
        .await
        .unwrap(); // another lifetime
    let w4 = t.put(t.res("Watched", "w4", "u1", "", b"1")).await;

    enum Expect {
        Upsert(Resource),
        Delete(Resource, u64),
    }
    let expected = vec![
        Expect::Upsert(w3.clone()),
        Expect::Upsert(w1b.clone()),
        Expect::Delete(w2.clone(), w2_deleted_at),
        Expect::Upsert(w4.clone()),
    ];
    for want in expected {
        let e = next_event(&mut stream, &t.label).await;
        match (want, e.event.unwrap()) {
            (Expect::Upsert(r), watch_event::Event::Upsert(u)) => {
                assert_eq!(u.resource.as_ref(), Some(&r));
                assert_eq!(e.revision, version_number(&r));
                // Rule 4: the node that sent the event already holds it.
                let local = t
                    .read(
                        t.id("Watched", &r.id.clone().unwrap().name, ""),
                        Consistency::Eventual,
                    )
                    .await
                    .unwrap();
                assert_eq!(local, r, "{}: event state readable at once", t.label);
            }
            (Expect::Delete(r, at), watch_event::Event::Delete(d)) => {
                assert_eq!(d.resource.as_ref(), Some(&r), "the resource as last stored");
                assert_eq!(e.revision, at);
                assert_eq!(
                    t.read(t.id("Watched", "w2", ""), Consistency::Eventual)
                        .await,
                    Err(ApiError::NotFound)
                );
            }
            (_, other) => panic!(
                "{}: out of order or a no-op delete event: {other:?}",
                t.label
            ),
        }
    }

    // (beyond) Replay from a revision: every change after it, no snapshot.
    let mut replay = t
        .watch("Watched", "w", version_number(&w3) - 1)
        .await
        .unwrap();
    let mut replayed = vec![];
    for _ in 0..4 {
        let e = next_event(&mut replay, &t.label).await;
        replayed.push(match e.event.unwrap() {
            watch_event::Event::Upsert(u) => ("upsert", u.resource.unwrap().id.unwrap().name),
            watch_event::Event::Delete(d) => ("delete", d.resource.unwrap().id.unwrap().name),
            other => panic!("{}: a replay has no snapshot: {other:?}", t.label),
        });
    }
    let want: Vec<(&str, String)> = vec![
        ("upsert", "w3".into()),
        ("upsert", "w1".into()),
        ("delete", "w2".into()),
        ("upsert", "w4".into()),
    ];
    assert_eq!(replayed, want);
}

async fn strong_requests_see_every_acknowledged_write(t: &Target) {
    // A write acknowledged by any node is seen at once by strong reads and
    // lists on this node, and the other way round.
    for (i, other) in t.others.iter().enumerate() {
        let mut via_other = Target::at(&t.access, &t.group, other);
        via_other.label = format!("{} via {other}", t.label);
        let name = format!("x{i}");
        let w = via_other.put(t.res("Strong", &name, "u1", "", b"x")).await;
        assert_eq!(t.strong(t.id("Strong", &name, "")).await.unwrap(), w);
        let l = t
            .list("Strong", tenancy("*", "*"), &name, Consistency::Strong)
            .await
            .unwrap();
        assert_eq!(l.resources, vec![w]);
        let mine = format!("y{i}");
        let m = t.put(t.res("Strong", &mine, "u1", "", b"x")).await;
        assert_eq!(
            via_other.strong(t.id("Strong", &mine, "")).await.unwrap(),
            m
        );
    }
}

async fn invalid_arguments_name_their_field(t: &Target) {
    // Malformed input is InvalidArgument naming the field, for every request.
    let mut no_name = t.res("Bad", "", "u1", "", b"x");
    assert_invalid(
        t.write(no_name.clone()).await,
        "resource.id.name",
        "empty name",
    );
    no_name.id.as_mut().unwrap().r#type = Some(Type {
        group: t.group.clone(),
        group_version: "v1".into(),
        kind: String::new(),
    });
    no_name.id.as_mut().unwrap().name = "n".into();
    assert_invalid(t.write(no_name).await, "resource.id.type.kind", "no kind");
    let mut no_version = t.res("Bad", "n", "u1", "", b"x");
    no_version.id.as_mut().unwrap().r#type = Some(t.ty_v("Bad", ""));
    assert_invalid(
        t.write(no_version).await,
        "resource.id.type.group_version",
        "no group version on a write",
    );
    let huge = t.res("Bad", "n", "u1", "", &vec![0u8; 1024 * 1024 + 1]);
    assert_invalid(t.write(huge).await, "resource", "oversize resource");
    let star = t.res("Bad", "n*", "u1", "", b"x");
    assert_invalid(t.write(star).await, "resource.id.name", "'*' in a name");
    assert_invalid(
        t.c()
            .await
            .write(WriteRequest { resource: None })
            .await
            .map_err(ApiError::from),
        "resource",
        "no resource",
    );
    assert_invalid(
        t.read(t.id("Bad", "", ""), Consistency::Strong).await,
        "id.name",
        "read of an empty name",
    );
    assert_invalid(
        t.delete(t.id("Bad", "", "u1"), "").await,
        "id.name",
        "delete of an empty name",
    );
    for consistency in [2, 7, -1] {
        assert_invalid(
            t.read_request(ReadRequest {
                id: Some(t.id("Bad", "n", "")),
                consistency,
                revision: 0,
            })
            .await,
            "consistency",
            "unknown consistency value on a read",
        );
        assert_invalid(
            t.list_request(ListRequest {
                r#type: Some(t.ty("Bad")),
                tenancy: Some(default_tenancy()),
                name_prefix: String::new(),
                consistency,
                revision: 0,
                ..ListRequest::default()
            })
            .await,
            "consistency",
            "unknown consistency value on a list",
        );
    }
    assert_invalid(
        t.list("Bad", tenancy("p*", "n"), "", Consistency::Strong)
            .await,
        "tenancy.partition",
        "a '*' that does not stand alone",
    );
    assert_invalid(
        t.list_request(ListRequest {
            r#type: None,
            tenancy: Some(default_tenancy()),
            name_prefix: String::new(),
            consistency: 0,
            revision: 0,
            ..ListRequest::default()
        })
        .await,
        "type",
        "a list without a type",
    );
    assert_invalid(
        t.list_by_owner(t.id("Bad", "", "u1")).await,
        "owner.name",
        "ListByOwner of an empty name",
    );
    let mut c = t.c().await;
    let no_type = c
        .watch_list(WatchListRequest {
            r#type: None,
            tenancy: Some(default_tenancy()),
            name_prefix: String::new(),
            start_revision: 0,
            ..Default::default()
        })
        .await
        .map(|_| ())
        .map_err(ApiError::from);
    assert_invalid(no_type, "type", "a watch without a type");
}

async fn compacted_history(t: &Target) {
    // (beyond) Once more changes than the retained history happened, reads,
    // lists and watches at an older revision fail with Compacted, naming the
    // oldest retained revision.
    let first = t.put(t.res("Compact", "c", "u1", "", b"0")).await;
    let mut tasks = tokio::task::JoinSet::new();
    for worker in 0..8 {
        let t = t.clone();
        tasks.spawn(async move {
            for i in 0..(HISTORY_CHANGES_MAX / 8 + 2) {
                t.put(t.res("Compact", &format!("f{worker}-{i}"), "u1", "", b"x"))
                    .await;
            }
        });
    }
    while let Some(r) = tasks.join_next().await {
        r.unwrap();
    }
    let old = version_number(&first);
    let strong = t
        .read_request(ReadRequest {
            id: Some(t.id("Compact", "c", "")),
            consistency: Consistency::Strong as i32,
            revision: old,
        })
        .await;
    match strong {
        Err(ApiError::Compacted {
            oldest_retained_revision,
        }) => assert!(oldest_retained_revision > old),
        other => panic!("{}: expected Compacted, got {other:?}", t.label),
    }
    let listed = t
        .list_request(ListRequest {
            r#type: Some(t.ty("Compact")),
            tenancy: Some(default_tenancy()),
            name_prefix: String::new(),
            consistency: Consistency::Strong as i32,
            revision: old,
            ..ListRequest::default()
        })
        .await;
    assert!(
        matches!(listed, Err(ApiError::Compacted { .. })),
        "{}: {listed:?}",
        t.label
    );
    eventually("a watch from a compacted revision", || async {
        match t.watch("Compact", "", old).await {
            Err(ApiError::Compacted { .. }) => Ok(()),
            Ok(_) => Err("opened".to_string()),
            Err(e) => Err(e.to_string()),
        }
    })
    .await;
}
