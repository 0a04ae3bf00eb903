//! A directory target, through the real file system.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use cairn_backup::object_store::{
    self, local::LocalFileSystem, path::Path as ObjectPath, CopyOptions, GetOptions, GetResult,
    GetResultPayload, ListResult, MultipartUpload, ObjectMeta, ObjectStore, PutMultipartOptions,
    PutOptions, PutPayload, PutResult,
};
use cairn_backup::{
    BackupError, BackupName, BackupTarget, Limits, Phase, Retention, StoredBackup, TargetSpec,
    Verified,
};
use futures::stream::BoxStream;
use futures::StreamExt;

use crate::support::*;

const CLUSTER: &str = "0f3c5d7e9a1b2c3d4e5f60718293a4b5";

/// A directory target with small parts, so that small files take several.
fn open(dir: &std::path::Path) -> BackupTarget {
    let spec = TargetSpec::parse(&format!("file://{}", dir.display())).expect("a directory spec");
    BackupTarget::open(&spec)
        .expect("open the directory")
        .with_limits(Limits {
            part_bytes: 64 * 1024,
            ..Limits::default()
        })
}

#[tokio::test]
async fn a_backup_goes_up_is_listed_newest_first_and_comes_back_unchanged() {
    let local = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let target = open(dir.path());
    // 300 KiB in 64 KiB parts: 5 parts, 2 in flight at most.
    let mut stored = Vec::new();
    for (i, created_unix_ms) in [1_000u64, 3_000, 2_000].into_iter().enumerate() {
        let index = 10 + i as u64;
        let file = write_backup_file(
            local.path(),
            &format!("snap-{i}"),
            CLUSTER,
            index,
            300 * 1024,
            i as u64,
        );
        let name = BackupName::new(CLUSTER, created_unix_ms, index).unwrap();
        let local_file = file.clone();
        let mut events = Vec::new();
        let backup = target
            .put_verified(
                &file,
                &name,
                move |copy| {
                    // The check runs on the copy read back, not on the file sent.
                    assert_ne!(copy, local_file.as_path());
                    assert_eq!(
                        std::fs::read(copy).unwrap(),
                        std::fs::read(&local_file).unwrap()
                    );
                    verify_file(copy)
                },
                |p| events.push(p),
            )
            .await
            .expect("put_verified");
        let size_bytes = std::fs::metadata(&file).unwrap().len();
        assert_eq!(
            backup,
            StoredBackup {
                name: name.clone(),
                size_bytes
            }
        );
        assert_progress_complete(&events, Phase::Upload, size_bytes);
        assert_progress_complete(&events, Phase::ReadBack, size_bytes);
        stored.push((name, file));
    }
    // Only the published names are left: no `.part`, no staging file, no read-back copy.
    let mut expected: Vec<String> = stored.iter().map(|(n, _)| n.file_name()).collect();
    expected.sort();
    assert_eq!(dir_entries(dir.path()), expected);
    assert_eq!(dir_entries(local.path()), ["snap-0", "snap-1", "snap-2"]);

    let listing = target.list().await.unwrap();
    let created: Vec<u64> = listing
        .backups
        .iter()
        .map(|b| b.created_unix_ms())
        .collect();
    assert_eq!(created, [3_000, 2_000, 1_000]);
    assert_eq!(listing.ignored_count(), 0);
    assert!(listing.backups.iter().all(|b| b.cluster_id() == CLUSTER));

    for (name, original) in &stored {
        let dest = local.path().join(format!("fetched-{}", name.index()));
        let mut events = Vec::new();
        let bytes = target
            .fetch(name, &dest, |p| events.push(p))
            .await
            .expect("fetch");
        assert_eq!(
            std::fs::read(&dest).unwrap(),
            std::fs::read(original).unwrap()
        );
        assert_eq!(bytes, std::fs::metadata(original).unwrap().len());
        assert_progress_complete(&events, Phase::Fetch, bytes);
        assert_eq!(verify_file(&dest).map(|v| v.index), Ok(name.index()));
    }
}

