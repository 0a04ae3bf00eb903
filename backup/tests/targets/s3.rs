//! S3 targets against a real S3-compatible server: moto in server mode, started by each test
//! on a free port of 127.0.0.1 and killed when the test ends.
//!
//! moto is found at `$MOTO_SERVER`, on `PATH`, or in `/tmp/cairn-ci-python/bin`
//! (where `.ci/run` installs it). Without it a test says it skipped, and fails under
//! `CI=true` (`cairn_test_support::moto`, shared with the cli's system tests).
//!
//! What moto (5.2) can and cannot stand in for:
//! - it refuses writes two ways, both used here: a bucket policy denying `s3:PutObject`
//!   (moto checks a bucket policy's Deny on object requests, with or without
//!   authentication; it answers 403 with no body), and, once authentication is switched on
//!   (`/moto-api/reset-auth`), IAM users whose policies allow reads only (403
//!   `AccessDenied`), or a wrong secret (403 `SignatureDoesNotMatch`);
//! - with authentication on, its signature check fails on a listing whose prefix holds a
//!   `/`, as object_store sends it (`prefix=b%2F`, as SigV4 wants; boto3 sends `prefix=b/`,
//!   which moto accepts): the authenticated test works at the bucket's root, and prefixes
//!   are covered by the tests without authentication;
//! - it knows no quota and no full disk: "full" (507, `QuotaExceeded`, `EntityTooLarge`)
//!   cannot be had from it. The full directory covers the "full" kind through real I/O
//!   (`mounts.rs`), and the S3 codes are covered by the classification's table test.

use std::path::{Path, PathBuf};

use cairn_backup::{BackupName, BackupTarget, Phase, Retention, S3Options, TargetSpec};
use cairn_test_support::moto::{Moto, ANY_KEY};

use crate::support::*;

const CLUSTER: &str = "0f3c5d7e9a1b2c3d4e5f60718293a4b5";

/// A target for `s3://bucket/prefix` on the moto server, signed with `key`.
trait MotoTarget {
    fn target(&self, location: &str, key: (&str, &str)) -> BackupTarget;
}

impl MotoTarget for Moto {
    fn target(&self, location: &str, key: (&str, &str)) -> BackupTarget {
        let options = S3Options {
            endpoint: Some(self.endpoint()),
            region: Some("us-east-1".into()),
            allow_http: true,
            access_key_id: Some(key.0.into()),
            secret_access_key: Some(key.1.into()),
            session_token: None,
        };
        let spec = TargetSpec::parse_with(location, options).expect("an S3 spec");
        BackupTarget::open(&spec).expect("open the S3 target")
    }
}

fn write(dir: &Path, file_name: &str, index: u64, body_bytes: usize) -> PathBuf {
    write_backup_file(dir, file_name, CLUSTER, index, body_bytes, index)
}

#[tokio::test]
async fn s3_round_trip_listing_retention_and_delete() {
    let Some(moto) = Moto::start("s3_round_trip_listing_retention_and_delete") else {
        return;
    };
    moto.create_bucket("cairn-backups");
    let target = moto.target("s3://cairn-backups/cairn/prod", ANY_KEY);
    let local = tempfile::tempdir().unwrap();
    let now = now_unix_ms();

    // 12 MiB takes three parts (S3's 5 MiB minimum); the others one each.
    let sizes = [(3u64, 12 * 1024 * 1024), (2, 200 * 1024), (1, 1000)];
    let mut names = Vec::new();
    for (hours, body_bytes) in sizes {
        let index = 100 - hours;
        let file = write(local.path(), &format!("s{hours}"), index, body_bytes);
        let name = BackupName::new(CLUSTER, now - hours * HOUR_MS, index).unwrap();
        let mut events = Vec::new();
        let stored = target
            .put_verified(&file, &name, verify_file, |p| events.push(p))
            .await
            .expect("put_verified to moto");
        let size_bytes = std::fs::metadata(&file).unwrap().len();
        assert_eq!(stored.size_bytes, size_bytes);
        assert_progress_complete(&events, Phase::Upload, size_bytes);
        assert_progress_complete(&events, Phase::ReadBack, size_bytes);
        names.push((name, file));
    }
    // Objects that are not ours, beside the backups: other names, a leftover, a sub-folder,
    // and a backup name outside the prefix.
    let leftover = BackupName::new(CLUSTER, now, 500).unwrap();
    moto.put_object("cairn-backups", "cairn/prod/README", b"x");
    moto.put_object(
        "cairn-backups",
        &format!("cairn/prod/{}", leftover.part_file_name()),
        b"x",
    );
    moto.put_object(
        "cairn-backups",
        &format!("cairn/prod/old/{}", names[0].0.file_name()),
        b"x",
    );
    moto.put_object(
        "cairn-backups",
        &format!("cairn/{}", names[0].0.file_name()),
        b"x",
    );
    moto.put_object(
        "cairn-backups",
        &format!("cairn/prod-other/{}", names[0].0.file_name()),
        b"x",
    );

    let listing = target.list().await.expect("list");
    let listed: Vec<u64> = listing
        .backups
        .iter()
        .map(|b| (now - b.created_unix_ms()) / HOUR_MS)
        .collect();
    assert_eq!(listed, [1, 2, 3], "newest first");
    assert_eq!(listing.leftovers.len(), 1);
    assert_eq!(
        listing.foreign_count, 2,
        "README and the sub-folder's; nothing outside the prefix"
    );

    // Fetched, each equals what was sent.
    for (name, original) in &names {
        let dest = local.path().join(format!("fetched-{}", name.index()));
        target.fetch(name, &dest, |_| {}).await.expect("fetch");
        assert_eq!(
            std::fs::read(&dest).unwrap(),
            std::fs::read(original).unwrap()
        );
    }

    // Keep the newest two: the 3-hour-old one goes.
    let decision = target
        .apply_retention(CLUSTER, now, &Retention::new(2, None))
        .await
        .unwrap();
    assert_eq!(decision.prune, vec![names[0].0.clone()]);
    let listing = target.list().await.unwrap();
    assert_eq!(listing.backups.len(), 2);
    assert!(listing.backups.iter().all(|b| b.name != names[0].0));

    // Delete, then a second delete and a fetch tell it is gone.
    let (gone, _) = &names[2];
    target.delete(gone).await.expect("delete");
    assert_kind(
        target.delete(gone).await,
        "not_found",
        &[&gone.file_name(), "s3://cairn-backups/cairn/prod"],
    );
    assert_kind(
        target.fetch(gone, &local.path().join("gone"), |_| {}).await,
        "not_found",
        &[&gone.file_name()],
    );

    // A copy that fails verification is not published, and its `.part` is removed.
    let file = write(local.path(), "rejected", 7, 1000);
    let rejected = BackupName::new(CLUSTER, now + 1, 7).unwrap();
    let result = target
        .put_verified(
            &file,
            &rejected,
            |_: &Path| Err("bad record".to_string()),
            |_| {},
        )
        .await;
    assert_kind(result, "verify", &["bad record"]);
    let listing = target.list().await.unwrap();
    assert!(listing.backups.iter().all(|b| b.name != rejected));
    assert!(listing.leftovers.iter().all(|l| l.name != rejected));
}

