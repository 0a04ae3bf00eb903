//! S3 targets against a real S3-compatible server: moto in server mode, started by each test
//! on a free port of 127.0.0.1 and killed when the test ends.
//!
//! moto is found at `$CAIRN_MOTO_SERVER`, on `PATH`, or in `/tmp/cairn-ci-python/bin`
//! (where `.ci/run` installs it). Without it a test says it skipped, and fails under
//! `CI=true`.
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

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use cairn_backup::{BackupName, BackupTarget, Phase, Retention, S3Options, TargetSpec};

use crate::support::*;

const CLUSTER: &str = "0f3c5d7e9a1b2c3d4e5f60718293a4b5";
/// moto checks no signature until authentication is switched on: any key does until then.
const ANY_KEY: (&str, &str) = ("test-key", "test-secret");

/// A moto server on a free port; killed on drop.
struct Moto {
    child: Child,
    port: u16,
}

impl Moto {
    /// Starts moto, or says why it cannot (a skip, or under CI=true a failure).
    fn start(test: &str) -> Option<Moto> {
        let program = match moto_program() {
            Ok(program) => program,
            Err(why) => {
                if std::env::var("CI").is_ok_and(|v| v == "true") {
                    panic!("{test}: {why}; CI=true, so this is a failure, not a skip");
                }
                println!("SKIPPED {test}: {why}");
                eprintln!("SKIPPED {test}: {why}");
                return None;
            }
        };
        let mut child = Command::new(&program)
            .args(["-H", "127.0.0.1", "-p", "0"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", program.display()));
        // moto (werkzeug) prints " * Running on http://127.0.0.1:PORT" on stderr, then a
        // line per request: a thread reads them all, so the pipe never fills.
        let stderr = child.stderr.take().expect("moto's stderr");
        let (port_tx, port_rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut port_tx = Some(port_tx);
            let mut early = Vec::new();
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(tx) = &port_tx {
                    if let Some(port) = line
                        .split("http://127.0.0.1:")
                        .nth(1)
                        .and_then(|rest| rest.trim().parse::<u16>().ok())
                    {
                        let _ = tx.send(Ok(port));
                        port_tx = None;
                    } else {
                        early.push(line);
                    }
                }
            }
            if let Some(tx) = port_tx {
                let _ = tx.send(Err(early.join("\n")));
            }
        });
        let mut moto = Moto { child, port: 0 };
        match port_rx.recv_timeout(Duration::from_secs(60)) {
            Ok(Ok(port)) => moto.port = port,
            Ok(Err(output)) => panic!("moto exited before serving:\n{output}"),
            Err(_) => panic!("moto did not say its port within 60 s"),
        }
        Some(moto)
    }

    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// One plain HTTP/1.1 request (no signature): moto's setup calls before
    /// authentication is on. Returns the status and the body.
    fn http(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> (u16, String) {
        let mut stream = TcpStream::connect(("127.0.0.1", self.port)).expect("connect to moto");
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        let mut request = format!(
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Length: {}\r\nConnection: close\r\n",
            self.port,
            body.len()
        );
        for (name, value) in headers {
            request.push_str(&format!("{name}: {value}\r\n"));
        }
        request.push_str("\r\n");
        stream.write_all(request.as_bytes()).unwrap();
        stream.write_all(body).unwrap();
        let mut response = Vec::new();
        stream.read_to_end(&mut response).expect("moto's answer");
        let response = String::from_utf8_lossy(&response).into_owned();
        let status = response
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("not an HTTP answer: {response}"));
        let body = response
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_string())
            .unwrap_or_default();
        (status, body)
    }

    #[track_caller]
    fn create_bucket(&self, bucket: &str) {
        let (status, body) = self.http("PUT", &format!("/{bucket}"), &[], b"");
        assert_eq!(status, 200, "create bucket {bucket}: {body}");
    }

    #[track_caller]
    fn put_object(&self, bucket: &str, key: &str, body: &[u8]) {
        let (status, answer) = self.http("PUT", &format!("/{bucket}/{key}"), &[], body);
        assert_eq!(status, 200, "put {bucket}/{key}: {answer}");
    }

    /// An IAM call (moto routes an unsigned request by its credential scope).
    #[track_caller]
    fn iam(&self, form: &str) -> String {
        let auth = "AWS4-HMAC-SHA256 Credential=setup/20250101/us-east-1/iam/aws4_request, SignedHeaders=host, Signature=0";
        let (status, body) = self.http(
            "POST",
            "/",
            &[
                ("Authorization", auth),
                ("Content-Type", "application/x-www-form-urlencoded"),
            ],
            format!("{form}&Version=2010-05-08").as_bytes(),
        );
        assert_eq!(status, 200, "IAM {form}: {body}");
        body
    }

    /// An IAM user allowed `actions` on everything; returns its access key and secret.
    fn iam_user(&self, user: &str, actions: &[&str]) -> (String, String) {
        self.iam(&format!("Action=CreateUser&UserName={user}"));
        let actions: Vec<String> = actions.iter().map(|a| format!("\"{a}\"")).collect();
        let policy = format!(
            r#"{{"Version":"2012-10-17","Statement":[{{"Effect":"Allow","Action":[{}],"Resource":"*"}}]}}"#,
            actions.join(",")
        );
        self.iam(&format!(
            "Action=PutUserPolicy&UserName={user}&PolicyName=backups&PolicyDocument={}",
            form_encode(&policy)
        ));
        let body = self.iam(&format!("Action=CreateAccessKey&UserName={user}"));
        (
            xml_value(&body, "AccessKeyId"),
            xml_value(&body, "SecretAccessKey"),
        )
    }

    /// From now on every request must be signed by a known key and allowed by its policies.
    fn require_authentication(&self) {
        let (status, body) = self.http(
            "POST",
            "/moto-api/reset-auth",
            &[("Content-Type", "text/plain")],
            b"0",
        );
        assert_eq!(status, 200, "reset-auth: {body}");
    }

    /// A target for `s3://bucket/prefix` on this server, signed with `key`.
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

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Where moto_server is, or why it was not found.
fn moto_program() -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os("CAIRN_MOTO_SERVER") {
        let path = PathBuf::from(path);
        return match path.is_file() {
            true => Ok(path),
            false => Err(format!(
                "CAIRN_MOTO_SERVER={} is not a file",
                path.display()
            )),
        };
    }
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
        .map(|dir| dir.join("moto_server"));
    on_path
        .chain(std::iter::once(PathBuf::from(
            "/tmp/cairn-ci-python/bin/moto_server",
        )))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            "moto_server is not installed (set CAIRN_MOTO_SERVER, put it on PATH, or pip install \
             'moto[server]' into /tmp/cairn-ci-python, as .ci/run does)"
                .to_string()
        })
}

fn form_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[track_caller]
fn xml_value(xml: &str, tag: &str) -> String {
    let open = format!("<{tag}>");
    let start = xml
        .find(&open)
        .unwrap_or_else(|| panic!("no {tag} in {xml}"))
        + open.len();
    let end = xml[start..].find('<').expect("a closing tag") + start;
    xml[start..end].to_string()
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
    let policy = r#"{"Version":"2012-10-17","Statement":[{"Effect":"Deny","Principal":"*","Action":"s3:PutObject","Resource":"arn:aws:s3:::locked-bucket/*"}]}"#;
    let (status, body) = moto.http("PUT", "/locked-bucket?policy", &[], policy.as_bytes());
    assert!(
        status == 200 || status == 204,
        "put the bucket policy: {status} {body}"
    );

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