#[tokio::test]
async fn a_listing_passes_over_leftovers_and_foreign_objects_and_counts_them() {
    let local = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let target = open(dir.path());
    let name = BackupName::new(CLUSTER, 5, 6).unwrap();
    let file = write_backup_file(local.path(), "snap", CLUSTER, 6, 1000, 1);
    target
        .put_verified(&file, &name, verify_file, |_| {})
        .await
        .unwrap();

    let leftover = BackupName::new(CLUSTER, 7, 8).unwrap().part_file_name();
    std::fs::write(dir.path().join(&leftover), b"half an upload").unwrap();
    std::fs::write(dir.path().join("README"), b"not a backup").unwrap();
    std::fs::write(dir.path().join("cairn-c1-1-2.snap"), b"not our width").unwrap();
    std::fs::create_dir(dir.path().join("old")).unwrap();
    std::fs::write(
        dir.path().join("old").join(name.file_name()),
        b"in a sub-folder",
    )
    .unwrap();

    let listing = target.list().await.unwrap();
    assert_eq!(
        listing
            .backups
            .iter()
            .map(|b| b.name.clone())
            .collect::<Vec<_>>(),
        vec![name]
    );
    assert_eq!(listing.leftovers.len(), 1);
    assert_eq!(listing.leftovers[0].name.part_file_name(), leftover);
    assert_eq!(listing.foreign_count, 3);
    assert_eq!(listing.ignored_count(), 4);
}

#[tokio::test]
async fn retention_prunes_old_backups_and_stale_leftovers_but_keeps_the_newest() {
    let local = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let target = open(dir.path());
    let now = now_unix_ms();
    // Five backups of this cluster, 1 to 5 hours old, and one of another cluster, old.
    for hours in 1..=5u64 {
        let index = 100 - hours;
        let file = write_backup_file(
            local.path(),
            &format!("s{hours}"),
            CLUSTER,
            index,
            2000,
            hours,
        );
        let name = BackupName::new(CLUSTER, now - hours * HOUR_MS, index).unwrap();
        target
            .put_verified(&file, &name, verify_file, |_| {})
            .await
            .unwrap();
    }
    let other = BackupName::new("other", now - 99 * HOUR_MS, 1).unwrap();
    let file = write_backup_file(local.path(), "other", "other", 1, 2000, 9);
    target
        .put_verified(&file, &other, verify_file, |_| {})
        .await
        .unwrap();
    let stale = BackupName::new(CLUSTER, now - 50 * HOUR_MS, 50).unwrap();
    let young = BackupName::new(CLUSTER, now - HOUR_MS, 51).unwrap();
    for leftover in [&stale, &young] {
        std::fs::write(dir.path().join(leftover.part_file_name()), b"half").unwrap();
    }
    set_age(
        &dir.path().join(stale.part_file_name()),
        Duration::from_secs(48 * 3600),
    );

    // Keep 2, and any younger than 3.5 hours: the 4- and 5-hour-old ones go.
    let retention = Retention::new(2, Some(Duration::from_millis(3 * HOUR_MS + HOUR_MS / 2)));
    let decision = target
        .apply_retention(CLUSTER, now, &retention)
        .await
        .unwrap();
    let pruned: Vec<u64> = decision
        .prune
        .iter()
        .map(|n| (now - n.created_unix_ms()) / HOUR_MS)
        .collect();
    assert_eq!(pruned, [4, 5]);
    assert_eq!(decision.prune_leftovers, vec![stale.clone()]);
    assert_eq!(decision.kept, 3);

    let listing = target.list().await.unwrap();
    let left: Vec<(String, u64)> = listing
        .backups
        .iter()
        .map(|b| {
            (
                b.cluster_id().to_string(),
                (now - b.created_unix_ms()) / HOUR_MS,
            )
        })
        .collect();
    let ours = |h| (CLUSTER.to_string(), h);
    assert_eq!(left, [ours(1), ours(2), ours(3), ("other".to_string(), 99)]);
    assert_eq!(
        listing
            .leftovers
            .iter()
            .map(|l| l.name.clone())
            .collect::<Vec<_>>(),
        vec![young]
    );

    // Even a retention of nothing keeps the newest.
    let decision = target
        .apply_retention(CLUSTER, now + 1000 * HOUR_MS, &Retention::new(0, None))
        .await
        .unwrap();
    assert_eq!(decision.kept, 1);
    let listing = target.list().await.unwrap();
    let newest = listing.newest_of(CLUSTER).expect("the newest is kept");
    assert_eq!((now - newest.created_unix_ms()) / HOUR_MS, 1);
    assert_eq!(
        listing.backups.len(),
        2,
        "the newest of ours, and the other cluster's"
    );
}

