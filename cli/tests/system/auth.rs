//! Tokens, roles and scopes against real `cairn` processes: each role is
//! allowed exactly what its grant says and refused the rest, through the
//! client library and through the CLI, on the leader and through a follower
//! (whose forwarding hop must not let anything past); lists, ListByOwner and
//! watches show only what lies inside the caller's read scope, also for a
//! watch opened before out-of-scope writes and after a restore. A client
//! certificate whose subject a grant names stands in for a token, over TLS.
//!
//! The grants cover each role (`read`, `write`, `admin`) and each form of
//! pattern: a type by `group.kind`, by `group.*` and `*`; a tenancy exact,
//! with a wildcard namespace, with a wildcard partition, and `*`.

use crate::client_support;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use cairn_client::{BearerToken, Client, ClientError, ClientOptions, TlsOptions};
use cairn_proto::v1::admin_service_client::AdminServiceClient;
use cairn_proto::v1::{
    self as pb, watch_event, Consistency, Id, ListRequest, Resource, Tenancy, WatchListRequest,
};
use client_support::*;

/// The tokens of the test cluster, each made by `cairn token new`.
struct Tokens {
    /// `admin = true`, nothing else; also the nodes' own token.
    admin: String,
    /// Write (and so read) on every type in every tenancy; no admin.
    ops: String,
    /// Read on demo.Thing in default/*.
    reader: String,
    /// Write on demo.* in team-a/*.
    team_a: String,
    /// Read on every type in */web and in team-b/db.
    web: String,
}

/// Writes the `[auth]` config every node of the test cluster loads: the
/// grants of [`Tokens`], then `more` (TOML appended as is).
async fn write_auth_config(dir: &Path, more: &str) -> (Tokens, PathBuf) {
    let (admin, admin_hash) = new_token().await;
    let (ops, ops_hash) = new_token().await;
    let (reader, reader_hash) = new_token().await;
    let (team_a, team_a_hash) = new_token().await;
    let (web, web_hash) = new_token().await;
    let node_token_file = dir.join("node.token");
    std::fs::write(&node_token_file, format!("{admin}\n")).unwrap();
    let config = format!(
        r#"
[auth]
node_token_file = "{}"

[[auth.grants]]
name = "admin"
{admin_hash}
admin = true

[[auth.grants]]
name = "ops"
{ops_hash}
write = {{ types = ["*"], tenancies = ["*"] }}

[[auth.grants]]
name = "reader"
{reader_hash}
read = {{ types = ["demo.Thing"], tenancies = ["default/*"] }}

[[auth.grants]]
name = "team-a"
{team_a_hash}
write = {{ types = ["demo.*"], tenancies = ["team-a/*"] }}

[[auth.grants]]
name = "web"
{web_hash}
read = {{ types = ["*"], tenancies = ["*/web", "team-b/db"] }}
{more}"#,
        node_token_file.display()
    );
    let path = dir.join("auth.toml");
    std::fs::write(&path, config).unwrap();
    let tokens = Tokens {
        admin,
        ops,
        reader,
        team_a,
        web,
    };
    (tokens, path)
}

/// Options of a cluster of `nodes` whose config holds the grants above and
/// `more`, with the harness's admin calls carrying the admin token.
async fn auth_options(nodes: usize, dir: &Path, more: &str) -> (ClusterOptions, Tokens) {
    let (tokens, config) = write_auth_config(dir, more).await;
    let mut o = options(nodes);
    o.extra_args = vec!["--config".into(), config.display().to_string()];
    o.admin_token = Some(tokens.admin.clone());
    (o, tokens)
}

/// A cluster of `nodes` whose config holds the grants above.
async fn auth_cluster(nodes: usize, dir: &Path) -> (Cluster, Tokens) {
    let (o, tokens) = auth_options(nodes, dir, "").await;
    let cluster = Cluster::start(o);
    cluster.wait_for_leader(LEADER_TIMEOUT).await;
    (cluster, tokens)
}

fn client(endpoints: &[String], token: Option<&str>) -> Client {
    Client::new(
        endpoints,
        ClientOptions {
            token: token.map(|t| BearerToken::new(t).unwrap()),
            ..client_options()
        },
    )
    .unwrap()
}

fn tenancy(partition: &str, namespace: &str) -> Tenancy {
    Tenancy {
        partition: partition.into(),
        namespace: namespace.into(),
    }
}

fn at(kind: &str, name: &str, t: Tenancy) -> Id {
    Id {
        uid: String::new(),
        name: name.into(),
        r#type: Some(type_of(kind)),
        tenancy: Some(t),
    }
}

fn resource(kind: &str, name: &str, t: Tenancy, owner: Option<Id>) -> Resource {
    let mut r = thing(kind, name, "{}");
    r.id = Some(at(kind, name, t));
    r.owner = owner.map(Box::new);
    r
}

