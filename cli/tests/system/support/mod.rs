//! Shared helpers for the node's integration tests: a cluster of real `cairn`
//! processes (from `jepsen-tests::cluster`) and small raw-gRPC helpers.
#![allow(dead_code)]

pub mod browser;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cairn_client::{Client, ClientOptions, TlsOptions};
use cairn_proto::error::ApiError;
use cairn_proto::v1::resource_service_client::ResourceServiceClient;
use cairn_proto::v1::*;
use cairn_tls::ClientFiles;
pub use jepsen_tests::cluster::{Cluster, ClusterOptions};
use tonic::transport::Channel;

pub fn options(nodes: usize) -> ClusterOptions {
    ClusterOptions::new(env!("CARGO_BIN_EXE_cairn"), nodes)
}

pub async fn client(address: &str) -> ResourceServiceClient<Channel> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{address}"))
        .unwrap()
        .connect_timeout(Duration::from_millis(500))
        .timeout(Duration::from_secs(10))
        .connect_lazy();
    // Lists of large test resources exceed tonic's 4 MiB default.
    ResourceServiceClient::new(channel).max_decoding_message_size(64 * 1024 * 1024)
}

pub fn thing_type() -> Type {
    Type {
        group: "demo".into(),
        group_version: "v1".into(),
        kind: "Thing".into(),
    }
}

pub fn tenancy() -> Tenancy {
    Tenancy {
        partition: "default".into(),
        namespace: "default".into(),
    }
}

/// `*/*`: every tenancy (lists and watches).
pub fn any_tenancy() -> Tenancy {
    Tenancy {
        partition: "*".into(),
        namespace: "*".into(),
    }
}

pub fn id(name: &str, uid: &str) -> Id {
    Id {
        uid: uid.into(),
        name: name.into(),
        r#type: Some(thing_type()),
        tenancy: Some(tenancy()),
    }
}

/// A lease service client of the node at `address`.
pub fn lease_client(
    address: &str,
) -> cairn_proto::v1::lease_service_client::LeaseServiceClient<Channel> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{address}"))
        .unwrap()
        .connect_timeout(Duration::from_millis(500))
        .timeout(Duration::from_secs(10))
        .connect_lazy();
    cairn_proto::v1::lease_service_client::LeaseServiceClient::new(channel)
}

/// Grants a lease through `address`, retrying while the cluster version is still rising
/// to 0.2 (a new cluster gets there within seconds); its id.
pub async fn grant_lease(address: &str, ttl_ms: u64) -> u64 {
    let started = Instant::now();
    loop {
        match lease_client(address)
            .grant(LeaseGrantRequest { ttl_ms })
            .await
        {
            Ok(granted) => return granted.into_inner().id,
            Err(_) if started.elapsed() < Duration::from_secs(30) => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(status) => panic!("grant: {status:?}"),
        }
    }
}

/// A KeepAlive stream opened on the node at `address`: the sender of its requests and
/// the stream of its answers.
pub async fn keep_alive_stream(
    address: &str,
) -> (
    tokio::sync::mpsc::Sender<LeaseKeepAliveRequest>,
    tonic::Streaming<LeaseKeepAliveResponse>,
) {
    let (requests, outgoing) = tokio::sync::mpsc::channel(4);
    let answers = lease_client(address)
        .keep_alive(tokio_stream::wrappers::ReceiverStream::new(outgoing))
        .await
        .expect("a keep-alive stream")
        .into_inner();
    (requests, answers)
}

pub fn thing(name: &str, uid: &str, version: &str, payload: &[u8]) -> Resource {
    Resource {
        id: Some(id(name, uid)),
        version: version.into(),
        data: Some(cairn_proto::google::protobuf::Any {
            type_url: "demo/bytes".into(),
            value: bytes::Bytes::copy_from_slice(payload),
        }),
        ..Default::default()
    }
}