#[tokio::test]
async fn a_backup_that_fails_verification_is_not_published() {
    let local = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let target = open(dir.path());
    let file = write_backup_file(local.path(), "snap", CLUSTER, 7, 200 * 1024, 3);
    let name = BackupName::new(CLUSTER, 1, 7).unwrap();

    // The caller's check refuses the copy.
    let refused = target
        .put_verified(
            &file,
            &name,
            |_: &std::path::Path| Err("record 3 does not decode".to_string()),
            |_| {},
        )
        .await;
    assert_kind(
        refused,
        "verify",
        &[
            "record 3 does not decode",
            &name.part_file_name(),
            &dir.path().display().to_string(),
        ],
    );
    assert_eq!(dir_entries(dir.path()), Vec::<String>::new());

    // The copy verifies, but as another index than its name says.
    let other_index = BackupName::new(CLUSTER, 1, 8).unwrap();
    let mislabelled = target
        .put_verified(&file, &other_index, verify_file, |_| {})
        .await;
    assert_kind(mislabelled, "verify", &["index 7", "index 8"]);
    assert_eq!(dir_entries(dir.path()), Vec::<String>::new());

    // The verify callback panics.
    let panicked = target
        .put_verified(
            &file,
            &name,
            |_: &std::path::Path| -> Result<Verified, String> { panic!("decoder bug") },
            |_| {},
        )
        .await;
    assert_kind(panicked, "verify", &["did not return"]);
    assert_eq!(dir_entries(dir.path()), Vec::<String>::new());
    // And the read-back copies are gone from the scratch dir (the local file's).
    assert_eq!(dir_entries(local.path()), ["snap"]);
}

#[tokio::test]
async fn a_read_back_that_differs_from_what_was_sent_is_not_published() {
    let local = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let store = FlipOneByteOnRead(Arc::new(
        LocalFileSystem::new_with_prefix(dir.path()).unwrap(),
    ));
    let target =
        BackupTarget::with_store(Arc::new(store), ObjectPath::default(), "flipping".into(), 1);
    let file = write_backup_file(local.path(), "snap", CLUSTER, 7, 10_000, 3);
    let name = BackupName::new(CLUSTER, 1, 7).unwrap();
    // A verify that accepts anything: the comparison of what came back must catch it.
    let accept_all = |_: &std::path::Path| {
        Ok(Verified {
            cluster_id: CLUSTER.to_string(),
            index: 7,
        })
    };
    let result = target.put_verified(&file, &name, accept_all, |_| {}).await;
    assert_kind(result, "verify", &["read back", "crc32c", "flipping"]);
    assert_eq!(dir_entries(dir.path()), Vec::<String>::new());
}

#[tokio::test]
async fn fetch_and_delete_tell_what_is_missing_and_never_overwrite() {
    let local = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let target = open(dir.path());
    let name = BackupName::new(CLUSTER, 1, 2).unwrap();
    let absent = BackupName::new(CLUSTER, 3, 4).unwrap();
    let file = write_backup_file(local.path(), "snap", CLUSTER, 2, 1000, 1);
    target
        .put_verified(&file, &name, verify_file, |_| {})
        .await
        .unwrap();

    let dest = local.path().join("fetched");
    assert_kind(
        target.fetch(&absent, &dest, |_| {}).await,
        "not_found",
        &[&absent.file_name()],
    );
    assert!(!dest.exists());
    // An existing destination is not overwritten.
    std::fs::write(&dest, b"mine").unwrap();
    assert_kind(
        target.fetch(&name, &dest, |_| {}).await,
        "local",
        &["fetched"],
    );
    assert_eq!(std::fs::read(&dest).unwrap(), b"mine");
    assert_eq!(
        dir_entries(local.path()),
        ["fetched", "snap"],
        "no temporary file is left"
    );

    assert_kind(
        target.delete(&absent).await,
        "not_found",
        &[&absent.file_name()],
    );
    target.delete(&name).await.expect("delete");
    assert!(target.list().await.unwrap().backups.is_empty());
    assert_kind(
        target.delete(&name).await,
        "not_found",
        &[&name.file_name()],
    );
}

