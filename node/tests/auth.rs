//! Tokens, roles and scopes against real `cairn` processes: each role is
//! allowed exactly what its grant says and refused the rest, through the
//! client library and through the CLI, on the leader and through a follower
//! (whose forwarding hop must not let anything past); lists, ListByOwner and
//! watches show only what lies inside the caller's read scope, also for a
//! watch opened before out-of-scope writes and after a restore.

mod client_support;

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use cairn_client::{BearerToken, Client, ClientError, ClientOptions};
use cairn_proto::v1::admin_service_client::AdminServiceClient;
use cairn_proto::v1::{
    self as pb, watch_event, Consistency, Id, Resource, Tenancy, WatchListRequest,
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
}

/// `cairn token new`: line 1 the token, line 2 its `token_sha256` line.
async fn new_token() -> (String, String) {
    let run = cairn(&["token", "new"], None).await;
    assert_eq!(run.code, 0, "{run:?}");
    let mut lines = run.stdout.lines();
    let token = lines.next().expect("a token line").to_string();
    let hash_line = lines.next().expect("a hash line").to_string();
    assert!(hash_line.starts_with("token_sha256 = \""), "{hash_line}");
    (token, hash_line)
}

/// Writes the `[auth]` config every node of the test cluster loads.
async fn write_auth_config(dir: &Path) -> (Tokens, std::path::PathBuf) {
    let (admin, admin_hash) = new_token().await;
    let (ops, ops_hash) = new_token().await;
    let (reader, reader_hash) = new_token().await;
    let (team_a, team_a_hash) = new_token().await;
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
"#,
        node_token_file.display()
    );
    let path = dir.join("auth.toml");
    std::fs::write(&path, config).unwrap();
    let tokens = Tokens {
        admin,
        ops,
        reader,
        team_a,
    };
    (tokens, path)
}