pub async fn write(address: &str, resource: Resource) -> Result<Resource, ApiError> {
    let mut c = client(address).await;
    c.write(WriteRequest {
        fence: None,
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

pub async fn read(
    address: &str,
    name: &str,
    consistency: Consistency,
) -> Result<Resource, ApiError> {
    let mut c = client(address).await;
    c.read(ReadRequest {
        id: Some(id(name, "")),
        consistency: consistency as i32,
        revision: 0,
    })
    .await
    .map(|r| r.into_inner().resource.expect("a read answers a resource"))
    .map_err(ApiError::from)
}

/// Every Thing of every tenancy on the node at `address`: every page of the
/// listing.
pub async fn list(address: &str, consistency: Consistency) -> Result<Vec<Resource>, ApiError> {
    let mut c = client(address).await;
    let mut resources = Vec::new();
    let mut page_token = String::new();
    loop {
        let page = c
            .list(ListRequest {
                r#type: Some(thing_type()),
                tenancy: Some(any_tenancy()),
                consistency: consistency as i32,
                page_token,
                ..ListRequest::default()
            })
            .await
            .map_err(ApiError::from)?
            .into_inner();
        resources.extend(page.resources);
        if page.next_page_token.is_empty() {
            return Ok(resources);
        }
        page_token = page.next_page_token;
    }
}

/// Creates `name` through whichever node leads, retrying while there is no
/// leader. `Ok(true)` = acknowledged; `Ok(false)` = the outcome is unknown (an
/// ambiguous failure was followed by a CasFailure on retry: it may have been
/// applied by the first attempt).
pub async fn create_anywhere(
    cluster: &Cluster,
    name: &str,
    payload: &[u8],
    timeout: Duration,
) -> Result<bool, ApiError> {
    let deadline = Instant::now() + timeout;
    let mut ambiguous = false;
    let mut last = ApiError::Unavailable("not tried".into());
    while Instant::now() < deadline {
        for address in cluster.endpoints() {
            match write(&address, thing(name, "u1", "", payload)).await {
                Ok(_) => return Ok(true),
                Err(ApiError::CasFailure(_)) if ambiguous => return Ok(false),
                Err(
                    e @ (ApiError::NotLeader { .. }
                    | ApiError::Unavailable(_)
                    | ApiError::Inconsistent(_)),
                ) => {
                    if !matches!(e, ApiError::NotLeader { .. }) {
                        ambiguous = true;
                    }
                    last = e;
                }
                Err(e) => return Err(e),
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err(last)
}

/// Names of every Thing on `address` (eventual list), sorted.
pub async fn names_on(address: &str) -> Option<Vec<String>> {
    let mut names: Vec<String> = list(address, Consistency::Eventual)
        .await
        .ok()?
        .into_iter()
        .map(|r| r.id.unwrap().name)
        .collect();
    names.sort();
    Some(names)
}

/// Waits until every listed node holds exactly `expected` (eventual lists).
pub async fn wait_converged(
    cluster: &Cluster,
    ids: &[u64],
    expected: &[String],
    timeout: Duration,
) {
    let deadline = Instant::now() + timeout;
    let mut last = vec![];
    while Instant::now() < deadline {
        last.clear();
        let mut all = true;
        for id in ids {
            let got = names_on(&cluster.node(*id).client_address).await;
            if got.as_deref() != Some(expected) {
                all = false;
            }
            last.push((*id, got.map(|g| g.len())));
        }
        if all {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!(
        "nodes did not converge on {} resources: {last:?}; logs in {}",
        expected.len(),
        cluster.root().display()
    );
}

/// `cairn token new`: the token and its `token_sha256 = "..."` config line.
pub fn new_token() -> (String, String) {
    let out = cairn(&["token", "new"]);
    assert!(out.status.success(), "{}", text(&out));
    let stdout = String::from_utf8(out.stdout).unwrap();
    let mut lines = stdout.lines();
    let token = lines.next().expect("a token").to_string();
    let hash = lines.next().expect("a token_sha256 line").to_string();
    assert!(hash.starts_with("token_sha256 = \""), "{hash}");
    (token, hash)
}

/// Runs the `cairn` binary under test with `args`.
pub fn cairn(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_cairn"))
        .args(args)
        .output()
        .expect("run cairn")
}

/// A command's stdout and stderr, for assertions and failure messages.
pub fn text(o: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// `cairn tls init DIR ARGS...`, which must succeed.
pub fn tls_init(dir: &Path, args: &[&str]) {
    let mut all = vec!["tls", "init", dir.to_str().expect("utf-8 path")];
    all.extend_from_slice(args);
    let out = cairn(&all);
    assert!(
        out.status.success(),
        "cairn tls init failed: {}",
        text(&out)
    );
}

pub fn client_tls(dir: &Path) -> TlsOptions {
    TlsOptions {
        ca_file: Some(dir.join("ca.pem")),
        cert_file: Some(dir.join("client.pem")),
        key_file: Some(dir.join("client-key.pem")),
    }
}

/// The `cairn agent` flags with which node N uses `dir/node-N.pem` (and
/// its key) and trusts `dir/ca.pem`, as written by `cairn tls init dir`.
pub fn tls_args(dir: &Path) -> Vec<String> {
    let d = dir.display();
    vec![
        "--tls-cert-file".to_string(),
        format!("{d}/node-{{id}}.pem"),
        "--tls-key-file".to_string(),
        format!("{d}/node-{{id}}-key.pem"),
        "--tls-ca-file".to_string(),
        format!("{d}/ca.pem"),
    ]
}

/// A cluster whose node N uses `dir/node-N.pem` and trusts `dir/ca.pem`.
pub fn tls_cluster(dir: &Path, nodes: usize, extra: &[&str]) -> Cluster {
    let mut o = options(nodes);
    o.extra_args = tls_args(dir)
        .into_iter()
        .chain(extra.iter().map(|s| s.to_string()))
        .collect();
    o.client_tls = Some(client_tls(dir));
    Cluster::start(o)
}

pub fn tls_client(cluster: &Cluster, tls: Option<TlsOptions>, timeout: Duration) -> Client {
    Client::new(
        &cluster.endpoints(),
        ClientOptions {
            request_timeout: timeout,
            tls,
            ..ClientOptions::default()
        },
    )
    .expect("client")
}

pub fn first_certificate(path: &Path) -> Vec<u8> {
    cairn_tls::load_certificates("test", path).expect("certificate")[0].to_vec()
}

/// The leaf certificate a TLS server at `address` presents to a new connection.
pub async fn served_certificate(address: &str, files: &ClientFiles) -> Vec<u8> {
    let config = cairn_tls::client_config(files).expect("client config");
    let tcp = tokio::net::TcpStream::connect(address)
        .await
        .expect("connect");
    let name = cairn_tls::rustls::pki_types::ServerName::try_from("127.0.0.1").expect("name");
    let stream = cairn_tls::tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .expect("TLS handshake");
    stream
        .get_ref()
        .1
        .peer_certificates()
        .expect("a certificate")[0]
        .to_vec()
}

/// Sends SIGHUP to node `id` (which must be running).
pub fn sighup(cluster: &Cluster, id: u64) {
    let pid = cluster.node(id).pid().expect("the node is running");
    // SAFETY: kill(2) on a child process this test started.
    let sent = unsafe { libc::kill(pid as i32, libc::SIGHUP) };
    assert_eq!(sent, 0, "SIGHUP to node {id}");
}

/// Lets this test process open as many sockets as the hard limit allows.
pub fn raise_own_fd_limit() -> u64 {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain libc calls on a struct we own.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit);
        limit.rlim_cur = limit.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit);
    }
    limit.rlim_cur
}

/// The resident memory of process `pid` (0 once it is gone).
pub fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kb| kb * 1024)
        .unwrap_or(0)
}

/// How many descriptors process `pid` holds open.
pub fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// Whether this process runs as root. Tests that mount filesystems need it; each says so
/// and skips otherwise (CI runs as root).
pub fn skip_unless_root(test: &str, needs: &str) -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return false;
    }
    eprintln!("SKIPPED {test}: it needs root ({needs}); CI runs it as root");
    true
}

/// A tmpfs of `size_mib` MiB mounted at a directory (created if needed); unmounted on drop.
pub struct Tmpfs {
    pub path: std::path::PathBuf,
}

impl Tmpfs {
    pub fn mount(path: &std::path::Path, size_mib: u64) -> Tmpfs {
        std::fs::create_dir_all(path).expect("create the mount point");
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size_mib}m"), "tmpfs"])
            .arg(path)
            .output()
            .expect("run mount");
        assert!(out.status.success(), "mount tmpfs: {}", text(&out));
        Tmpfs {
            path: path.to_path_buf(),
        }
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.path)
            .output();
    }
}