#[tokio::test]
async fn a_missing_directory_and_a_huge_listing_are_errors_of_their_own() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("not-mounted");
    let spec = TargetSpec::parse(missing.to_str().unwrap()).unwrap();
    let error = assert_kind(
        BackupTarget::open(&spec),
        "missing_target",
        &["not-mounted"],
    );
    assert!(matches!(error, BackupError::MissingTarget { .. }));
    assert!(!missing.exists(), "a missing directory is not created");

    let file = dir.path().join("a-file");
    std::fs::write(&file, b"x").unwrap();
    let spec = TargetSpec::parse(file.to_str().unwrap()).unwrap();
    assert_kind(
        BackupTarget::open(&spec),
        "missing_target",
        &["not a directory"],
    );

    for i in 0..4 {
        std::fs::write(dir.path().join(format!("junk-{i}")), b"x").unwrap();
    }
    let target = open(dir.path()).with_limits(Limits {
        list_objects_max: 3,
        ..Limits::default()
    });
    assert_kind(target.list().await, "too_many", &["more than 3 objects"]);
    let target = target.with_limits(Limits {
        list_objects_max: 5,
        ..Limits::default()
    });
    assert_eq!(target.list().await.unwrap().foreign_count, 5);
}

#[tokio::test]
async fn an_empty_file_or_a_missing_one_is_refused_before_any_upload() {
    let local = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let target = open(dir.path());
    let name = BackupName::new(CLUSTER, 1, 2).unwrap();
    let empty = local.path().join("empty");
    std::fs::write(&empty, b"").unwrap();
    assert_kind(
        target
            .put_verified(&empty, &name, verify_file, |_| {})
            .await,
        "local",
        &["empty"],
    );
    let missing = local.path().join("missing");
    assert_kind(
        target
            .put_verified(&missing, &name, verify_file, |_| {})
            .await,
        "local",
        &["missing"],
    );
    assert_eq!(dir_entries(dir.path()), Vec::<String>::new());
}

/// A store that hands back every object with one byte changed (a bad disk, a bad proxy).
#[derive(Debug)]
struct FlipOneByteOnRead(Arc<dyn ObjectStore>);

impl std::fmt::Display for FlipOneByteOnRead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FlipOneByteOnRead({})", self.0)
    }
}

#[async_trait::async_trait]
impl ObjectStore for FlipOneByteOnRead {
    async fn put_opts(
        &self,
        location: &ObjectPath,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        self.0.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &ObjectPath,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.0.put_multipart_opts(location, opts).await
    }

    async fn get_opts(
        &self,
        location: &ObjectPath,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        let result = self.0.get_opts(location, options).await?;
        let (meta, range, attributes) = (
            result.meta.clone(),
            result.range.clone(),
            result.attributes.clone(),
        );
        let mut bytes = result.bytes().await?.to_vec();
        let middle = bytes.len() / 2;
        if let Some(b) = bytes.get_mut(middle) {
            *b ^= 0x01;
        }
        let stream = futures::stream::once(async move { Ok(Bytes::from(bytes)) }).boxed();
        Ok(GetResult {
            payload: GetResultPayload::Stream(stream),
            meta,
            range,
            attributes,
            extensions: Default::default(),
        })
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<ObjectPath>>,
    ) -> BoxStream<'static, object_store::Result<ObjectPath>> {
        self.0.delete_stream(locations)
    }

    fn list(
        &self,
        prefix: Option<&ObjectPath>,
    ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.0.list(prefix)
    }

    async fn list_with_delimiter(
        &self,
        prefix: Option<&ObjectPath>,
    ) -> object_store::Result<ListResult> {
        self.0.list_with_delimiter(prefix).await
    }

    async fn copy_opts(
        &self,
        from: &ObjectPath,
        to: &ObjectPath,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.0.copy_opts(from, to, options).await
    }
}
