//! Every input limit of a real node, through its client port: the request
//! just under a limit is served, the one just over is refused with the
//! right code and a message naming the limit and its value, and another
//! client is served all along. The node runs with small limits from a
//! config file.

use crate::support;

use std::time::{Duration, Instant};

use cairn_proto::error::ApiError;
use cairn_proto::v1::admin_service_client::AdminServiceClient;
use cairn_proto::v1::resource_service_client::ResourceServiceClient;
use cairn_proto::v1::*;
use prost::Message;
use support::*;
use tonic::transport::Channel;

const LEADER_TIMEOUT: Duration = Duration::from_secs(20);

const LIMITS: &str = r#"
resource_bytes_max = 65536
client_message_bytes_max = 131072
name_bytes_max = 32
metadata_entries_max = 4
status_conditions_max = 3
list_results_max = 5
list_page_size_max = 5
watches_per_connection_max = 3
watches_max = 5
requests_per_connection_max = 4
restore_upload_bytes_max = 4096
"#;

/// A one-node cluster running with [`LIMITS`]; returns it and its client address.
async fn limited_node(dir: &tempfile::TempDir) -> (Cluster, String) {
    let config = dir.path().join("limits.toml");
    std::fs::write(&config, LIMITS).unwrap();
    let mut options = options(1);
    options.extra_args = vec!["--config".into(), config.display().to_string()];
    let cluster = Cluster::start(options);
    let leader = cluster.wait_for_leader(LEADER_TIMEOUT).await;
    let address = cluster.node(leader).client_address.clone();
    (cluster, address)
}

/// A channel is one HTTP/2 connection.
async fn connection(address: &str) -> Channel {
    tonic::transport::Endpoint::from_shared(format!("http://{address}"))
        .unwrap()
        .connect()
        .await
        .unwrap()
}

fn resources(channel: &Channel) -> ResourceServiceClient<Channel> {
    ResourceServiceClient::new(channel.clone())
        .max_decoding_message_size(64 * 1024 * 1024)
        .max_encoding_message_size(64 * 1024 * 1024)
}

/// The limit named by a ResourceExhausted, with its value; panics otherwise.
fn exhausted(e: ApiError) -> (String, u64, String) {
    match e {
        ApiError::ResourceExhausted {
            limit,
            value,
            reason,
        } => (limit, value, reason),
        other => panic!("expected ResourceExhausted, got {other:?}"),
    }
}