/// The `--members` value of a cluster's bootstrap members.
pub fn members_flag(cluster: &Cluster) -> String {
    cluster
        .nodes
        .iter()
        .map(|n| format!("{}={}/{}", n.id, n.peer_address, n.client_address))
        .collect::<Vec<_>>()
        .join(",")
}

/// Runs `cairn agent ARGS` (with its output in `log`) until it exits or `timeout` passes;
/// returns its exit status (`None`: still running, then killed) and its output.
pub fn run_agent(
    args: &[&str],
    log: &std::path::Path,
    timeout: Duration,
) -> (Option<std::process::ExitStatus>, String) {
    let file = std::fs::File::create(log).expect("agent log");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_cairn"))
        .arg("agent")
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(file.try_clone().expect("log"))
        .stderr(file)
        .spawn()
        .expect("start cairn agent");
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Ok(Some(status)) = child.try_wait() {
            break Some(status);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    (status, std::fs::read_to_string(log).unwrap_or_default())
}

/// The lines of a node's log that start with the node's one fatal line.
pub fn fatal_lines(log: &str) -> Vec<&str> {
    log.lines().filter(|l| l.contains("FATAL ")).collect()
}

/// A `cairn dev` under test: its process, its data dir, its base port and what it prints.
/// Dropping it stops it with Ctrl-C (SIGINT) and waits.
pub struct DevCluster {
    pub child: std::process::Child,
    pub data_dir: std::path::PathBuf,
    pub base_port: u16,
    lines: std::sync::mpsc::Receiver<String>,
    /// Every line it printed on stdout so far (as read by [`DevCluster::wait_for_line`]).
    pub seen: Vec<String>,
}

/// A block of ports free for `cairn dev --base-port B`: B+1..3 (clients), B+1001..3 (peers),
/// B+2001..3 (ops listeners). Each call of this process gets another block (tests run in
/// parallel: two that found the same block free would start on the same ports).
pub fn free_dev_base() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    const FIRST: u32 = 20_000;
    const BLOCKS: u32 = 900;
    static NEXT_BLOCK: AtomicU32 = AtomicU32::new(u32::MAX);
    // The first call starts at a block chosen by the pid, so concurrent test processes
    // start apart.
    let _ = NEXT_BLOCK.compare_exchange(
        u32::MAX,
        std::process::id() % BLOCKS,
        Ordering::SeqCst,
        Ordering::SeqCst,
    );
    for _ in 0..BLOCKS {
        let block = NEXT_BLOCK.fetch_add(1, Ordering::SeqCst) % BLOCKS;
        let base = (FIRST + block * 10) as u16;
        let all_free = (1..=3)
            .chain(1001..=1003)
            .chain(2001..=2003)
            .all(|offset| std::net::TcpListener::bind(("127.0.0.1", base + offset)).is_ok());
        if all_free {
            return base;
        }
    }
    panic!("no free port block for cairn dev");
}