#[tokio::test]
async fn s3_a_missing_bucket_is_a_missing_target() {
    let Some(moto) = Moto::start("s3_a_missing_bucket_is_a_missing_target") else {
        return;
    };
    let target = moto.target("s3://no-such-bucket/p", ANY_KEY);
    assert_kind(
        target.list().await,
        "missing_target",
        &["s3://no-such-bucket/p", "NoSuchBucket"],
    );
    let local = tempfile::tempdir().unwrap();
    let file = write(local.path(), "snap", 1, 1000);
    let name = BackupName::new(CLUSTER, 1, 1).unwrap();
    let result = target.put_verified(&file, &name, verify_file, |_| {}).await;
    assert_kind(
        result,
        "missing_target",
        &["no-such-bucket", &name.part_file_name()],
    );
}

#[tokio::test]
async fn s3_a_bucket_policy_that_denies_writes_is_refused() {
    let Some(moto) = Moto::start("s3_a_bucket_policy_that_denies_writes_is_refused") else {
        return;
    };
    moto.create_bucket("locked-bucket");
    moto.deny_puts("locked-bucket");

    let target = moto.target("s3://locked-bucket", ANY_KEY);
    let local = tempfile::tempdir().unwrap();
    let file = write(local.path(), "snap", 1, 1000);
    let name = BackupName::new(CLUSTER, 1, 1).unwrap();
    let result = target.put_verified(&file, &name, verify_file, |_| {}).await;
    assert_kind(
        result,
        "refused",
        &["refused", "s3://locked-bucket", &name.part_file_name()],
    );
    let listing = target.list().await.expect("reads are not denied");
    assert!(listing.backups.is_empty() && listing.leftovers.is_empty());
}

#[tokio::test]
async fn s3_credentials_that_may_only_read_or_are_wrong_are_refused() {
    let Some(moto) = Moto::start("s3_credentials_that_may_only_read_or_are_wrong_are_refused")
    else {
        return;
    };
    moto.create_bucket("iam-bucket");
    let writer = moto.iam_user("writer", &["s3:*"]);
    let reader = moto.iam_user("reader", &["s3:GetObject", "s3:ListBucket"]);
    moto.require_authentication();

    let local = tempfile::tempdir().unwrap();
    let file = write(local.path(), "snap", 1, 1000);
    let name = BackupName::new(CLUSTER, 1, 1).unwrap();
    // The writer's key may write: authentication is on, and it passes.
    let writing = moto.target("s3://iam-bucket", (&writer.0, &writer.1));
    writing
        .put_verified(&file, &name, verify_file, |_| {})
        .await
        .expect("the writer writes");

    // The reader's key lists and fetches, but may not write or delete.
    let reading = moto.target("s3://iam-bucket", (&reader.0, &reader.1));
    assert_eq!(
        reading
            .list()
            .await
            .expect("the reader lists")
            .backups
            .len(),
        1
    );
    reading
        .fetch(&name, &local.path().join("fetched"), |_| {})
        .await
        .expect("the reader fetches");
    let other = BackupName::new(CLUSTER, 2, 2).unwrap();
    assert_kind(
        reading
            .put_verified(&file, &other, verify_file, |_| {})
            .await,
        "refused",
        &["AccessDenied", &other.part_file_name()],
    );
    assert_kind(reading.delete(&name).await, "refused", &[&name.file_name()]);

    // A wrong secret is refused too.
    let wrong = moto.target("s3://iam-bucket", (&writer.0, "not-the-secret"));
    assert_kind(wrong.list().await, "refused", &["SignatureDoesNotMatch"]);

    let listing = writing.list().await.unwrap();
    assert_eq!(
        listing
            .backups
            .iter()
            .map(|b| b.name.clone())
            .collect::<Vec<_>>(),
        vec![name]
    );
    assert!(listing.leftovers.is_empty());
}