fn names(resources: &[Resource]) -> BTreeSet<String> {
    resources
        .iter()
        .map(|r| {
            let id = r.id.as_ref().unwrap();
            let t = id.tenancy.as_ref().unwrap();
            format!("{}/{}/{}", t.partition, t.namespace, id.name)
        })
        .collect()
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

fn denied(result: Result<impl std::fmt::Debug, ClientError>, permission: &str) {
    match result {
        Err(ClientError::PermissionDenied(m)) => {
            assert!(m.contains(permission), "{m:?} should name {permission:?}")
        }
        other => panic!("expected PERMISSION_DENIED naming {permission:?}, got {other:?}"),
    }
}

fn unauthenticated(result: Result<impl std::fmt::Debug, ClientError>) {
    assert!(
        matches!(result, Err(ClientError::Unauthenticated(_))),
        "expected UNAUTHENTICATED, got {result:?}"
    );
}

async fn list_things(
    c: &Client,
    t: Tenancy,
    consistency: Consistency,
) -> Result<BTreeSet<String>, ClientError> {
    list_of(c, "Thing", t, consistency).await
}

async fn list_of(
    c: &Client,
    kind: &str,
    t: Tenancy,
    consistency: Consistency,
) -> Result<BTreeSet<String>, ClientError> {
    c.list(type_of(kind), t, "", consistency)
        .await
        .map(|l| names(&l.resources))
}

async fn admin_call(
    address: &str,
    token: Option<&str>,
) -> AdminServiceClient<cairn_client::AuthenticatedChannel> {
    let token = token.map(|t| BearerToken::new(t).unwrap());
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{address}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    AdminServiceClient::with_interceptor(channel, cairn_client::Credentials::new(token.as_ref()))
}

/// The calls of a caller whose grant is `read` on `demo.Thing` in
/// `default/*` (the `reader` token, the `dashboards` certificate), given
/// the Things d1 (default/default) and a1 (team-a/web) and the Other o1
/// (default/default): it reads d1; it may not read a1 (another tenancy) or
/// o1 (another kind), nor write or delete anything; each refusal names the
/// grant and the permission.
async fn reads_only_things_in_default(c: &Client, grant: &str) {
    let dd = || tenancy("default", "default");
    c.read(at("Thing", "d1", dd()), Consistency::Strong)
        .await
        .unwrap();
    denied(
        c.read(
            at("Thing", "a1", tenancy("team-a", "web")),
            Consistency::Strong,
        )
        .await,
        "read on demo.v1.Thing in team-a/web",
    );
    denied(
        c.read(at("Other", "o1", dd()), Consistency::Eventual).await,
        "read on demo.v1.Other in default/default",
    );
    let lacks_write = format!("grant {grant:?} lacks write on demo.v1.Thing in default/default");
    denied(
        c.create(resource("Thing", "r1", dd(), None)).await,
        &lacks_write,
    );
    denied(c.delete(at("Thing", "d1", dd()), "").await, &lacks_write);
}

/// A watch of every Thing in every tenancy.
fn every_thing() -> WatchListRequest {
    WatchListRequest {
        r#type: Some(type_of("Thing")),
        tenancy: Some(tenancy("*", "*")),
        name_prefix: String::new(),
        start_revision: 0,
        ..Default::default()
    }
}

/// The next event of a watch, within 20 s.
async fn next_event(watch: &mut cairn_client::WatchStream) -> pb::WatchEvent {
    tokio::time::timeout(Duration::from_secs(20), watch.next())
        .await
        .expect("a watch event within 20 s")
        .expect("the watch is open")
        .expect("no watch error")
}

/// The next Upsert or Delete of a watch (markers skipped), as "p/ns/name".
async fn next_change(watch: &mut cairn_client::WatchStream) -> String {
    loop {
        let event = next_event(watch).await;
        let resource = match event.event {
            Some(watch_event::Event::Upsert(u)) => u.resource,
            Some(watch_event::Event::Delete(d)) => d.resource,
            _ => continue,
        };
        return names(&[resource.expect("an event carries its resource")])
            .into_iter()
            .next()
            .unwrap();
    }
}

/// Every change a watch delivers up to its EndOfSnapshot, as "p/ns/name".
async fn snapshot_of(watch: &mut cairn_client::WatchStream) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    loop {
        let event = next_event(watch).await;
        match event.event {
            Some(watch_event::Event::Upsert(u)) => {
                seen.extend(names(&[u.resource.expect("a resource")]));
            }
            Some(watch_event::Event::EndOfSnapshot(_)) => return seen,
            _ => {}
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_role_gets_exactly_its_grant_through_the_client_library() {
    // One cluster with four tokens; every call of the contract and of the
    // admin service is made with each relevant token, at the leader and
    // through a follower, and the answers are compared with the grants.
    tokio::time::timeout(Duration::from_secs(300), async {
        let dir = tempfile::tempdir().unwrap();
        let (cluster, tokens) = auth_cluster(3, dir.path()).await;
        let endpoints = cluster.endpoints();
        let leader = cluster.wait_for_leader(LEADER_TIMEOUT).await;
        let follower = cluster.ids().into_iter().find(|id| *id != leader).unwrap();
        let follower_only = vec![cluster.node(follower).client_address.clone()];
        let ops = client(&endpoints, Some(&tokens.ops));
        let reader = client(&endpoints, Some(&tokens.reader));
        let team_a = client(&endpoints, Some(&tokens.team_a));
        let admin = client(&endpoints, Some(&tokens.admin));
        let anonymous = client(&endpoints, None);
        let stranger = client(&endpoints, Some("cairn-not-a-token-of-this-cluster"));
        let dd = || tenancy("default", "default");

        // A watch of every Thing, opened by the reader before anything exists.
        let mut reader_watch = client(&follower_only, Some(&tokens.reader))
            .watch_list(every_thing())
            .await
            .unwrap();

        // No token, or an unknown one: UNAUTHENTICATED for data and admin calls.
        unauthenticated(anonymous.create(resource("Thing", "x", dd(), None)).await);
        // Authenticated before validated: a malformed request without a
        // token learns only that it needs one; with one, which field is wrong.
        let malformed = || {
            let mut r = resource("Thing", "x", dd(), None);
            r.id.as_mut().unwrap().name = "bad\u{1}name".into();
            pb::WriteRequest {
                resource: Some(r),
                fence: None,
            }
        };
        let mut raw = pb::resource_service_client::ResourceServiceClient::connect(format!(
            "http://{}",
            cluster.node(leader).client_address
        ))
        .await
        .unwrap();
        let status = raw.write(malformed()).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unauthenticated, "{status:?}");
        let mut with_token = tonic::Request::new(malformed());
        with_token.metadata_mut().insert(
            "authorization",
            format!("Bearer {}", tokens.ops).parse().unwrap(),
        );
        let status = raw.write(with_token).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
        unauthenticated(list_things(&anonymous, tenancy("*", "*"), Consistency::Eventual).await);
        unauthenticated(
            stranger
                .read(at("Thing", "x", dd()), Consistency::Eventual)
                .await,
        );
        let status = admin_call(&endpoints[0], None)
            .await
            .status(pb::StatusRequest {})
            .await;
        assert_eq!(status.unwrap_err().code(), tonic::Code::Unauthenticated);

        // ops writes everywhere (leader and follower); the data set:
        for (kind, name, t, owner) in [
            ("Thing", "d1", dd(), None),
            ("Thing", "d2", tenancy("default", "x"), None),
            ("Thing", "a1", tenancy("team-a", "web"), None),
            ("Thing", "b1", tenancy("team-b", "web"), None),
            ("Other", "o1", dd(), None),
            ("Other", "bd", tenancy("team-b", "db"), None),
        ] {
            ops.create(resource(kind, name, t, owner)).await.unwrap();
        }
        let d1 = ops
            .read(at("Thing", "d1", dd()), Consistency::Strong)
            .await
            .unwrap();
        let owner = d1.id.clone();
        // Children of d1: one inside the reader's scope, two outside.
        client(&follower_only, Some(&tokens.ops))
            .create(resource("Thing", "c-in", dd(), owner.clone()))
            .await
            .unwrap();
        ops.create(resource(
            "Thing",
            "c-out",
            tenancy("team-b", "web"),
            owner.clone(),
        ))
        .await
        .unwrap();
        ops.create(resource("Other", "c-other", dd(), owner.clone()))
            .await
            .unwrap();

        // The reader's watch delivered exactly the in-scope creations, in order.
        for expected in ["default/default/d1", "default/x/d2", "default/default/c-in"] {
            assert_eq!(next_change(&mut reader_watch).await, expected);
        }

        // reader: reads inside its scope, refused outside, never writes.
        reads_only_things_in_default(&reader, "reader").await;
        // Lists: filtered to the scope, strong and eventual, leader and follower.
        let in_scope = set(&["default/default/d1", "default/x/d2", "default/default/c-in"]);
        let reader_on_follower = client(&follower_only, Some(&tokens.reader));
        for c in [&reader, &reader_on_follower] {
            for consistency in [Consistency::Strong, Consistency::Eventual] {
                assert!(
                    eventually(Duration::from_secs(10), || {
                        let c = c.clone();
                        let in_scope = in_scope.clone();
                        async move {
                            list_things(&c, tenancy("*", "*"), consistency)
                                .await
                                .unwrap()
                                == in_scope
                        }
                    })
                    .await,
                    "{consistency:?}"
                );
                assert_eq!(
                    list_things(c, tenancy("default", "*"), consistency)
                        .await
                        .unwrap(),
                    in_scope
                );
            }
        }
        // A list wholly outside the scope is refused (the request alone decides).
        denied(
            list_things(&reader, tenancy("team-a", "*"), Consistency::Strong).await,
            "read on demo.Thing in team-a/*",
        );
        denied(
            reader
                .list(
                    type_of("Other"),
                    tenancy("*", "*"),
                    "",
                    Consistency::Eventual,
                )
                .await,
            "read on demo.Other in */*",
        );
        // ListByOwner: only the children inside the scope.
        let owned = reader.list_by_owner(owner.clone().unwrap()).await.unwrap();
        assert_eq!(names(&owned.resources), set(&["default/default/c-in"]));
        let owned = ops.list_by_owner(owner.clone().unwrap()).await.unwrap();
        assert_eq!(owned.resources.len(), 3);
        denied(
            admin.list_by_owner(owner.clone().unwrap()).await,
            "read on any type",
        );

        // team-a: writes and reads demo.* in team-a/*, through the follower too.
        let team_a_on_follower = client(&follower_only, Some(&tokens.team_a));
        let a2 = team_a_on_follower
            .create(resource("Other", "a2", tenancy("team-a", "db"), None))
            .await
            .unwrap();
        team_a
            .read(
                at("Thing", "a1", tenancy("team-a", "web")),
                Consistency::Strong,
            )
            .await
            .unwrap();
        denied(
            team_a_on_follower
                .create(resource("Thing", "x", dd(), None))
                .await,
            "write on demo.v1.Thing in default/default",
        );
        denied(
            team_a_on_follower
                .read(
                    at("Thing", "b1", tenancy("team-b", "web")),
                    Consistency::Strong,
                )
                .await,
            "read on demo.v1.Thing in team-b/web",
        );
        assert_eq!(
            list_things(&team_a_on_follower, tenancy("*", "*"), Consistency::Strong)
                .await
                .unwrap(),
            set(&["team-a/web/a1"])
        );
        team_a
            .delete(a2.id.clone().unwrap(), a2.version.clone())
            .await
            .unwrap();

        // web: every type in */web and team-b/db (a partition wildcard and an
        // exact tenancy), read only.
        let web = client(&follower_only, Some(&tokens.web));
        for consistency in [Consistency::Strong, Consistency::Eventual] {
            assert!(
                eventually(Duration::from_secs(10), || {
                    let web = web.clone();
                    async move {
                        list_things(&web, tenancy("*", "*"), consistency).await.ok()
                            == Some(set(&["team-a/web/a1", "team-b/web/b1", "team-b/web/c-out"]))
                    }
                })
                .await,
                "{consistency:?}: {:?}",
                list_things(&web, tenancy("*", "*"), consistency).await
            );
        }
        assert_eq!(
            list_of(&web, "Other", tenancy("team-b", "*"), Consistency::Strong)
                .await
                .unwrap(),
            set(&["team-b/db/bd"])
        );
        web.read(
            at("Other", "bd", tenancy("team-b", "db")),
            Consistency::Strong,
        )
        .await
        .unwrap();
        denied(
            web.read(at("Thing", "d1", dd()), Consistency::Strong).await,
            "read on demo.v1.Thing in default/default",
        );
        denied(
            list_things(&web, tenancy("default", "x"), Consistency::Eventual).await,
            "read on demo.Thing in default/x",
        );
        denied(
            web.create(resource("Thing", "w", tenancy("team-a", "web"), None))
                .await,
            "write on demo.v1.Thing in team-a/web",
        );
        let mut web_watch = web.watch_list(every_thing()).await.unwrap();
        assert_eq!(
            snapshot_of(&mut web_watch).await,
            set(&["team-a/web/a1", "team-b/web/b1", "team-b/web/c-out"])
        );

        // admin: every admin call, no data.
        denied(
            admin
                .read(at("Thing", "d1", dd()), Consistency::Eventual)
                .await,
            "read on demo.v1.Thing",
        );
        for token in [&tokens.reader, &tokens.ops, &tokens.team_a, &tokens.web] {
            let mut c = admin_call(&cluster.node(follower).client_address, Some(token)).await;
            let e = c.status(pb::StatusRequest {}).await.unwrap_err();
            assert!(e.message().contains("admin (for Status)"), "{e:?}");
            let refusals = [
                ("status", Err(e)),
                (
                    "trigger_election",
                    c.trigger_election(pb::TriggerElectionRequest {})
                        .await
                        .map(drop),
                ),
                (
                    "remove_member",
                    c.remove_member(pb::RemoveMemberRequest {
                        id: follower,
                        force: false,
                    })
                    .await
                    .map(drop),
                ),
                (
                    "add_learner",
                    c.add_learner(pb::AddLearnerRequest {
                        id: 9,
                        peer_address: "127.0.0.1:1".into(),
                        client_address: "127.0.0.1:2".into(),
                    })
                    .await
                    .map(drop),
                ),
                (
                    "promote",
                    c.promote(pb::PromoteRequest { id: follower })
                        .await
                        .map(drop),
                ),
                (
                    "transfer_leader",
                    c.transfer_leader(pb::TransferLeaderRequest { to: 0 })
                        .await
                        .map(drop),
                ),
                (
                    "save_snapshot",
                    c.save_snapshot(pb::SaveSnapshotRequest {}).await.map(drop),
                ),
            ];
            for (call, refusal) in refusals {
                let code = refusal.map_err(|e| e.code());
                assert_eq!(code, Err(tonic::Code::PermissionDenied), "{call}");
            }
        }
        let status = admin_call(&cluster.node(leader).client_address, Some(&tokens.admin))
            .await
            .status(pb::StatusRequest {})
            .await
            .unwrap()
            .into_inner();
        assert_eq!(status.members.len(), 3, "nothing changed the membership");
        // A leader transfer needs the leader to ask the target to campaign:
        // it does so with its node token.
        admin_call(&cluster.node(leader).client_address, Some(&tokens.admin))
            .await
            .transfer_leader(pb::TransferLeaderRequest { to: follower })
            .await
            .unwrap();

        // After the leader change the reader's watch (on the follower, now
        // the leader) still sees only its scope: b1's delete is filtered, d2's is not.
        let b1 = ops
            .read(
                at("Thing", "b1", tenancy("team-b", "web")),
                Consistency::Strong,
            )
            .await
            .unwrap();
        ops.delete(b1.id.clone().unwrap(), b1.version.clone())
            .await
            .unwrap();
        ops.create(resource("Thing", "b2", tenancy("team-b", "web"), None))
            .await
            .unwrap();
        let d2 = ops
            .read(
                at("Thing", "d2", tenancy("default", "x")),
                Consistency::Strong,
            )
            .await
            .unwrap();
        ops.delete(d2.id.clone().unwrap(), d2.version.clone())
            .await
            .unwrap();
        assert_eq!(next_change(&mut reader_watch).await, "default/x/d2");
        assert_eq!(
            list_things(&reader, tenancy("*", "*"), Consistency::Strong)
                .await
                .unwrap(),
            set(&["default/default/d1", "default/default/c-in"])
        );
        drop(cluster);
    })
    .await
    .expect("the test finished within 300 s");
}

/// How a `cairn` run presents its credentials.
enum Credential<'a> {
    /// None at all.
    Nothing,
    /// `--token TOKEN`.
    TokenFlag(&'a str),
    /// `CAIRN_TOKEN=TOKEN`.
    TokenEnv(&'a str),
    /// `--cacert DIR/ca.pem --cert CERT --key KEY` (TLS clusters).
    CertificateFlags {
        ca: &'a Path,
        cert: &'a Path,
        key: &'a Path,
    },
    /// `CAIRN_CACERT`, `CAIRN_CERT`, `CAIRN_KEY` (TLS clusters).
    CertificateEnv {
        ca: &'a Path,
        cert: &'a Path,
        key: &'a Path,
    },
}

/// Runs `cairn ARGS --endpoints ENDPOINTS` with `credential`.
async fn cairn_as(endpoints: &str, credential: &Credential<'_>, args: &[&str]) -> Run {
    let mut all: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    all.extend(["--endpoints".to_string(), endpoints.to_string()]);
    let mut env: Vec<(&str, String)> = Vec::new();
    let path = |p: &Path| p.display().to_string();
    match credential {
        Credential::Nothing => {}
        Credential::TokenFlag(t) => all.extend(["--token".to_string(), t.to_string()]),
        Credential::TokenEnv(t) => env.push(("CAIRN_TOKEN", t.to_string())),
        Credential::CertificateFlags { ca, cert, key } => all.extend([
            "--cacert".to_string(),
            path(ca),
            "--cert".to_string(),
            path(cert),
            "--key".to_string(),
            path(key),
        ]),
        Credential::CertificateEnv { ca, cert, key } => env.extend([
            ("CAIRN_CACERT", path(ca)),
            ("CAIRN_CERT", path(cert)),
            ("CAIRN_KEY", path(key)),
        ]),
    }
    let args: Vec<&str> = all.iter().map(String::as_str).collect();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    cairn_env(&args, None, &env).await
}

/// Asserts that a run succeeded; returns it.
fn succeeded(run: Run, what: &str) -> Run {
    assert_eq!(run.code, 0, "{what}: {run:?}");
    run
}

/// Asserts that a run was refused with exit code 6, its message holding `why`.
fn refused(run: Run, what: &str, why: &str) {
    assert_eq!(run.code, 6, "{what}: {run:?}");
    assert!(run.stderr.contains(why), "{what}: {why:?} not in {run:?}");
}

/// The resources a `-o json` run printed (a list, resources one after the
/// other, or watch events), as "partition/namespace/name".
fn printed(run: &Run) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for value in serde_json::Deserializer::from_str(&run.stdout).into_iter::<serde_json::Value>() {
        let value = value.unwrap_or_else(|e| panic!("{e}: {run:?}"));
        let resources = match (&value["resources"], &value["resource"]) {
            (serde_json::Value::Array(list), _) => list.clone(),
            (_, r @ serde_json::Value::Object(_)) => vec![r.clone()],
            _ if value["id"].is_object() => vec![value.clone()],
            _ => vec![],
        };
        for r in resources {
            let id = &r["id"];
            found.insert(format!(
                "{}/{}/{}",
                id["tenancy"]["partition"].as_str().unwrap(),
                id["tenancy"]["namespace"].as_str().unwrap(),
                id["name"].as_str().unwrap()
            ));
        }
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_takes_a_token_and_refuses_with_exit_code_6() {
    // The data and admin commands with --token and CAIRN_TOKEN: each role's
    // allowed commands succeed, the others exit 6 naming the permission;
    // a backup and restore by the admin keeps the reader's view filtered.
    tokio::time::timeout(Duration::from_secs(300), async {
        let dir = tempfile::tempdir().unwrap();
        let (cluster, tokens) = auth_cluster(3, dir.path()).await;
        let e = cluster.endpoints().join(",");
        let e = e.as_str();
        let t = "demo.v1.Thing";
        let ops = Credential::TokenFlag(&tokens.ops);
        let reader = Credential::TokenFlag(&tokens.reader);
        let reader_env = Credential::TokenEnv(&tokens.reader);
        let team_a = Credential::TokenEnv(&tokens.team_a);
        let web = Credential::TokenFlag(&tokens.web);
        let admin = Credential::TokenFlag(&tokens.admin);
        let admin_env = Credential::TokenEnv(&tokens.admin);
        let write = |name: &'static str, type_: &'static str, tenancy: &'static str| {
            [
                "write",
                "--type",
                type_,
                "--name",
                name,
                "--tenancy",
                tenancy,
                "-o",
                "json",
            ]
        };
        let list_all =
            |type_: &'static str| ["list", "--type", type_, "--tenancy", "*/*", "-o", "json"];

        // No token: exit 6 and a hint.
        let run = cairn_as(e, &Credential::Nothing, &["list", "--type", t]).await;
        refused(run, "list without a token", "unauthenticated");
        let run = cairn_as(e, &Credential::Nothing, &["status"]).await;
        refused(run, "status without a token", "unauthenticated");
        let run = cairn_as(e, &Credential::TokenFlag("cairn-unknown"), &["status"]).await;
        refused(run, "status with an unknown token", "unauthenticated");

        // ops (`*` in `*`) writes anywhere; team-a (`demo.*` in `team-a/*`)
        // writes every kind of its group in its tenancies, nothing else.
        let n1 = succeeded(
            cairn_as(e, &ops, &write("n1", t, "default/default")).await,
            "ops writes default/default",
        );
        succeeded(
            cairn_as(e, &ops, &write("n1", t, "team-b/web")).await,
            "ops writes team-b/web",
        );
        succeeded(
            cairn_as(e, &team_a, &write("n2", t, "team-a/web")).await,
            "team-a writes a Thing in team-a/web",
        );
        succeeded(
            cairn_as(e, &team_a, &write("o2", "demo.v1.Other", "team-a/db")).await,
            "team-a writes an Other in team-a/db",
        );
        refused(
            cairn_as(e, &team_a, &write("n3", t, "default/default")).await,
            "team-a writes outside its tenancies",
            "write on demo.v1.Thing in default/default",
        );
        refused(
            cairn_as(e, &team_a, &write("n3", "ops.v1.Thing", "team-a/web")).await,
            "team-a writes outside its group",
            "write on ops.v1.Thing in team-a/web",
        );
        // Two children of n1: one inside the reader's scope, one outside.
        let n1_uid = printed_uid(&n1);
        let owner = format!("{t}/n1/{n1_uid}");
        for (name, type_) in [("c-in", t), ("c-other", "demo.v1.Other")] {
            let mut args = write(name, type_, "default/default").to_vec();
            args.extend(["--owner", &owner]);
            succeeded(cairn_as(e, &ops, &args).await, "ops writes a child of n1");
        }

        // reader (`demo.Thing` in `default/*`): reads, lists, lists by owner
        // and watches inside its scope only; never writes or deletes.
        let run = succeeded(
            cairn_as(
                e,
                &reader,
                &["read", "--type", t, "--name", "n1", "-o", "json"],
            )
            .await,
            "reader reads n1",
        );
        assert_eq!(printed(&run), set(&["default/default/n1"]));
        for (args, why) in [
            (
                vec![
                    "read",
                    "--type",
                    t,
                    "--name",
                    "n1",
                    "--tenancy",
                    "team-b/web",
                ],
                "read on demo.v1.Thing in team-b/web",
            ),
            (
                vec!["read", "--type", "demo.v1.Other", "--name", "c-other"],
                "read on demo.v1.Other in default/default",
            ),
            (
                write("r1", t, "default/default").to_vec(),
                "write on demo.v1.Thing in default/default",
            ),
            (
                vec!["delete", "--type", t, "--name", "n1"],
                "write on demo.v1.Thing in default/default",
            ),
            (
                vec!["list", "--type", t, "--tenancy", "team-a/*"],
                "read on demo.Thing in team-a/*",
            ),
        ] {
            refused(cairn_as(e, &reader_env, &args).await, "reader", why);
        }
        let reader_list = || async {
            printed(&succeeded(
                cairn_as(e, &reader_env, &list_all(t)).await,
                "reader lists",
            ))
        };
        assert_eq!(
            reader_list().await,
            set(&["default/default/n1", "default/default/c-in"])
        );
        let run = succeeded(
            cairn_as(
                e,
                &reader,
                &["owned-by", "--type", t, "--name", "n1", "-o", "json"],
            )
            .await,
            "reader lists n1's children",
        );
        assert_eq!(printed(&run), set(&["default/default/c-in"]));
        let run = succeeded(
            cairn_as(
                e,
                &reader,
                &[
                    "watch",
                    "--type",
                    t,
                    "--tenancy",
                    "*/*",
                    "--max-events",
                    "3",
                    "-o",
                    "json",
                ],
            )
            .await,
            "reader watches",
        );
        assert_eq!(
            printed(&run),
            set(&["default/default/n1", "default/default/c-in"])
        );

        // web (`*` in `*/web` and `team-b/db`): every type there, read only.
        let run = succeeded(cairn_as(e, &web, &list_all(t)).await, "web lists");
        assert_eq!(printed(&run), set(&["team-a/web/n2", "team-b/web/n1"]));
        let run = succeeded(
            cairn_as(e, &web, &list_all("demo.v1.Other")).await,
            "web lists Others",
        );
        assert_eq!(printed(&run), BTreeSet::new(), "team-a/db is outside");
        refused(
            cairn_as(e, &web, &write("w1", t, "team-b/web")).await,
            "web writes",
            "write on demo.v1.Thing in team-b/web",
        );
        refused(
            cairn_as(e, &web, &["list", "--type", t, "--tenancy", "default/x"]).await,
            "web lists default/x",
            "read on demo.Thing in default/x",
        );

        // ops sees everything.
        let run = succeeded(cairn_as(e, &ops, &list_all(t)).await, "ops lists");
        assert_eq!(
            printed(&run),
            set(&[
                "default/default/n1",
                "default/default/c-in",
                "team-a/web/n2",
                "team-b/web/n1"
            ])
        );

        // admin: no data; every admin command. The data roles: no admin command.
        for (args, why) in [
            (
                vec!["read", "--type", t, "--name", "n1"],
                "read on demo.v1.Thing in default/default",
            ),
            (list_all(t).to_vec(), "read on demo.Thing in */*"),
        ] {
            refused(cairn_as(e, &admin, &args).await, "admin's data", why);
        }
        let backup = dir.path().join("backup.snap");
        let backup = backup.to_str().unwrap();
        let data_roles = [
            ("reader", &reader),
            ("ops", &ops),
            ("team-a", &team_a),
            ("web", &web),
        ];
        for (name, credential) in data_roles {
            for args in [
                vec!["status"],
                vec!["snapshot", "save", backup],
                vec!["member", "remove", "3"],
                vec!["transfer-leader"],
            ] {
                refused(
                    cairn_as(e, credential, &args).await,
                    &format!("{name}: {args:?}"),
                    &format!("\"{name}\" lacks admin"),
                );
            }
        }
        assert!(!Path::new(backup).exists(), "a refused save writes no file");
        let run = succeeded(
            cairn_as(e, &admin, &["status", "-o", "json"]).await,
            "admin status",
        );
        let status: serde_json::Value = serde_json::from_str(&run.stdout).unwrap();
        let voters = status["members"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["voter"] == true && m["reachable"] == true)
            .count();
        assert_eq!(voters, 3, "three voters, each answering: {run:?}");
        succeeded(
            cairn_as(e, &admin, &["snapshot", "save", backup]).await,
            "admin saves a backup",
        );
        for (name, credential) in data_roles {
            refused(
                cairn_as(e, credential, &["snapshot", "restore", "--yes", backup]).await,
                &format!("{name}: restore"),
                &format!("\"{name}\" lacks admin"),
            );
        }

        // A write after the backup, then a restore by the admin.
        succeeded(
            cairn_as(e, &ops, &write("later", t, "default/x")).await,
            "ops writes after the backup",
        );
        assert_eq!(
            reader_list().await,
            set(&[
                "default/default/n1",
                "default/default/c-in",
                "default/x/later"
            ])
        );
        succeeded(
            cairn_as(e, &admin_env, &["snapshot", "restore", "--yes", backup]).await,
            "admin restores",
        );
        // After the restore, the reader still sees only its scope (and not `later`).
        assert_eq!(
            reader_list().await,
            set(&["default/default/n1", "default/default/c-in"])
        );
        drop(cluster);
    })
    .await
    .expect("the test finished within 300 s");
}

/// The uid of the resource a `write -o json` printed.
fn printed_uid(run: &Run) -> String {
    let v: serde_json::Value =
        serde_json::from_str(&run.stdout).unwrap_or_else(|e| panic!("{e}: {run:?}"));
    v["id"]["uid"]
        .as_str()
        .unwrap_or_else(|| panic!("no uid in {run:?}"))
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_subject_stands_in_for_a_token() {
    // Over TLS, a client certificate whose subject a grant names makes its
    // holder that grant's caller, through the client library and the CLI
    // (flags and environment). `dashboards` may read Things in default/*:
    // it reads, lists and watches inside that scope only, and cannot write
    // (PERMISSION_DENIED naming the permission, exit code 6). A certificate
    // from the same CA whose subject no grant names, and a client with no
    // certificate, are UNAUTHENTICATED.
    tokio::time::timeout(Duration::from_secs(300), async {
        let dir = tempfile::tempdir().unwrap();
        let certs = dir.path().join("tls");
        let certs_text = certs.to_str().unwrap();
        succeeded(cairn(&["tls", "init", certs_text], None).await, "tls init");
        for name in ["dashboards", "stranger"] {
            let run = succeeded(
                cairn(&["tls", "client-cert", certs_text, name], None).await,
                "tls client-cert",
            );
            assert!(
                run.stdout.contains(&format!("subject = \"{name}\"")),
                "{run:?}"
            );
        }
        let (mut o, tokens) = auth_options(
            3,
            dir.path(),
            r#"
[[auth.grants]]
name = "dashboards"
subject = "dashboards"
read = { types = ["demo.Thing"], tenancies = ["default/*"] }
"#,
        )
        .await;
        o.extra_args.extend([
            "--tls-cert-file".to_string(),
            format!("{certs_text}/node-{{id}}.pem"),
            "--tls-key-file".to_string(),
            format!("{certs_text}/node-{{id}}-key.pem"),
            "--tls-ca-file".to_string(),
            format!("{certs_text}/ca.pem"),
        ]);
        let ca = certs.join("ca.pem");
        let files = |name: &str| {
            (
                certs.join(format!("client-{name}.pem")),
                certs.join(format!("client-{name}-key.pem")),
            )
        };
        // The harness's own admin calls: the default client certificate
        // (its subject has no grant) and the admin token, which decides.
        o.client_tls = Some(TlsOptions {
            ca_file: Some(ca.clone()),
            cert_file: Some(certs.join("client.pem")),
            key_file: Some(certs.join("client-key.pem")),
        });
        let cluster = Cluster::start(o);
        cluster.wait_for_leader(LEADER_TIMEOUT).await;
        let endpoints = cluster.endpoints();
        let tls_client = |certificate: Option<&str>, token: Option<&str>| {
            let (cert_file, key_file) = certificate.map(&files).unzip();
            Client::new(
                &endpoints,
                ClientOptions {
                    tls: Some(TlsOptions {
                        ca_file: Some(ca.clone()),
                        cert_file,
                        key_file,
                    }),
                    token: token.map(|t| BearerToken::new(t).unwrap()),
                    ..client_options()
                },
            )
            .unwrap()
        };
        let ops = tls_client(None, Some(&tokens.ops));
        let dashboards = tls_client(Some("dashboards"), None);
        let stranger = tls_client(Some("stranger"), None);
        let nobody = tls_client(None, None);
        let dd = || tenancy("default", "default");

        // A watch of every Thing, opened before anything exists.
        let mut watch = dashboards.watch_list(every_thing()).await.unwrap();
        assert_eq!(snapshot_of(&mut watch).await, BTreeSet::new());
        for (kind, name, t) in [
            ("Thing", "d1", dd()),
            ("Thing", "a1", tenancy("team-a", "web")),
            ("Thing", "d2", tenancy("default", "x")),
            ("Other", "o1", dd()),
        ] {
            ops.create(resource(kind, name, t, None)).await.unwrap();
        }

        // The client library.
        assert_eq!(next_change(&mut watch).await, "default/default/d1");
        assert_eq!(next_change(&mut watch).await, "default/x/d2");
        reads_only_things_in_default(&dashboards, "dashboards").await;
        assert_eq!(
            list_things(&dashboards, tenancy("*", "*"), Consistency::Strong)
                .await
                .unwrap(),
            set(&["default/default/d1", "default/x/d2"])
        );
        for outsider in [&stranger, &nobody] {
            unauthenticated(
                outsider
                    .read(at("Thing", "d1", dd()), Consistency::Eventual)
                    .await,
            );
            unauthenticated(list_things(outsider, tenancy("*", "*"), Consistency::Eventual).await);
        }

        // The CLI, with flags and with the environment.
        let e = endpoints.join(",");
        let e = e.as_str();
        let t = "demo.v1.Thing";
        let (cert, key) = files("dashboards");
        let flags = Credential::CertificateFlags {
            ca: &ca,
            cert: &cert,
            key: &key,
        };
        let env = Credential::CertificateEnv {
            ca: &ca,
            cert: &cert,
            key: &key,
        };
        let run = cairn_as(
            e,
            &flags,
            &["read", "--type", t, "--name", "d1", "-o", "json"],
        )
        .await;
        assert_eq!(
            printed(&succeeded(run, "read d1")),
            set(&["default/default/d1"])
        );
        let run = cairn_as(
            e,
            &env,
            &["list", "--type", t, "--tenancy", "*/*", "-o", "json"],
        )
        .await;
        assert_eq!(
            printed(&succeeded(run, "list */*")),
            set(&["default/default/d1", "default/x/d2"])
        );
        let run = cairn_as(
            e,
            &flags,
            &[
                "watch",
                "--type",
                t,
                "--tenancy",
                "*/*",
                "--max-events",
                "3",
                "-o",
                "json",
            ],
        )
        .await;
        assert_eq!(
            printed(&succeeded(run, "watch */*")),
            set(&["default/default/d1", "default/x/d2"])
        );
        refused(
            cairn_as(
                e,
                &env,
                &[
                    "read",
                    "--type",
                    t,
                    "--name",
                    "a1",
                    "--tenancy",
                    "team-a/web",
                ],
            )
            .await,
            "read a1",
            "read on demo.v1.Thing in team-a/web",
        );
        refused(
            cairn_as(e, &env, &["write", "--type", t, "--name", "x"]).await,
            "write",
            "grant \"dashboards\" lacks write on demo.v1.Thing in default/default",
        );
        refused(
            cairn_as(e, &flags, &["delete", "--type", t, "--name", "d1"]).await,
            "delete",
            "write on demo.v1.Thing in default/default",
        );
        refused(
            cairn_as(e, &flags, &["status"]).await,
            "status",
            "\"dashboards\" lacks admin",
        );
        let (stranger_cert, stranger_key) = files("stranger");
        let stranger_env = Credential::CertificateEnv {
            ca: &ca,
            cert: &stranger_cert,
            key: &stranger_key,
        };
        refused(
            cairn_as(e, &stranger_env, &["read", "--type", t, "--name", "d1"]).await,
            "a certificate without a grant",
            "\"stranger\" matches no grant",
        );
        let ca_text = ca.display().to_string();
        refused(
            cairn_as(
                e,
                &Credential::Nothing,
                &["read", "--type", t, "--name", "d1", "--cacert", &ca_text],
            )
            .await,
            "no certificate and no token",
            "unauthenticated",
        );
        drop(cluster);
    })
    .await
    .expect("the test finished within 300 s");
}

/// Whether a ListByOwner was refused by `list_results_max`.
fn over_the_list_limit<T: std::fmt::Debug>(result: Result<T, ClientError>) -> bool {
    match result {
        Err(ClientError::ResourceExhausted { limit, .. }) => limit == "list_results_max",
        other => panic!("expected RESOURCE_EXHAUSTED on list_results_max, got {other:?}"),
    }
}

/// The first page of a list of every Thing in every tenancy: its names,
/// and whether a next page follows.
async fn first_page_of_things(
    c: &Client,
    consistency: Consistency,
) -> Result<(BTreeSet<String>, bool), ClientError> {
    let page = c
        .list_page(ListRequest {
            r#type: Some(type_of("Thing")),
            tenancy: Some(tenancy("*", "*")),
            consistency: consistency as i32,
            ..ListRequest::default()
        })
        .await?;
    Ok((names(&page.resources), !page.next_page_token.is_empty()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_pages_and_the_owner_limit_count_only_what_the_caller_may_see() {
    // With list_page_size_max = 3 and list_results_max = 3: seven Things
    // match a list of every tenancy, two of them (and two children of one
    // owner) inside the reader's scope, first in key order but for one
    // outside it. The reader's first page holds its two and ends the
    // listing, eventual and strong, at the leader and through a follower
    // (whose strong list is forwarded with the reader's scope): a page that
    // counted what the reader may not see would end early, with a token,
    // and tell it that more exists. Its ListByOwner lists its two. ops, who
    // sees all seven, gets a page of three and a token, all seven by
    // following the pages, and a refused ListByOwner; once the reader's own
    // Things pass three, its page fills and its ListByOwner is refused too.
    tokio::time::timeout(Duration::from_secs(300), async {
        let dir = tempfile::tempdir().unwrap();
        let (o, tokens) = auth_options(3, dir.path(), "").await;
        // Top-level keys go before `[auth]`.
        let config = dir.path().join("auth.toml");
        let grants = std::fs::read_to_string(&config).unwrap();
        std::fs::write(
            &config,
            format!("list_results_max = 3\nlist_page_size_max = 3\n{grants}"),
        )
        .unwrap();
        let cluster = Cluster::start(o);
        let leader = cluster.wait_for_leader(LEADER_TIMEOUT).await;
        let follower = cluster.ids().into_iter().find(|id| *id != leader).unwrap();
        let endpoints = cluster.endpoints();
        let ops = client(&endpoints, Some(&tokens.ops));
        let reader = client(&endpoints, Some(&tokens.reader));
        let reader_on_follower = client(
            &[cluster.node(follower).client_address.clone()],
            Some(&tokens.reader),
        );
        let dd = || tenancy("default", "default");
        let owner = ops
            .create(resource("Other", "owner", dd(), None))
            .await
            .unwrap()
            .id;
        for (name, t) in [
            ("d1", dd()),
            ("c1", tenancy("", "web")),
            ("d2", tenancy("default", "x")),
            ("a1", tenancy("team-a", "web")),
            ("a2", tenancy("team-a", "web")),
            ("a3", tenancy("team-a", "db")),
            ("b1", tenancy("team-b", "web")),
        ] {
            ops.create(resource("Thing", name, t, owner.clone()))
                .await
                .unwrap();
        }
        let mine = set(&["default/default/d1", "default/x/d2"]);
        for c in [&reader, &reader_on_follower] {
            for consistency in [Consistency::Strong, Consistency::Eventual] {
                assert!(
                    eventually(Duration::from_secs(10), || {
                        let c = c.clone();
                        let mine = mine.clone();
                        async move {
                            first_page_of_things(&c, consistency).await.unwrap()
                                == (mine, false)
                        }
                    })
                    .await,
                    "the reader's first page is its two Things, and the last ({consistency:?})"
                );
                assert_eq!(
                    list_things(c, tenancy("*", "*"), consistency).await.unwrap(),
                    mine
                );
            }
            let owned = c.list_by_owner(owner.clone().unwrap()).await.unwrap();
            assert_eq!(names(&owned.resources), mine);
        }
        let (page, more) = first_page_of_things(&ops, Consistency::Strong)
            .await
            .unwrap();
        assert_eq!((page.len(), more), (3, true));
        assert_eq!(
            list_things(&ops, tenancy("*", "*"), Consistency::Strong)
                .await
                .unwrap()
                .len(),
            7
        );
        assert!(over_the_list_limit(
            ops.list_by_owner(owner.clone().unwrap()).await
        ));
        for name in ["d3", "d4"] {
            ops.create(resource("Thing", name, dd(), owner.clone()))
                .await
                .unwrap();
        }
        for c in [&reader, &reader_on_follower] {
            let (page, more) = first_page_of_things(c, Consistency::Strong).await.unwrap();
            assert_eq!((page.len(), more), (3, true));
            assert_eq!(
                list_things(c, tenancy("*", "*"), Consistency::Strong)
                    .await
                    .unwrap()
                    .len(),
                4
            );
        }
        // ListByOwner is served locally: a follower may lag a moment.
        assert!(
            eventually(Duration::from_secs(10), || {
                let (reader, owner) = (reader.clone(), owner.clone().unwrap());
                async move {
                    matches!(
                        reader.list_by_owner(owner).await,
                        Err(ClientError::ResourceExhausted { limit, .. }) if limit == "list_results_max"
                    )
                }
            })
            .await,
            "the reader's ListByOwner is refused once four of its Things are owned"
        );
        drop(cluster);
    })
    .await
    .expect("the test finished within 300 s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn joining_as_a_voter_needs_an_admin_token() {
    // A node whose node token has no admin grant cannot join; one with the
    // admin token joins and becomes a voter. A cluster without grants says
    // in its log that the client port is unauthenticated; one with grants
    // does not.
    tokio::time::timeout(Duration::from_secs(240), async {
        let dir = tempfile::tempdir().unwrap();
        let (mut cluster, tokens) = auth_cluster(3, dir.path()).await;
        let log = cluster.log_of(1);
        assert!(!log.contains("unauthenticated"), "{log}");
        let via = cluster.node(1).client_address.clone();

        // Node 4 presents the reader's token: refused, never a member.
        let reader_config = dir.path().join("reader-node.toml");
        let reader_token_file = dir.path().join("reader.token");
        std::fs::write(&reader_token_file, &tokens.reader).unwrap();
        let config = std::fs::read_to_string(dir.path().join("auth.toml"))
            .unwrap()
            .replace(
                &dir.path().join("node.token").display().to_string(),
                &reader_token_file.display().to_string(),
            );
        std::fs::write(&reader_config, config).unwrap();
        let admin_args = cluster.options.extra_args.clone();
        cluster.options.extra_args = vec!["--config".into(), reader_config.display().to_string()];
        let refused = cluster.add_joining_node(&via);
        assert!(
            eventually(Duration::from_secs(20), || {
                let log = cluster.log_of(refused);
                async move { log.contains("permission denied") }
            })
            .await,
            "{}",
            cluster.log_of(refused)
        );
        let status = cluster.status(1).await.unwrap();
        assert!(status.members.iter().all(|m| m.id != refused), "{status:?}");
        cluster.forget(refused);

        // With the admin token it joins as a voter.
        cluster.options.extra_args = admin_args;
        let joined = cluster.add_joining_node(&via);
        assert!(
            cluster.wait_voter(1, joined, Duration::from_secs(30)).await,
            "node {joined} did not become a voter: {}",
            cluster.log_of(joined)
        );
        drop(cluster);

        // Without grants, the start-up log says the port is open.
        let plain = Cluster::start(options(1));
        plain.wait_for_leader(LEADER_TIMEOUT).await;
        assert!(
            eventually(Duration::from_secs(5), || {
                let log = plain.log_of(1);
                async move { log.contains("the client port is unauthenticated") }
            })
            .await,
            "{}",
            plain.log_of(1)
        );
    })
    .await
    .expect("the test finished within 240 s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_commands_make_and_hash_tokens_and_bad_configs_are_refused() {
    // `cairn token new` output hashes back with `cairn token hash`; a node
    // with a malformed grant refuses to start and names the field.
    let (token, hash_line) = new_token().await;
    let run = cairn(&["token", "hash"], Some(&format!("{token}\n"))).await;
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(run.stdout.trim(), hash_line);

    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("bad.toml");
    std::fs::write(
        &config,
        "[[auth.grants]]\nname = \"app\"\ntoken_sha256 = \"not-a-hash\"\nadmin = true\n",
    )
    .unwrap();
    let run = cairn(
        &[
            "agent",
            "--config",
            config.to_str().unwrap(),
            "--node-id",
            "1",
            "--members",
            "1=127.0.0.1:1/127.0.0.1:2",
            "--data-dir",
            dir.path().join("data").to_str().unwrap(),
        ],
        None,
    )
    .await;
    assert_eq!(run.code, 2, "{run:?}");
    assert!(
        run.stderr.contains("auth.grants") && run.stderr.contains("64 hex digits"),
        "{run:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_progress_reaches_only_the_watches_its_caller_opened() {
    // The reader opens a watch on one node. Another token (ops, which may
    // read everything) names that watch in WatchProgress: nothing is queued on
    // it and the answer does not list it, so no one can fill another caller's
    // watch buffer with Progress events. The reader's own call does reach it.
    let dir = tempfile::tempdir().unwrap();
    let (cluster, tokens) = auth_cluster(1, dir.path()).await;
    let endpoint = cluster.node(1).client_address.clone();
    let reader = client(std::slice::from_ref(&endpoint), Some(&tokens.reader));
    let ops = client(std::slice::from_ref(&endpoint), Some(&tokens.ops));
    let mut request = every_thing();
    request.tenancy = Some(tenancy("default", "*"));
    let mut watch = reader
        .watch_list(request)
        .await
        .expect("the reader's watch");
    snapshot_of(&mut watch).await;
    let id = watch.watch_id().expect("the node names its watch");

    let foreign = ops
        .watch_progress(watch.endpoint(), vec![id])
        .await
        .expect("ops may ask");
    assert!(
        foreign.delivered_watch_ids.is_empty(),
        "another caller's progress reached the watch: {foreign:?}"
    );
    let quiet = tokio::time::timeout(Duration::from_millis(500), watch.next()).await;
    assert!(
        quiet.is_err(),
        "no event after another caller's WatchProgress: {quiet:?}"
    );

    let own = reader
        .watch_progress(watch.endpoint(), vec![id])
        .await
        .expect("the reader may ask");
    assert_eq!(own.delivered_watch_ids, vec![id], "{own:?}");
    let event = next_event(&mut watch).await;
    assert!(
        matches!(event.event, Some(watch_event::Event::Progress(_))),
        "{event:?}"
    );
    assert!(event.revision >= own.revision, "{event:?} vs {own:?}");
}
