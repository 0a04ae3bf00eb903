//! A real S3-compatible server for tests: moto in server mode, started on a free port of
//! 127.0.0.1 and killed when dropped. The backup targets' tests (`backup/tests/targets`)
//! and the scheduled backups' system tests (`cli/tests/system/backup.rs`) use it.
//!
//! moto is found at `$MOTO_SERVER`, on `PATH`, or in `/tmp/cairn-ci-python/bin`
//! (where `.ci/run` installs it). Without it [`Moto::start`] says the test skipped, and
//! panics under `CI=true`.
//!
//! What moto (5.2) can and cannot stand in for:
//! - it refuses writes two ways: a bucket policy denying `s3:PutObject` ([`Moto::deny_puts`];
//!   moto checks a bucket policy's Deny on object requests, with or without
//!   authentication; it answers 403 with no body), and, once authentication is switched on
//!   ([`Moto::require_authentication`]), IAM users whose policies allow reads only (403
//!   `AccessDenied`), or a wrong secret (403 `SignatureDoesNotMatch`);
//! - with authentication on, its signature check fails on a listing whose prefix holds a
//!   `/`, as object_store sends it (`prefix=b%2F`, as SigV4 wants; boto3 sends `prefix=b/`,
//!   which moto accepts): authenticated tests work at a bucket's root;
//! - it knows no quota and no full disk: "full" (507, `QuotaExceeded`, `EntityTooLarge`)
//!   cannot be had from it (a full tmpfs directory stands in for it).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// moto checks no signature until authentication is switched on: any key does until then.
pub const ANY_KEY: (&str, &str) = ("test-key", "test-secret");

/// A moto server on a free port; killed on drop.
pub struct Moto {
    child: Child,
    port: u16,
}

impl Moto {
    /// Starts moto, or says why it cannot (a skip, or under CI=true a failure).
    pub fn start(test: &str) -> Option<Moto> {
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

    /// `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// One plain HTTP/1.1 request (no signature): moto's setup calls before
    /// authentication is on. Returns the status and the body.
    pub fn http(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> (u16, String) {
        let mut stream = TcpStream::connect(("127.0.0.1", self.port)).expect("connect to moto");
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .expect("a read timeout");
        let mut request = format!(
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Length: {}\r\nConnection: close\r\n",
            self.port,
            body.len()
        );
        for (name, value) in headers {
            request.push_str(&format!("{name}: {value}\r\n"));
        }
        request.push_str("\r\n");
        stream.write_all(request.as_bytes()).expect("send to moto");
        stream.write_all(body).expect("send to moto");
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
    pub fn create_bucket(&self, bucket: &str) {
        let (status, body) = self.http("PUT", &format!("/{bucket}"), &[], b"");
        assert_eq!(status, 200, "create bucket {bucket}: {body}");
    }

    #[track_caller]
    pub fn put_object(&self, bucket: &str, key: &str, body: &[u8]) {
        let (status, answer) = self.http("PUT", &format!("/{bucket}/{key}"), &[], body);
        assert_eq!(status, 200, "put {bucket}/{key}: {answer}");
    }

    /// A bucket policy denying `s3:PutObject` to everyone: reads and lists still work,
    /// every upload is refused with 403.
    #[track_caller]
    pub fn deny_puts(&self, bucket: &str) {
        let policy = format!(
            r#"{{"Version":"2012-10-17","Statement":[{{"Effect":"Deny","Principal":"*","Action":"s3:PutObject","Resource":"arn:aws:s3:::{bucket}/*"}}]}}"#
        );
        let (status, body) = self.http("PUT", &format!("/{bucket}?policy"), &[], policy.as_bytes());
        assert!(
            status == 200 || status == 204,
            "put the bucket policy: {status} {body}"
        );
    }

    /// An IAM call (moto routes an unsigned request by its credential scope).
    #[track_caller]
    pub fn iam(&self, form: &str) -> String {
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
    pub fn iam_user(&self, user: &str, actions: &[&str]) -> (String, String) {
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
    pub fn require_authentication(&self) {
        let (status, body) = self.http(
            "POST",
            "/moto-api/reset-auth",
            &[("Content-Type", "text/plain")],
            b"0",
        );
        assert_eq!(status, 200, "reset-auth: {body}");
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Where moto_server is, or why it was not found.
pub fn moto_program() -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os("MOTO_SERVER") {
        let path = PathBuf::from(path);
        return match path.is_file() {
            true => Ok(path),
            false => Err(format!("MOTO_SERVER={} is not a file", path.display())),
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
            "moto_server is not installed (set MOTO_SERVER, put it on PATH, or pip install \
             'moto[server]' into /tmp/cairn-ci-python, as .ci/run does)"
                .to_string()
        })
}

/// `application/x-www-form-urlencoded` of `text`.
pub fn form_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The text of the first `<tag>` in `xml`.
#[track_caller]
pub fn xml_value(xml: &str, tag: &str) -> String {
    let open = format!("<{tag}>");
    let start = xml
        .find(&open)
        .unwrap_or_else(|| panic!("no {tag} in {xml}"))
        + open.len();
    let end = xml[start..].find('<').expect("a closing tag") + start;
    xml[start..end].to_string()
}