impl DevCluster {
    /// Starts `cairn dev --data-dir DIR --base-port B ARGS` with `env`, and waits (up to
    /// 40 s) for its banner; `Err` with what it printed if it never came.
    pub fn start(
        data_dir: &Path,
        args: &[&str],
        env: Vec<(String, String)>,
    ) -> Result<DevCluster, String> {
        use std::process::{Command, Stdio};
        let base_port = free_dev_base();
        let mut child = Command::new(env!("CARGO_BIN_EXE_cairn"))
            .args(["dev", "--base-port", &base_port.to_string(), "--data-dir"])
            .arg(data_dir)
            .args(args)
            .envs(env)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start cairn dev");
        let stdout = child.stdout.take().unwrap();
        let (send, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
            {
                if send.send(line).is_err() {
                    break;
                }
            }
        });
        let mut dev = DevCluster {
            child,
            data_dir: data_dir.to_path_buf(),
            base_port,
            lines,
            seen: Vec::new(),
        };
        match dev.wait_for_line(
            |l| l.starts_with("Cairn dev cluster"),
            Duration::from_secs(40),
        ) {
            Some(_) => Ok(dev),
            None => {
                let _ = dev.child.kill();
                let mut stderr = String::new();
                if let Some(mut e) = dev.child.stderr.take() {
                    use std::io::Read;
                    let _ = e.read_to_string(&mut stderr);
                }
                Err(format!(
                    "cairn dev did not report a cluster; it printed:\n{}\n{stderr}",
                    dev.seen.join("\n")
                ))
            }
        }
    }

    /// The first line from now on that `matches`, within `timeout`.
    pub fn wait_for_line(
        &mut self,
        matches: impl Fn(&str) -> bool,
        timeout: Duration,
    ) -> Option<String> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self
                .lines
                .recv_timeout(left.min(Duration::from_millis(200)))
            {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if matches(&line) {
                        return Some(line);
                    }
                }
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => return None,
                Err(_) if Instant::now() >= deadline => return None,
                Err(_) => {}
            }
        }
    }

    /// The client address of node `id`.
    pub fn client_address(&self, id: u16) -> String {
        format!("127.0.0.1:{}", self.base_port + id)
    }

    /// The ops listener of node `id`.
    pub fn ops_address(&self, id: u16) -> String {
        format!("127.0.0.1:{}", self.base_port + 2000 + id)
    }

    /// `cairn ARGS` with this cluster's endpoints.
    pub fn cairn(&self, args: &[&str]) -> std::process::Output {
        let endpoints = (1..=3)
            .map(|id| self.client_address(id))
            .collect::<Vec<_>>()
            .join(",");
        std::process::Command::new(env!("CARGO_BIN_EXE_cairn"))
            .args(args)
            .env("CAIRN_ENDPOINTS", endpoints)
            .output()
            .expect("run cairn")
    }

    /// The pid of node `id`'s process, from /proc.
    pub fn node_pid(&self, id: u16) -> Option<u32> {
        let needle = format!("{}/node-{id}", self.data_dir.display());
        processes_mentioning(&needle)
            .into_iter()
            .find(|pid| *pid != self.child.id())
    }
}

