//! The storage contract (docs/contract.md sections 2–3) as one set of checks
//! over `cairn_client::ResourceApi`, so that every implementation runs the
//! same checks: the remote `Client` and an embedded node's in-process client.
//! The rules are those `contract.rs` checks over raw gRPC, through the trait:
//! CAS writes, updates and conflicts, deletes with a version, strong and
//! eventual reads, lists with tenancy wildcards and prefixes, paging,
//! ListByOwner, watches (snapshot, EndOfSnapshot, live changes in order), and
//! the error kinds (NotFound, CasFailure, WrongUid, GroupVersionMismatch,
//! InvalidArgument naming its field).
//!
//! Strong checks must pass at once on any node; eventual ones (eventual reads
//! and lists, ListByOwner, watch snapshots) may retry for a few seconds, as a
//! follower's replica may lag. Each run uses its own group.
#![allow(dead_code)]

pub mod raw;

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cairn_client::api::{Event, EventKind, Listing, ResourceApi, Watch};
use cairn_client::ClientError;
use cairn_proto::google::protobuf::{Any, Timestamp};
use cairn_proto::v1::*;

/// How long an eventual check may retry on a lagging node.
pub const EVENTUAL_TIMEOUT: Duration = Duration::from_secs(5);

/// The implementation a run checks, and the names it uses.
pub struct Target<'a> {
    pub api: &'a dyn ResourceApi,
    pub label: String,
    pub group: String,
}

pub fn tenancy(partition: &str, namespace: &str) -> Tenancy {
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

pub fn version_number(r: &Resource) -> u64 {
    r.version
        .parse()
        .unwrap_or_else(|_| panic!("version {:?} is a decimal index", r.version))
}

/// Retries `check` until it returns Ok or the eventual timeout passes.
pub async fn eventually<F, Fut, T>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let deadline = Instant::now() + EVENTUAL_TIMEOUT;
    loop {
        match check().await {
            Ok(v) => return v,
            Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("{what}: not true within {EVENTUAL_TIMEOUT:?}: {e}"),
        }
    }
}

impl Target<'_> {
    pub fn ty(&self, kind: &str) -> Type {
        self.ty_v(kind, "v1")
    }

    fn ty_v(&self, kind: &str, group_version: &str) -> Type {
        Type {
            group: self.group.clone(),
            group_version: group_version.into(),
            kind: kind.into(),
        }
    }

    pub fn id(&self, kind: &str, name: &str, uid: &str) -> Id {
        Id {
            uid: uid.into(),
            name: name.into(),
            r#type: Some(self.ty(kind)),
            tenancy: Some(default_tenancy()),
        }
    }

    pub fn res(&self, kind: &str, name: &str, uid: &str, version: &str, data: &[u8]) -> Resource {
        Resource {
            id: Some(self.id(kind, name, uid)),
            version: version.into(),
            data: payload(data),
            ..Default::default()
        }
    }

    /// A write that must succeed.
    pub async fn put(&self, resource: Resource) -> Arc<Resource> {
        let name = resource
            .id
            .as_ref()
            .map(|i| i.name.clone())
            .unwrap_or_default();
        self.api
            .write(resource)
            .await
            .unwrap_or_else(|e| panic!("{}: write {name}: {e}", self.label))
    }

    pub async fn strong(&self, id: Id) -> Result<Arc<Resource>, ClientError> {
        self.api.read(id, Consistency::Strong).await
    }

    pub async fn eventual(&self, id: Id) -> Result<Arc<Resource>, ClientError> {
        self.api.read(id, Consistency::Eventual).await
    }

    pub fn list_request(
        &self,
        kind: &str,
        tenancy: Tenancy,
        prefix: &str,
        consistency: Consistency,
    ) -> ListRequest {
        ListRequest {
            r#type: Some(self.ty(kind)),
            tenancy: Some(tenancy),
            name_prefix: prefix.into(),
            consistency: consistency as i32,
            ..ListRequest::default()
        }
    }

    async fn watch(&self, kind: &str, prefix: &str, start_revision: u64) -> Watch {
        self.api
            .watch_list(WatchListRequest {
                r#type: Some(self.ty(kind)),
                tenancy: Some(tenancy("*", "*")),
                name_prefix: prefix.into(),
                start_revision,
                ..Default::default()
            })
            .await
            .unwrap_or_else(|e| panic!("{}: watch {kind}: {e}", self.label))
    }
}

fn names(resources: &[Arc<Resource>]) -> BTreeSet<String> {
    resources
        .iter()
        .map(|r| r.id.as_ref().expect("an id").name.clone())
        .collect()
}