fn invalid_field(e: ApiError) -> (String, String) {
    match e {
        ApiError::InvalidArgument { field, reason } => (field, reason),
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
}

/// Another client, on its own connection, is served.
async fn bystander_is_served(address: &str) {
    let mut c = resources(&connection(address).await);
    let listed = c
        .list(ListRequest {
            r#type: Some(thing_type()),
            tenancy: Some(tenancy()),
            name_prefix: "zzz-none".into(),
            consistency: Consistency::Strong as i32,
            ..ListRequest::default()
        })
        .await;
    assert!(listed.is_ok(), "the bystander was refused: {listed:?}");
}

/// A resource whose encoding (or, with `request`, whose WriteRequest's
/// encoding) is exactly `size_bytes`.
fn sized(name: &str, size_bytes: usize, request: bool) -> Resource {
    let mut r = thing(name, "u1", "", b"");
    let measure = |r: &Resource| {
        if request {
            WriteRequest {
                fence: None,
                resource: Some(r.clone()),
            }
            .encoded_len()
        } else {
            r.encoded_len()
        }
    };
    let mut pad = size_bytes.saturating_sub(measure(&r));
    loop {
        r.data.as_mut().unwrap().value = bytes::Bytes::from(vec![b'x'; pad]);
        let len = measure(&r);
        if len == size_bytes {
            return r;
        }
        pad = if len > size_bytes {
            pad - (len - size_bytes)
        } else {
            pad + (size_bytes - len)
        };
    }
}

async fn write_on(
    c: &mut ResourceServiceClient<Channel>,
    r: Resource,
) -> Result<Resource, ApiError> {
    c.write(WriteRequest {
        resource: Some(r),
        fence: None,
    })
    .await
    .map(|r| r.into_inner().resource.unwrap())
    .map_err(ApiError::from)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_limit_serves_the_request_just_under_it_and_refuses_the_one_just_over() {
    let dir = tempfile::tempdir().unwrap();
    let (_cluster, address) = limited_node(&dir).await;
    let channel = connection(&address).await;
    let mut c = resources(&channel);

    // gRPC message size: a write request of exactly 128 KiB is decoded (and
    // then refused for its resource size); one byte more is refused unread.
    let e = write_on(&mut c, sized("big", 131072, true))
        .await
        .unwrap_err();
    assert_eq!(invalid_field(e).0, "resource");
    let (limit, value, reason) = exhausted(
        write_on(&mut c, sized("big", 131073, true))
            .await
            .unwrap_err(),
    );
    assert_eq!(
        (limit.as_str(), value),
        ("client_message_bytes_max", 131072)
    );
    assert!(
        reason.contains("client_message_bytes_max = 131072"),
        "{reason}"
    );
    bystander_is_served(&address).await;

    // Resource encoded size.
    write_on(&mut c, sized("r64k", 65536, false)).await.unwrap();
    let (field, reason) = invalid_field(
        write_on(&mut c, sized("r64k+", 65537, false))
            .await
            .unwrap_err(),
    );
    assert_eq!(field, "resource");
    assert!(reason.contains("resource_bytes_max = 65536"), "{reason}");

    // Name length and characters.
    write_on(&mut c, thing(&"n".repeat(32), "u1", "", b""))
        .await
        .unwrap();
    let (field, reason) = invalid_field(
        write_on(&mut c, thing(&"n".repeat(33), "u1", "", b""))
            .await
            .unwrap_err(),
    );
    assert_eq!(field, "resource.id.name");
    assert!(reason.contains("name_bytes_max = 32"), "{reason}");
    let (field, _) = invalid_field(
        write_on(&mut c, thing("a\u{7}b", "u1", "", b""))
            .await
            .unwrap_err(),
    );
    assert_eq!(field, "resource.id.name");
    let mut long_kind = thing("k", "u1", "", b"");
    long_kind.id.as_mut().unwrap().r#type.as_mut().unwrap().kind = "K".repeat(33);
    assert_eq!(
        invalid_field(write_on(&mut c, long_kind).await.unwrap_err()).0,
        "resource.id.type.kind"
    );
    let mut long_namespace = thing("t", "u1", "", b"");
    long_namespace
        .id
        .as_mut()
        .unwrap()
        .tenancy
        .as_mut()
        .unwrap()
        .namespace = "s".repeat(33);
    assert_eq!(
        invalid_field(write_on(&mut c, long_namespace).await.unwrap_err()).0,
        "resource.id.tenancy.namespace"
    );

    // Metadata entries.
    let mut meta = thing("meta", "u1", "", b"");
    for i in 0..4 {
        meta.metadata.insert(format!("k{i}"), "v".into());
    }
    write_on(&mut c, meta.clone()).await.unwrap();
    meta.metadata.insert("k4".into(), "v".into());
    meta.id.as_mut().unwrap().name = "meta2".into();
    let (field, reason) = invalid_field(write_on(&mut c, meta).await.unwrap_err());
    assert_eq!(field, "resource.metadata");
    assert!(reason.contains("metadata_entries_max = 4"), "{reason}");

    // Status conditions.
    let mut with_status = thing("status", "u1", "", b"");
    let condition = Condition {
        r#type: "Ready".into(),
        ..Default::default()
    };
    with_status.status.insert(
        "a".into(),
        Status {
            conditions: vec![condition.clone(), condition.clone()],
            ..Default::default()
        },
    );
    with_status.status.insert(
        "b".into(),
        Status {
            conditions: vec![condition.clone()],
            ..Default::default()
        },
    );
    write_on(&mut c, with_status.clone()).await.unwrap();
    with_status
        .status
        .get_mut("b")
        .unwrap()
        .conditions
        .push(condition);
    with_status.id.as_mut().unwrap().name = "status2".into();
    let (field, reason) = invalid_field(write_on(&mut c, with_status).await.unwrap_err());
    assert_eq!(field, "resource.status");
    assert!(reason.contains("status_conditions_max = 3"), "{reason}");
    bystander_is_served(&address).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_pages_stop_at_list_page_size_max_and_list_by_owner_at_list_results_max() {
    // Five matching resources list in one page that ends the listing
    // (eventual and strong). A sixth: the same list answers a page of five
    // and a token, also when the request asks for more (a larger limit is
    // capped, not refused), and the next page holds the sixth; a narrower
    // filter lists in one page. ListByOwner is not paged: five owned
    // resources are served, six are RESOURCE_EXHAUSTED naming
    // list_results_max.
    let dir = tempfile::tempdir().unwrap();
    let (_cluster, address) = limited_node(&dir).await;
    let mut c = resources(&connection(&address).await);
    let owner = id("owner", "u0");
    for i in 0..5 {
        let mut r = thing(&format!("item-{i}"), "u1", "", b"");
        r.owner = Some(Box::new(owner.clone()));
        write_on(&mut c, r).await.unwrap();
    }
    let list = |prefix: &str, consistency: Consistency, limit: u32| ListRequest {
        r#type: Some(thing_type()),
        tenancy: Some(tenancy()),
        name_prefix: prefix.into(),
        consistency: consistency as i32,
        limit,
        ..ListRequest::default()
    };
    for consistency in [Consistency::Eventual, Consistency::Strong] {
        let listed = c
            .list(list("item-", consistency, 0))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(listed.resources.len(), 5);
        assert!(
            listed.next_page_token.is_empty(),
            "one page ends the listing"
        );
    }
    let by_owner = ListByOwnerRequest {
        owner: Some(owner.clone()),
    };
    assert_eq!(
        c.list_by_owner(by_owner.clone())
            .await
            .unwrap()
            .into_inner()
            .resources
            .len(),
        5
    );
    let mut sixth = thing("item-5", "u1", "", b"");
    sixth.owner = Some(Box::new(owner));
    write_on(&mut c, sixth).await.unwrap();
    for consistency in [Consistency::Eventual, Consistency::Strong] {
        for limit in [0, 6, u32::MAX] {
            let first = c
                .list(list("item-", consistency, limit))
                .await
                .unwrap()
                .into_inner();
            assert_eq!(first.resources.len(), 5, "limit {limit}");
            assert!(!first.next_page_token.is_empty());
            let second = c
                .list(ListRequest {
                    page_token: first.next_page_token,
                    ..list("item-", consistency, limit)
                })
                .await
                .unwrap()
                .into_inner();
            assert_eq!(second.revision, first.revision);
            let names: Vec<String> = second
                .resources
                .iter()
                .map(|r| r.id.clone().unwrap().name)
                .collect();
            assert_eq!(names, ["item-5"]);
            assert!(second.next_page_token.is_empty());
        }
    }
    let e = ApiError::from(c.list_by_owner(by_owner).await.unwrap_err());
    let (limit, value, _) = exhausted(e);
    assert_eq!((limit.as_str(), value), ("list_results_max", 5));
    let narrow = c
        .list(list("item-5", Consistency::Strong, 0))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(narrow.resources.len(), 1);
    assert!(narrow.next_page_token.is_empty());
    bystander_is_served(&address).await;
}

async fn open_watch(
    c: &mut ResourceServiceClient<Channel>,
) -> Result<tonic::Streaming<WatchEvent>, ApiError> {
    c.watch_list(WatchListRequest {
        r#type: Some(thing_type()),
        tenancy: Some(tenancy()),
        name_prefix: String::new(),
        start_revision: 0,
        ..Default::default()
    })
    .await
    .map(|r| r.into_inner())
    .map_err(ApiError::from)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_are_bounded_per_connection_and_per_node() {
    // Three watches on one connection are served, the fourth is refused
    // (watches_per_connection_max = 3); two more on a second connection bring
    // the node to watches_max = 5, and the next is refused. Closing a watch
    // frees its slot. Reads are served throughout.
    let dir = tempfile::tempdir().unwrap();
    let (_cluster, address) = limited_node(&dir).await;
    let mut a = resources(&connection(&address).await);
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(open_watch(&mut a).await.unwrap());
    }
    let (limit, value, _) = exhausted(open_watch(&mut a).await.unwrap_err());
    assert_eq!((limit.as_str(), value), ("watches_per_connection_max", 3));
    let mut b = resources(&connection(&address).await);
    held.push(open_watch(&mut b).await.unwrap());
    held.push(open_watch(&mut b).await.unwrap());
    let (limit, value, _) = exhausted(open_watch(&mut b).await.unwrap_err());
    assert_eq!((limit.as_str(), value), ("watches_max", 5));
    bystander_is_served(&address).await;
    // The open watches still deliver.
    let first = held[0].message().await.unwrap().unwrap();
    assert!(matches!(
        first.event,
        Some(watch_event::Event::EndOfSnapshot(_))
    ));
    // A closed watch frees its slot (the server notices the reset stream).
    held.truncate(4);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match open_watch(&mut b).await {
            Ok(w) => {
                held.push(w);
                break;
            }
            Err(e) if Instant::now() < deadline => {
                exhausted(e);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("the closed watch's slot was never freed: {e:?}"),
        }
    }
}

/// A Write whose request message never arrives: it holds a request slot on
/// `channel`'s connection until the task is aborted.
fn hanging_write(channel: &Channel) -> tokio::task::JoinHandle<()> {
    let channel = channel.clone();
    tokio::spawn(async move {
        let mut grpc = tonic::client::Grpc::new(channel);
        if grpc.ready().await.is_err() {
            return;
        }
        let codec = tonic_prost::ProstCodec::<WriteRequest, WriteResponse>::default();
        let path =
            tonic::codegen::http::uri::PathAndQuery::from_static("/cairn.v1.ResourceService/Write");
        let never = futures::stream::pending::<WriteRequest>();
        let _ = grpc
            .client_streaming(tonic::Request::new(never), path, codec)
            .await;
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_in_flight_are_bounded_per_connection() {
    // requests_per_connection_max = 4: with three requests stuck in flight
    // on a connection, a fourth is served; with four stuck, the next is
    // refused at once. Another connection is served all along, and the slots
    // come back when the stuck requests go away.
    let dir = tempfile::tempdir().unwrap();
    let (_cluster, address) = limited_node(&dir).await;
    let channel = connection(&address).await;
    let mut c = resources(&channel);
    let read = |name: &str| ReadRequest {
        id: Some(id(name, "")),
        consistency: Consistency::Eventual as i32,
        revision: 0,
    };
    let mut stuck: Vec<_> = (0..3).map(|_| hanging_write(&channel)).collect();
    // Let their headers reach the node: the server takes a slot per stream.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let under = c.read(read("absent")).await.map_err(ApiError::from);
    assert_eq!(
        under.unwrap_err(),
        ApiError::NotFound,
        "the 4th request is served"
    );
    stuck.push(hanging_write(&channel));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let over = ApiError::from(c.read(read("absent")).await.unwrap_err());
    let (limit, value, _) = exhausted(over);
    assert_eq!((limit.as_str(), value), ("requests_per_connection_max", 4));
    bystander_is_served(&address).await;
    for s in stuck {
        s.abort();
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match c.read(read("absent")).await.map_err(ApiError::from) {
            Err(ApiError::NotFound) => break,
            Err(e) if Instant::now() < deadline => {
                exhausted(e);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            other => panic!("the slots never came back: {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_upload_over_the_limit_is_refused() {
    // restore_upload_bytes_max = 4096: an upload of exactly 4096 bytes is
    // received and checked (these bytes are no backup: INVALID_ARGUMENT); one
    // of 4097 is refused as RESOURCE_EXHAUSTED naming the limit.
    let dir = tempfile::tempdir().unwrap();
    let (_cluster, address) = limited_node(&dir).await;
    let mut admin = AdminServiceClient::new(connection(&address).await);
    let upload = |size: usize| {
        let chunks = vec![
            SnapshotChunk {
                data: bytes::Bytes::from(vec![0u8; size - 1]),
            },
            SnapshotChunk {
                data: bytes::Bytes::from_static(b"x"),
            },
        ];
        tonic::Request::new(futures::stream::iter(chunks))
    };
    let e = ApiError::from(admin.restore_snapshot(upload(4096)).await.unwrap_err());
    assert_eq!(invalid_field(e).0, "snapshot");
    let e = ApiError::from(admin.restore_snapshot(upload(4097)).await.unwrap_err());
    let (limit, value, _) = exhausted(e);
    assert_eq!((limit.as_str(), value), ("restore_upload_bytes_max", 4096));
    bystander_is_served(&address).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_outside_the_limits_is_refused_before_anything_is_proposed() {
    // A backup taken on a node without limits holds a resource whose name is
    // over the limited node's name_bytes_max (32). Restoring it there is
    // INVALID_ARGUMENT naming the resource and the limit, and the node's log
    // does not move: the backup is checked whole before the restore begins.
    let source_dir = tempfile::tempdir().unwrap();
    let source = Cluster::start(options(1));
    let source_leader = source.wait_for_leader(LEADER_TIMEOUT).await;
    let source_address = source.node(source_leader).client_address.clone();
    let mut c = resources(&connection(&source_address).await);
    write_on(&mut c, thing(&"n".repeat(40), "u1", "", b""))
        .await
        .unwrap();
    let mut saved = AdminServiceClient::new(connection(&source_address).await)
        .save_snapshot(SaveSnapshotRequest {})
        .await
        .unwrap()
        .into_inner();
    let mut backup = Vec::new();
    while let Some(chunk) = saved.message().await.unwrap() {
        backup.extend_from_slice(&chunk.data);
    }
    drop((source, source_dir));

    let dir = tempfile::tempdir().unwrap();
    let (_cluster, address) = limited_node(&dir).await;
    let mut admin = AdminServiceClient::new(connection(&address).await);
    let last_log_index = |s: StatusResponse| s.last_log_index;
    let before = last_log_index(admin.status(StatusRequest {}).await.unwrap().into_inner());
    let upload = futures::stream::iter(vec![SnapshotChunk {
        data: backup.into(),
    }]);
    let e = ApiError::from(admin.restore_snapshot(upload).await.unwrap_err());
    let (field, reason) = invalid_field(e);
    assert_eq!(field, "snapshot");
    assert!(
        reason.contains("resource 1 of the backup") && reason.contains("name_bytes_max"),
        "{reason}"
    );
    let after = last_log_index(admin.status(StatusRequest {}).await.unwrap().into_inner());
    assert_eq!(after, before, "nothing was proposed");
    bystander_is_served(&address).await;
}