impl Drop for DevCluster {
    fn drop(&mut self) {
        if let Ok(Some(_)) = self.child.try_wait() {
            return; // already ended (and reaped): nothing to stop
        }
        // SAFETY: kill(2) on our own child: Ctrl-C stops the cluster.
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGINT);
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `GET path` on `address` (HTTP/1.0, so the server closes the connection): the status code
/// and the body.
pub fn http_get(address: &str, path: &str) -> (u16, String) {
    try_http_get(address, path).unwrap_or_else(|e| panic!("GET {path} on {address}: {e}"))
}

/// [`http_get`], or the error of a listener not (yet) accepting connections: a node serves
/// its ops listener once it has started, which may be after the cluster has a leader.
pub fn try_http_get(address: &str, path: &str) -> std::io::Result<(u16, String)> {
    try_http_get_with(address, path, &[])
}

/// [`http_get`] with more request `headers` (name, value).
pub fn http_get_with(address: &str, path: &str, headers: &[(&str, &str)]) -> (u16, String) {
    try_http_get_with(address, path, headers)
        .unwrap_or_else(|e| panic!("GET {path} on {address}: {e}"))
}

/// [`try_http_get`] with more request `headers` (name, value).
pub fn try_http_get_with(
    address: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> std::io::Result<(u16, String)> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(address)?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let extra: String = headers
        .iter()
        .map(|(name, value)| format!("{name}: {value}\r\n"))
        .collect();
    write!(
        stream,
        "GET {path} HTTP/1.0\r\nHost: {address}\r\n{extra}\r\n"
    )?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    let status = answer
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP answer: {answer:?}"));
    let body = answer
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((status, body))
}

/// The processes whose command line mentions `needle`.
pub fn processes_mentioning(needle: &str) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| String::from_utf8_lossy(&c).contains(needle))
                .unwrap_or(false)
        })
        .collect()
}