fn set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|s| s.to_string()).collect()
}

fn assert_invalid(result: Result<impl std::fmt::Debug, ClientError>, field: &str, what: &str) {
    match result {
        Err(ClientError::InvalidArgument { field: f, .. }) => assert_eq!(f, field, "{what}"),
        other => panic!("{what}: expected InvalidArgument naming {field}, got {other:?}"),
    }
}

/// Every check, in order.
pub async fn check_the_contract(t: &Target<'_>) {
    let started = Instant::now();
    lifecycle_enabled(t).await;
    read_rules(t).await;
    write_rules(t).await;
    delete_rules(t).await;
    status_write_rules(t).await;
    list_rules(t).await;
    paging_rules(t).await;
    list_by_owner_rules(t).await;
    lifecycle_rules(t).await;
    watch_rules(t).await;
    selector_rules(t).await;
    invalid_arguments_name_their_field(t).await;
    println!("{}: the contract holds ({:?})", t.label, started.elapsed());
}

pub async fn read_rules(t: &Target<'_>) {
    // NotFound, uid rules, group-version check after the uid check, strong at
    // once, eventual eventually and never older afterwards.
    let absent = t.strong(t.id("Read", "absent", "")).await;
    assert_eq!(absent, Err(ClientError::NotFound), "{}", t.label);
    let written = t.put(t.res("Read", "r", "u1", "", b"1")).await;
    assert_eq!(t.strong(t.id("Read", "r", "")).await.unwrap(), written);
    assert_eq!(t.strong(t.id("Read", "r", "u1")).await.unwrap(), written);
    assert_eq!(
        t.strong(t.id("Read", "r", "u2")).await,
        Err(ClientError::NotFound),
        "a non-empty uid that differs is NotFound"
    );
    let mut v2 = t.id("Read", "r", "");
    v2.r#type = Some(t.ty_v("Read", "v2"));
    match t.strong(v2.clone()).await {
        Err(ClientError::GroupVersionMismatch { requested, stored }) => {
            assert_eq!(requested.group_version, "v2");
            assert_eq!(*stored, *written, "carries the stored resource");
        }
        other => panic!("{}: expected GroupVersionMismatch, got {other:?}", t.label),
    }
    v2.uid = "u2".into();
    assert_eq!(
        t.strong(v2).await,
        Err(ClientError::NotFound),
        "the uid check comes first"
    );
    let seen = eventually("eventual read of a write", || async {
        match t.eventual(t.id("Read", "r", "")).await {
            Ok(r) if r == written => Ok(r),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    // Monotonic on one node: eventual reads move from the old version to the
    // new one and never back.
    let updated = t
        .put(t.res("Read", "r", "u1", &written.version, b"2"))
        .await;
    let mut last = version_number(&seen);
    let deadline = Instant::now() + EVENTUAL_TIMEOUT;
    loop {
        let r = t.eventual(t.id("Read", "r", "")).await.unwrap();
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

pub async fn write_rules(t: &Target<'_>) {
    // Compare-and-set in the contract's order; every other field stored
    // exactly; the group version ignored.
    assert!(
        matches!(
            t.api.write(t.res("Write", "w", "u1", "7", b"x")).await,
            Err(ClientError::CasFailure(_))
        ),
        "a version given but nothing stored"
    );
    // The owner exists: a resource whose owner is gone is collected (`lifecycle_rules`).
    t.put(t.res("Owner", "o", "u-owner", "", b"o")).await;
    let rich = Resource {
        lease: 0,
        id: Some(t.id("Write", "w", "u1")),
        owner: Some(Box::new(t.id("Owner", "o", "u-owner"))),
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
    let mut expected = rich;
    expected.version = created.version.clone();
    // The store sets the generation: the version of the write that changed the data.
    expected.generation = created.version.clone();
    assert_eq!(
        *created, expected,
        "every other field stored exactly as given"
    );
    assert_eq!(*t.strong(t.id("Write", "w", "")).await.unwrap(), expected);

    let conflicts = [
        (
            t.res("Write", "w", "u1", "", b"x"),
            "CasFailure",
            "an empty version with something stored",
        ),
        (
            t.res("Write", "w", "u2", &created.version, b"x"),
            "WrongUid",
            "another uid",
        ),
        (
            t.res("Write", "w", "", &created.version, b"x"),
            "WrongUid",
            "an empty uid",
        ),
        (
            t.res("Write", "w", "u2", "1", b"x"),
            "WrongUid",
            "the uid is checked before the version",
        ),
        (
            t.res("Write", "w", "u1", "1", b"x"),
            "CasFailure",
            "a stale version",
        ),
    ];
    for (resource, kind, what) in conflicts {
        let e = t.api.write(resource).await.expect_err(what);
        let got = match e {
            ClientError::CasFailure(_) => "CasFailure",
            ClientError::WrongUid(_) => "WrongUid",
            ref other => panic!("{}: {what}: expected {kind}, got {other:?}", t.label),
        };
        assert_eq!(got, kind, "{}: {what}", t.label);
        assert!(e.is_cas_conflict() && e.outcome().is_definite(), "{what}");
    }
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
        Err(ClientError::GroupVersionMismatch { .. })
    ));
    let mut read_v2 = t.id("Write", "w", "");
    read_v2.r#type = Some(t.ty_v("Write", "v2"));
    assert_eq!(t.strong(read_v2).await.unwrap(), third);
}

pub async fn delete_rules(t: &Target<'_>) {
    // Idempotent on nothing stored, no-op on another lifetime, CAS on the
    // version, group version ignored.
    let delete = |id: Id, version: &str| t.api.delete(id, version.to_string());
    assert!(delete(t.id("Delete", "absent", "u1"), "").await.is_ok());
    let d = t.put(t.res("Delete", "d", "u1", "", b"x")).await;
    assert!(delete(t.id("Delete", "d", "u9"), &d.version).await.is_ok());
    assert_eq!(
        t.strong(t.id("Delete", "d", "")).await.unwrap(),
        d,
        "another lifetime's delete changes nothing"
    );
    for stale in ["1", ""] {
        assert!(
            matches!(
                delete(t.id("Delete", "d", "u1"), stale).await,
                Err(ClientError::CasFailure(_))
            ),
            "{}: delete at version {stale:?}",
            t.label
        );
    }
    let mut other_version = t.id("Delete", "d", "u1");
    other_version.r#type = Some(t.ty_v("Delete", "v7"));
    let revision = delete(other_version, &d.version).await.unwrap();
    assert!(revision > version_number(&d));
    assert_eq!(
        t.strong(t.id("Delete", "d", "")).await,
        Err(ClientError::NotFound)
    );
    // The key can live again under a new uid.
    let again = t.put(t.res("Delete", "d", "u2", "", b"y")).await;
    assert!(version_number(&again) > revision);
}

/// A status write of `key` to `id` at `version` ("" = any).
fn status_request(id: Id, key: &str, observed: &str, version: &str) -> WriteStatusRequest {
    WriteStatusRequest {
        fence: None,
        id: Some(id),
        key: key.into(),
        status: Some(Status {
            observed_generation: observed.into(),
            conditions: vec![Condition {
                r#type: "Ready".into(),
                state: condition::State::True as i32,
                ..Condition::default()
            }],
            updated_at: None,
        }),
        version: version.into(),
    }
}

pub async fn status_write_rules(t: &Target<'_>) {
    // One entry of the status map, checked against the uid and, only when given, the
    // version; a new version, the same generation, data and other entries.
    let stored = t
        .put(Resource {
            generation: "g1".into(),
            metadata: BTreeMap::from([("team".to_string(), "blue".to_string())]),
            status: BTreeMap::from([("other".to_string(), Status::default())]),
            ..t.res("Status", "s", "u1", "", b"spec")
        })
        .await;
    // A cluster just started raises its cluster version to 0.2 within seconds; until
    // then the status write is refused (FailedPrecondition naming the cluster version).
    let first = eventually("the first status write", || async {
        match t
            .api
            .write_status(status_request(
                t.id("Status", "s", "u1"),
                "health",
                "g1",
                "",
            ))
            .await
        {
            Ok(written) => Ok(written),
            Err(ClientError::FailedPrecondition(message)) => Err(message),
            Err(other) => panic!("{}: status write: {other:?}", t.label),
        }
    })
    .await;
    assert!(version_number(&first) > version_number(&stored));
    assert_eq!(
        first.generation, stored.generation,
        "a status write keeps the generation"
    );
    assert_eq!(stored.generation, stored.version, "the store set it");
    assert_eq!(first.data, stored.data);
    assert_eq!(first.metadata, stored.metadata);
    assert_eq!(first.status.len(), 2, "the other entry is kept");
    assert_eq!(first.status["health"].observed_generation, "g1");
    assert_eq!(t.strong(t.id("Status", "s", "")).await.unwrap(), first);
    // A data write in between does not make a version-less status write conflict ...
    let updated = t
        .put(Resource {
            generation: "g2".into(),
            ..t.res("Status", "s", "u1", &first.version, b"spec 2")
        })
        .await;
    let second = t
        .api
        .write_status(status_request(
            t.id("Status", "s", "u1"),
            "health",
            "g2",
            "",
        ))
        .await
        .unwrap();
    assert_eq!(second.data, updated.data);
    assert_eq!(second.status["health"].observed_generation, "g2");
    // ... and one that names a version is a compare-and-set.
    assert!(
        matches!(
            t.api
                .write_status(status_request(
                    t.id("Status", "s", "u1"),
                    "health",
                    "x",
                    &first.version
                ))
                .await,
            Err(ClientError::CasFailure(_))
        ),
        "{}: a status write at a stale version",
        t.label
    );
    let third = t
        .api
        .write_status(status_request(
            t.id("Status", "s", "u1"),
            "health",
            "g3",
            &second.version,
        ))
        .await
        .unwrap();
    assert!(version_number(&third) > version_number(&second));
    // Another lifetime, or nothing stored: NotFound. No uid: InvalidArgument.
    assert_eq!(
        t.api
            .write_status(status_request(t.id("Status", "s", "u9"), "health", "g", ""))
            .await,
        Err(ClientError::NotFound)
    );
    assert_eq!(
        t.api
            .write_status(status_request(
                t.id("Status", "absent", "u1"),
                "health",
                "g",
                ""
            ))
            .await,
        Err(ClientError::NotFound)
    );
    assert_invalid(
        t.api
            .write_status(status_request(t.id("Status", "s", ""), "health", "g", ""))
            .await,
        "id.uid",
        "a status write without a uid",
    );
    assert_invalid(
        t.api
            .write_status(status_request(t.id("Status", "s", "u1"), "", "g", ""))
            .await,
        "key",
        "a status write without a key",
    );
}

pub async fn list_rules(t: &Target<'_>) {
    // Group + kind of any group version; tenancy field by field with "*";
    // case-sensitive name prefixes; empty results are empty lists.
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
            .api
            .list(t.list_request("Listed", tn.clone(), prefix, Consistency::Strong))
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
        assert!(strong.next_page_token.is_empty(), "a whole listing");
        eventually("eventual list", || async {
            let l = t
                .api
                .list(t.list_request("Listed", tn.clone(), prefix, Consistency::Eventual))
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
}

pub async fn paging_rules(t: &Target<'_>) {
    // A listing asked two at a time: every page at the first page's revision,
    // tokens to the end, no resource twice, together everything; and `list`
    // with the same page size gathers the same whole listing.
    let mut written = BTreeSet::new();
    for i in 0..7 {
        let name = format!("p{i}");
        t.put(t.res("Paged", &name, "u1", "", b"x")).await;
        written.insert(name);
    }
    let request = ListRequest {
        limit: 2,
        ..t.list_request("Paged", tenancy("*", "*"), "", Consistency::Strong)
    };
    let mut pages: Vec<Listing> = Vec::new();
    let mut token = String::new();
    loop {
        let page = t
            .api
            .list_page(ListRequest {
                page_token: token.clone(),
                ..request.clone()
            })
            .await
            .unwrap_or_else(|e| panic!("{}: page {}: {e}", t.label, pages.len()));
        assert!(page.resources.len() <= 2, "a page holds at most its limit");
        token = page.next_page_token.clone();
        pages.push(page);
        if token.is_empty() {
            break;
        }
        assert!(pages.len() < 10, "{}: the listing never ends", t.label);
    }
    assert_eq!(pages.len(), 4, "{}: 7 resources, 2 a page", t.label);
    let revision = pages[0].revision;
    assert!(pages.iter().all(|p| p.revision == revision), "one revision");
    let paged: Vec<Arc<Resource>> = pages.into_iter().flat_map(|p| p.resources).collect();
    assert_eq!(paged.len(), 7, "no resource twice");
    assert_eq!(names(&paged), written);
    let whole = t.api.list(request).await.unwrap();
    assert_eq!(names(&whole.resources), written);
    assert_eq!(whole.resources.len(), 7);
    assert!(whole.next_page_token.is_empty());
    // A token is bound to its listing: another filter's is refused, naming it.
    let first = t
        .api
        .list_page(ListRequest {
            limit: 2,
            ..t.list_request("Paged", tenancy("*", "*"), "", Consistency::Eventual)
        })
        .await
        .unwrap();
    assert_invalid(
        t.api
            .list_page(ListRequest {
                page_token: first.next_page_token,
                ..t.list_request("Other", tenancy("*", "*"), "", Consistency::Eventual)
            })
            .await,
        "page_token",
        "a token of another listing",
    );
}

pub async fn list_by_owner_rules(t: &Target<'_>) {
    // Owner equal on group, kind, tenancy, name and uid (group version
    // ignored); deleting an owned resource removes it; deleting the owner deletes
    // what it owned (`lifecycle_rules`). A local read: eventual on a follower.
    let owner = t.put(t.res("Owner", "boss", "u1", "", b"x")).await;
    let owner_id = owner.id.clone().unwrap();
    let owned = |name: &str, owner: Id| {
        let mut r = t.res("Owned", name, "u1", "", b"x");
        r.owner = Some(Box::new(owner));
        t.put(r)
    };
    let a = owned("a", owner_id.clone()).await;
    owned("b", owner_id.clone()).await;
    let mut other_version = owner_id.clone();
    other_version.r#type = Some(t.ty_v("Owner", "v9"));
    owned("d", other_version.clone()).await;

    let expect = |query: Id, expected: BTreeSet<String>| async move {
        eventually("list by owner", || {
            let query = query.clone();
            let expected = expected.clone();
            async move {
                let got = t
                    .api
                    .list_by_owner(query)
                    .await
                    .map_err(|e| e.to_string())?;
                if names(&got.resources) == expected {
                    Ok(())
                } else {
                    Err(format!("{:?} != {expected:?}", names(&got.resources)))
                }
            }
        })
        .await
    };
    expect(owner_id.clone(), set(&["a", "b", "d"])).await;
    expect(other_version.clone(), set(&["a", "b", "d"])).await;
    let mut unknown = owner_id.clone();
    unknown.uid = "u9".into();
    expect(unknown.clone(), set(&[])).await;
    // A resource naming a lifetime of the owner that is not stored is collected.
    owned("c", unknown.clone()).await;
    expect(unknown, set(&[])).await;

    t.api
        .delete(a.id.clone().unwrap(), a.version.clone())
        .await
        .unwrap();
    expect(owner_id.clone(), set(&["b", "d"])).await;
    t.api
        .delete(owner_id.clone(), owner.version.clone())
        .await
        .unwrap();
    expect(owner_id, set(&[])).await;
    for name in ["b", "d"] {
        assert_eq!(
            t.strong(t.id("Owned", name, "")).await,
            Err(ClientError::NotFound),
            "{}: {name} went with its owner",
            t.label
        );
    }
}

/// Waits until the target's cluster runs the lifecycle rules (cluster version 0.2, which
/// a cluster just started reaches within seconds): a write's generation is set by the
/// store.
pub async fn lifecycle_enabled(t: &Target<'_>) {
    let mut attempt = 0;
    eventually(
        "the store sets the generation (cluster version 0.2)",
        || {
            attempt += 1;
            let name = format!("probe-{attempt}");
            async move {
                let mut probe = t.res("Probe", &name, "u1", "", b"p");
                probe.generation = "mine".into();
                let written = t.api.write(probe).await.map_err(|e| e.to_string())?;
                match written.generation == written.version {
                    true => Ok(()),
                    false => Err(format!("generation {:?}", written.generation)),
                }
            }
        },
    )
    .await;
}

fn with_metadata(mut r: Resource, entries: &[(&str, &str)]) -> Resource {
    for (k, v) in entries {
        r.metadata.insert(k.to_string(), v.to_string());
    }
    r
}

fn delete_request(resource: &Resource, orphan: bool) -> DeleteRequest {
    DeleteRequest {
        id: resource.id.clone(),
        version: resource.version.clone(),
        fence: None,
        orphan_dependents: orphan,
    }
}

/// Waits until a strong read of `id` is NotFound.
async fn eventually_gone(t: &Target<'_>, id: Id, what: &str) {
    eventually(what, || {
        let id = id.clone();
        async move {
            match t.strong(id).await {
                Err(ClientError::NotFound) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        }
    })
    .await
}

pub async fn lifecycle_rules(t: &Target<'_>) {
    // The generation moves with data and metadata, never with status.
    let created = t.put(t.res("Life", "g", "u1", "", b"1")).await;
    assert_eq!(created.generation, created.version, "{}", t.label);
    let status = t
        .api
        .write_status(status_request(t.id("Life", "g", "u1"), "ctl", "x", ""))
        .await
        .unwrap();
    assert_eq!(
        status.generation, created.generation,
        "a status write keeps it"
    );
    let relabelled = t
        .put(with_metadata((*status).clone(), &[("app", "web")]))
        .await;
    assert_eq!(
        relabelled.generation, relabelled.version,
        "metadata moved it"
    );

    // A delete of a resource with finalizers marks it; it goes with its last finalizer.
    let held = t
        .put(with_metadata(
            t.res("Life", "held", "u1", "", b"1"),
            &[("finalizers", "a.example/x b.example/y")],
        ))
        .await;
    let answer = t
        .api
        .delete_request(delete_request(&held, false))
        .await
        .unwrap();
    assert!(answer.marked, "{}: only marked", t.label);
    let marked = t.strong(t.id("Life", "held", "")).await.unwrap();
    assert!(marked.metadata.contains_key("deletionTimestamp"));
    assert_eq!(version_number(&marked), answer.revision);
    let again = t.api.delete_request(delete_request(&marked, false)).await;
    assert!(
        again.is_ok_and(|a| a.marked),
        "deleting again: still marked"
    );
    match t
        .api
        .write(with_metadata(
            (*marked).clone(),
            &[("finalizers", "a.example/x b.example/y c.example/z")],
        ))
        .await
    {
        Err(ClientError::FailedPrecondition(message)) => {
            assert!(message.contains("may only remove finalizers"), "{message}")
        }
        other => panic!(
            "{}: adding a finalizer to a marked resource: {other:?}",
            t.label
        ),
    }
    let one_left = t
        .put(with_metadata(
            (*marked).clone(),
            &[("finalizers", "b.example/y")],
        ))
        .await;
    assert!(
        t.strong(t.id("Life", "held", "")).await.is_ok(),
        "one left: kept"
    );
    let mut last = (*one_left).clone();
    last.metadata.remove("finalizers");
    t.put(last).await;
    assert_eq!(
        t.strong(t.id("Life", "held", "")).await,
        Err(ClientError::NotFound),
        "{}: the last finalizer removed it",
        t.label
    );
    // Only the store marks.
    let self_marked = with_metadata(
        t.res("Life", "self", "u1", "", b"1"),
        &[("deletionTimestamp", "2026-01-01T00:00:00Z")],
    );
    assert_invalid(
        t.api.write(self_marked).await,
        "resource.metadata.deletionTimestamp",
        "a write may not mark",
    );

    // Deleting an owner deletes a chain three levels deep, and nothing else.
    let root = t.put(t.res("Life", "root", "u1", "", b"r")).await;
    let owned_by = |name: &str, owner: &Arc<Resource>| {
        let mut r = t.res("Life", name, "u1", "", b"x");
        r.owner = owner.id.clone().map(Box::new);
        t.put(r)
    };
    let child = owned_by("child", &root).await;
    owned_by("grandchild", &child).await;
    let other_root = t.put(t.res("Life", "other-root", "u1", "", b"r")).await;
    let other_child = owned_by("other-child", &other_root).await;
    let answer = t
        .api
        .delete_request(delete_request(&root, false))
        .await
        .unwrap();
    assert!(!answer.marked);
    for name in ["root", "child", "grandchild"] {
        eventually_gone(t, t.id("Life", name, ""), name).await;
    }
    assert_eq!(
        t.strong(t.id("Life", "other-child", "")).await.unwrap(),
        other_child
    );

    // An orphaning delete keeps the dependents, without their owner reference.
    let answer = t
        .api
        .delete_request(delete_request(&other_root, true))
        .await
        .unwrap();
    assert!(
        answer.marked,
        "{}: an owner being orphaned is marked first",
        t.label
    );
    eventually_gone(t, t.id("Life", "other-root", ""), "the orphaning owner").await;
    let orphan = t.strong(t.id("Life", "other-child", "")).await.unwrap();
    assert_eq!(orphan.owner, None, "{}: orphaned", t.label);
    assert_eq!(orphan.data, other_child.data);
}

pub async fn selector_rules(t: &Target<'_>) {
    // Lists and watches by metadata selector; a resource that stops matching leaves
    // the watch as a Delete, one that starts matching enters as an Upsert.
    let web = t
        .put(with_metadata(
            t.res("Sel", "a", "u1", "", b"1"),
            &[("app", "web"), ("env", "prod")],
        ))
        .await;
    t.put(with_metadata(
        t.res("Sel", "b", "u1", "", b"1"),
        &[("app", "api")],
    ))
    .await;
    t.put(with_metadata(
        t.res("Sel", "c", "u1", "", b"1"),
        &[("app", "web"), ("canary", "")],
    ))
    .await;
    let list = |selector: &str| {
        let mut r = t.list_request("Sel", tenancy("*", "*"), "", Consistency::Strong);
        r.selector = selector.into();
        async move {
            let listing = t.api.list(r).await.unwrap();
            names(&listing.resources)
        }
    };
    assert_eq!(list("app=web").await, set(&["a", "c"]));
    assert_eq!(list("app=web,!canary").await, set(&["a"]));
    assert_eq!(list("env in (prod,staging)").await, set(&["a"]));
    assert_eq!(list("app notin (web)").await, set(&["b"]));
    let mut bad = t.list_request("Sel", tenancy("*", "*"), "", Consistency::Strong);
    bad.selector = "app in prod".into();
    assert_invalid(t.api.list(bad).await, "selector", "bad selector syntax");

    let mut watch = t
        .api
        .watch_list(WatchListRequest {
            r#type: Some(t.ty("Sel")),
            tenancy: Some(tenancy("*", "*")),
            selector: "app=web".into(),
            consistency: Consistency::Strong as i32,
            ..Default::default()
        })
        .await
        .unwrap();
    let name = |r: &Arc<Resource>| r.id.as_ref().map(|i| i.name.clone()).unwrap_or_default();
    let mut snapshot = BTreeSet::new();
    loop {
        match next_event(&mut watch, &t.label).await.kind {
            EventKind::Upsert(r) => {
                snapshot.insert(name(&r));
            }
            EventKind::EndOfSnapshot => break,
            other => panic!("{}: {other:?} in a snapshot", t.label),
        }
    }
    assert_eq!(snapshot, set(&["a", "c"]));
    t.put(with_metadata((*web).clone(), &[("app", "api")]))
        .await;
    let b = t.strong(t.id("Sel", "b", "")).await.unwrap();
    t.put(with_metadata((*b).clone(), &[("app", "web")])).await;
    match next_event(&mut watch, &t.label).await.kind {
        EventKind::Delete(r) => assert_eq!(name(&r), "a", "a stopped matching"),
        other => panic!("{}: expected a's Delete, got {other:?}", t.label),
    }
    match next_event(&mut watch, &t.label).await.kind {
        EventKind::Upsert(r) => assert_eq!(name(&r), "b", "b started matching"),
        other => panic!("{}: expected b's Upsert, got {other:?}", t.label),
    }
}

/// The next event of a watch, within the eventual timeout.
pub async fn next_event(watch: &mut Watch, label: &str) -> Event {
    tokio::time::timeout(EVENTUAL_TIMEOUT, watch.next())
        .await
        .unwrap_or_else(|_| panic!("{label}: no watch event within {EVENTUAL_TIMEOUT:?}"))
        .unwrap_or_else(|| panic!("{label}: watch ended"))
        .unwrap_or_else(|e| panic!("{label}: watch failed: {e}"))
}

pub async fn watch_rules(t: &Target<'_>) {
    // A snapshot then exactly one EndOfSnapshot (first when nothing matches);
    // then every write and delete in commit order, no event for no-op
    // deletes; each event's state readable on the node at once; a watch from
    // a revision replays the changes after it.
    let mut empty = t.watch("Watched", "none-", 0).await;
    assert_eq!(
        next_event(&mut empty, &t.label).await.kind,
        EventKind::EndOfSnapshot
    );

    let w1 = t.put(t.res("Watched", "w1", "u1", "", b"1")).await;
    let w2 = t.put(t.res("Watched", "w2", "u1", "", b"1")).await;
    let mut stream = t.watch("Watched", "w", 0).await;
    // The snapshot and the live events together hold w1 and w2 once each (a
    // follower's snapshot may not have them yet).
    let mut snapshot = BTreeMap::new();
    loop {
        match next_event(&mut stream, &t.label).await.kind {
            EventKind::Upsert(r) => {
                let name = r.id.clone().unwrap().name;
                assert!(
                    snapshot.insert(name, r).is_none(),
                    "no duplicate in the snapshot"
                );
            }
            EventKind::EndOfSnapshot => break,
            other => panic!("{}: unexpected snapshot event {other:?}", t.label),
        }
    }
    for r in snapshot.values() {
        assert!(*r == w1 || *r == w2, "the snapshot holds what was written");
    }
    let mut pending: BTreeMap<String, Arc<Resource>> = [w1.clone(), w2.clone()]
        .into_iter()
        .map(|r| (r.id.clone().unwrap().name, r))
        .filter(|(name, _)| !snapshot.contains_key(name))
        .collect();
    while !pending.is_empty() {
        match next_event(&mut stream, &t.label).await.kind {
            EventKind::Upsert(r) => {
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
        .api
        .delete(t.id("Watched", "w2", "u1"), w2.version.clone())
        .await
        .unwrap();
    t.api
        .delete(t.id("Watched", "w9", "u1"), String::new())
        .await
        .unwrap(); // nothing stored
    t.api
        .delete(t.id("Watched", "w3", "other"), w3.version.clone())
        .await
        .unwrap(); // another lifetime
    let w4 = t.put(t.res("Watched", "w4", "u1", "", b"1")).await;

    let expected = [
        (EventKind::Upsert(w3.clone()), version_number(&w3)),
        (EventKind::Upsert(w1b.clone()), version_number(&w1b)),
        (EventKind::Delete(w2.clone()), w2_deleted_at),
        (EventKind::Upsert(w4.clone()), version_number(&w4)),
    ];
    for (want, revision) in expected {
        let e = next_event(&mut stream, &t.label).await;
        assert_eq!(
            e.kind, want,
            "{}: in commit order, no no-op delete",
            t.label
        );
        assert_eq!(e.revision, revision);
        // The node that sent the event already holds its state.
        let name = match &e.kind {
            EventKind::Upsert(r) | EventKind::Delete(r) => r.id.clone().unwrap().name,
            _ => unreachable!(),
        };
        let local = t.eventual(t.id("Watched", &name, "")).await;
        match e.kind {
            EventKind::Upsert(r) => assert_eq!(local.unwrap(), r, "{}: readable at once", t.label),
            _ => assert_eq!(local, Err(ClientError::NotFound)),
        }
    }

    // Replay from a revision: every change after it, no snapshot.
    let mut replay = t.watch("Watched", "w", version_number(&w3) - 1).await;
    let mut replayed = vec![];
    for _ in 0..4 {
        replayed.push(match next_event(&mut replay, &t.label).await.kind {
            EventKind::Upsert(r) => ("upsert", r.id.clone().unwrap().name),
            EventKind::Delete(r) => ("delete", r.id.clone().unwrap().name),
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

pub async fn invalid_arguments_name_their_field(t: &Target<'_>) {
    // Malformed input is InvalidArgument naming the field, for every call.
    let mut no_name = t.res("Bad", "", "u1", "", b"x");
    assert_invalid(
        t.api.write(no_name.clone()).await,
        "resource.id.name",
        "empty name",
    );
    no_name.id.as_mut().unwrap().r#type = Some(Type {
        group: t.group.clone(),
        group_version: "v1".into(),
        kind: String::new(),
    });
    no_name.id.as_mut().unwrap().name = "n".into();
    assert_invalid(
        t.api.write(no_name).await,
        "resource.id.type.kind",
        "no kind",
    );
    let huge = t.res("Bad", "n", "u1", "", &vec![0u8; 1024 * 1024 + 1]);
    assert_invalid(t.api.write(huge).await, "resource", "oversize resource");
    let star = t.res("Bad", "n*", "u1", "", b"x");
    assert_invalid(t.api.write(star).await, "resource.id.name", "'*' in a name");
    assert_invalid(
        t.api.read(t.id("Bad", "", ""), Consistency::Strong).await,
        "id.name",
        "read of an empty name",
    );
    assert_invalid(
        t.api.delete(t.id("Bad", "", "u1"), String::new()).await,
        "id.name",
        "delete of an empty name",
    );
    let unknown_consistency = ListRequest {
        consistency: 7,
        ..t.list_request("Bad", default_tenancy(), "", Consistency::Strong)
    };
    assert_invalid(
        t.api.list(unknown_consistency).await,
        "consistency",
        "unknown consistency value on a list",
    );
    assert_invalid(
        t.api
            .list(t.list_request("Bad", tenancy("p*", "n"), "", Consistency::Strong))
            .await,
        "tenancy.partition",
        "a '*' that does not stand alone",
    );
    let no_type = ListRequest {
        r#type: None,
        ..t.list_request("Bad", default_tenancy(), "", Consistency::Strong)
    };
    assert_invalid(
        t.api.list_page(no_type).await,
        "type",
        "a list without a type",
    );
    assert_invalid(
        t.api.list_by_owner(t.id("Bad", "", "u1")).await,
        "owner.name",
        "ListByOwner of an empty name",
    );
    let watch_without_type = t
        .api
        .watch_list(WatchListRequest {
            r#type: None,
            tenancy: Some(default_tenancy()),
            ..Default::default()
        })
        .await;
    assert_invalid(watch_without_type, "type", "a watch without a type");
}