/// A cluster of `nodes` whose config holds the grants above.
async fn auth_cluster(nodes: usize, dir: &Path) -> (Cluster, Tokens) {
    let (tokens, config) = write_auth_config(dir).await;
    let mut o = options(nodes);
    o.extra_args = vec!["--config".into(), config.display().to_string()];
    o.admin_token = Some(tokens.admin.clone());
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
    c.list(type_of("Thing"), t, "", consistency)
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

/// The next Upsert or Delete of a watch (markers skipped), as "p/ns/name".
async fn next_change(watch: &mut cairn_client::WatchStream) -> String {
    loop {
        let event = tokio::time::timeout(Duration::from_secs(20), watch.next())
            .await
            .expect("a watch event within 20 s")
            .expect("the watch is open")
            .expect("no watch error");
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
            .watch_list(WatchListRequest {
                r#type: Some(type_of("Thing")),
                tenancy: Some(tenancy("*", "*")),
                name_prefix: String::new(),
                start_revision: 0,
            })
            .await
            .unwrap();

        // No token, or an unknown one: UNAUTHENTICATED for data and admin calls.
        unauthenticated(anonymous.create(resource("Thing", "x", dd(), None)).await);
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
        reader
            .read(at("Thing", "d1", dd()), Consistency::Strong)
            .await
            .unwrap();
        denied(
            reader
                .read(
                    at("Thing", "a1", tenancy("team-a", "web")),
                    Consistency::Strong,
                )
                .await,
            "read on demo.v1.Thing in team-a/web",
        );
        denied(
            reader
                .read(at("Other", "o1", dd()), Consistency::Eventual)
                .await,
            "read on demo.v1.Other in default/default",
        );
        denied(
            reader.create(resource("Thing", "r1", dd(), None)).await,
            "write on demo.v1.Thing in default/default",
        );
        denied(
            reader.delete(at("Thing", "d1", dd()), "").await,
            "write on demo.v1.Thing in default/default",
        );
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

        // admin: every admin call, no data.
        denied(
            admin
                .read(at("Thing", "d1", dd()), Consistency::Eventual)
                .await,
            "read on demo.v1.Thing",
        );
        for token in [&tokens.reader, &tokens.ops, &tokens.team_a] {
            let mut c = admin_call(&cluster.node(follower).client_address, Some(token)).await;
            let e = c.status(pb::StatusRequest {}).await.unwrap_err();
            assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
            assert!(e.message().contains("admin (for Status)"), "{e:?}");
            let e = c
                .trigger_election(pb::TriggerElectionRequest {})
                .await
                .unwrap_err();
            assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
            let e = c
                .remove_member(pb::RemoveMemberRequest { id: follower })
                .await
                .unwrap_err();
            assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
            let e = c
                .add_learner(pb::AddLearnerRequest {
                    id: 9,
                    peer_address: "127.0.0.1:1".into(),
                    client_address: "127.0.0.1:2".into(),
                })
                .await
                .unwrap_err();
            assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
            let e = c
                .promote(pb::PromoteRequest { id: follower })
                .await
                .unwrap_err();
            assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
            let e = c
                .transfer_leader(pb::TransferLeaderRequest { to: 0 })
                .await
                .unwrap_err();
            assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
            let e = c
                .save_snapshot(pb::SaveSnapshotRequest {})
                .await
                .unwrap_err();
            assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
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

/// Runs `cairn` with `CAIRN_TOKEN` set (or removed) and the given args.
async fn cairn_with_env_token(args: &[&str], token: Option<&str>) -> Run {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_cairn"));
    command
        .args(args)
        .env_remove("CAIRN_ENDPOINTS")
        .env_remove("CAIRN_TOKEN");
    if let Some(t) = token {
        command.env("CAIRN_TOKEN", t);
    }
    let output = tokio::time::timeout(Duration::from_secs(60), command.output())
        .await
        .expect("cairn finished within 60 s")
        .expect("cairn runs");
    Run {
        code: output.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
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

        // No token: exit 6 and a hint.
        let run = cairn(&["list", "--endpoints", e, "--type", t], None).await;
        assert_eq!(run.code, 6, "{run:?}");
        assert!(run.stderr.contains("unauthenticated"), "{run:?}");
        let run = cairn(&["status", "--endpoints", e], None).await;
        assert_eq!(run.code, 6, "{run:?}");

        // ops writes in two tenancies (flag), team-a in its own (env).
        for tenancy in ["default/default", "team-b/web"] {
            let run = cairn(
                &[
                    "write",
                    "--endpoints",
                    e,
                    "--token",
                    &tokens.ops,
                    "--type",
                    t,
                    "--name",
                    "n1",
                    "--tenancy",
                    tenancy,
                ],
                None,
            )
            .await;
            assert_eq!(run.code, 0, "{run:?}");
        }
        let run = cairn_with_env_token(
            &[
                "write",
                "--endpoints",
                e,
                "--type",
                t,
                "--name",
                "n2",
                "--tenancy",
                "team-a/web",
            ],
            Some(&tokens.team_a),
        )
        .await;
        assert_eq!(run.code, 0, "{run:?}");
        let run = cairn_with_env_token(
            &["write", "--endpoints", e, "--type", t, "--name", "n3"],
            Some(&tokens.team_a),
        )
        .await;
        assert_eq!(run.code, 6, "{run:?}");
        assert!(
            run.stderr
                .contains("write on demo.v1.Thing in default/default"),
            "{run:?}"
        );

        // The reader's list and watch show only default/*.
        let reader_list = |token: String| async move {
            let run = cairn_with_env_token(
                &[
                    "list",
                    "--endpoints",
                    e,
                    "--type",
                    t,
                    "--tenancy",
                    "*/*",
                    "-o",
                    "json",
                ],
                Some(&token),
            )
            .await;
            assert_eq!(run.code, 0, "{run:?}");
            let v: serde_json::Value = serde_json::from_str(&run.stdout).unwrap();
            v["resources"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| {
                    format!(
                        "{}/{}",
                        r["id"]["tenancy"]["partition"].as_str().unwrap(),
                        r["id"]["name"].as_str().unwrap()
                    )
                })
                .collect::<BTreeSet<_>>()
        };
        assert_eq!(
            reader_list(tokens.reader.clone()).await,
            set(&["default/n1"])
        );
        assert_eq!(
            reader_list(tokens.ops.clone()).await,
            set(&["default/n1", "team-a/n2", "team-b/n1"])
        );
        let run = cairn(
            &[
                "watch",
                "--endpoints",
                e,
                "--token",
                &tokens.reader,
                "--type",
                t,
                "--tenancy",
                "*/*",
                "--max-events",
                "2",
                "-o",
                "json",
            ],
            None,
        )
        .await;
        assert_eq!(run.code, 0, "{run:?}");
        assert!(
            run.stdout.contains("\"n1\"") && !run.stdout.contains("team-"),
            "{run:?}"
        );

        // Admin commands: refused for the data roles, allowed for admin.
        let backup = dir.path().join("backup.snap");
        let backup = backup.to_str().unwrap();
        for token in [&tokens.reader, &tokens.ops] {
            for args in [
                vec!["status", "--endpoints", e, "--token", token],
                vec![
                    "snapshot",
                    "save",
                    backup,
                    "--endpoints",
                    e,
                    "--token",
                    token,
                ],
                vec!["member", "remove", "3", "--endpoints", e, "--token", token],
                vec!["transfer-leader", "--endpoints", e, "--token", token],
            ] {
                let run = cairn(&args, None).await;
                assert_eq!(run.code, 6, "{args:?}: {run:?}");
                assert!(
                    run.stderr.contains("permission denied"),
                    "{args:?}: {run:?}"
                );
            }
        }
        assert!(!Path::new(backup).exists(), "a refused save writes no file");
        let run = cairn(
            &["status", "--endpoints", e, "--token", &tokens.admin],
            None,
        )
        .await;
        assert_eq!(run.code, 0, "{run:?}");
        assert_eq!(
            run.stdout.matches("true").count(),
            3,
            "three voters: {run:?}"
        );
        let run = cairn(
            &[
                "snapshot",
                "save",
                backup,
                "--endpoints",
                e,
                "--token",
                &tokens.admin,
            ],
            None,
        )
        .await;
        assert_eq!(run.code, 0, "{run:?}");

        // A write after the backup, then a restore: refused for ops, done by admin.
        let run = cairn(
            &[
                "write",
                "--endpoints",
                e,
                "--token",
                &tokens.ops,
                "--type",
                t,
                "--name",
                "later",
                "--tenancy",
                "default/x",
            ],
            None,
        )
        .await;
        assert_eq!(run.code, 0, "{run:?}");
        let run = cairn(
            &[
                "snapshot",
                "restore",
                backup,
                "--endpoints",
                e,
                "--token",
                &tokens.ops,
            ],
            None,
        )
        .await;
        assert_eq!(run.code, 6, "{run:?}");
        assert!(run.stderr.contains("\"ops\" lacks admin"), "{run:?}");
        let run = cairn_with_env_token(
            &["snapshot", "restore", backup, "--endpoints", e],
            Some(&tokens.admin),
        )
        .await;
        assert_eq!(run.code, 0, "{run:?}");
        // After the restore, the reader still sees only its scope (and not `later`).
        assert_eq!(
            reader_list(tokens.reader.clone()).await,
            set(&["default/n1"])
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
        let c = &cluster;
        assert!(
            eventually(Duration::from_secs(30), move || async move {
                c.status(1)
                    .await
                    .is_some_and(|s| s.members.iter().any(|m| m.id == joined && m.voter))
            })
            .await,
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
