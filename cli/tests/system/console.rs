//! The web console (`/ui` on the ops listener) as a person sees it, in a real headless
//! browser (`chromium-headless-shell` over the DevTools protocol, `support::browser`):
//! - against `cairn dev`, opened on a follower: the leader it shows is the real leader, with
//!   members, terms and indexes; the browser lists types and tenancies and shows one
//!   resource's JSON; the live tail shows a write made after it opened; a drill report is
//!   listed; then the leader is killed and the same open page shows the new leader;
//! - with grants configured: the API refuses a call without a token (401), with an unknown
//!   token (401) and with a token lacking the permission (403, naming it), lists only what
//!   the caller's grant lets it read, names a bad parameter (400), bounds the console's
//!   watch streams (429), a grant's rate (429), and the page works once a token is entered.
//!
//! With `CAIRN_CONSOLE_SCREENSHOTS=DIR` the first test writes its screenshots (PNG,
//! 1280x900) into DIR. Without the browser the tests say SKIPPED, except under `CI=true`.

use crate::support;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::Value;
use support::browser::{browser_or_skip, Browser};
use support::*;

/// Where screenshots go, when asked for.
fn screenshot(browser: &mut Browser, name: &str) {
    if let Some(dir) = std::env::var_os("CAIRN_CONSOLE_SCREENSHOTS") {
        let dir = PathBuf::from(dir);
        std::fs::create_dir_all(&dir).expect("the screenshot directory");
        browser.screenshot(&dir.join(name));
    }
}

/// Clicks the first element `selector` matches, once one does.
fn click(browser: &mut Browser, selector: &str) {
    browser.wait_for(
        &format!(
            "(() => {{ const e = document.querySelector({}); if (!e) return false; e.click(); return true; }})()",
            serde_json::json!(selector)
        ),
        Duration::from_secs(10),
    );
}

/// Sets the input `id` to `value`.
fn type_into(browser: &mut Browser, id: &str, value: &str) {
    browser.evaluate(&format!(
        "document.getElementById({}).value = {}",
        serde_json::json!(id),
        serde_json::json!(value)
    ));
}

/// The leader `cairn status -o json` names (None: none yet).
fn real_leader(dev: &DevCluster) -> Option<u64> {
    let out = dev.cairn(&["status", "-o", "json", "--timeout-ms", "3000"]);
    serde_json::from_slice::<Value>(&out.stdout)
        .ok()?
        .get("leader_id")?
        .as_u64()
}

/// `cairn write` through `dev`, which must succeed.
fn write(dev: &DevCluster, args: &[&str]) {
    let mut all = vec!["write"];
    all.extend_from_slice(args);
    let out = dev.cairn(&all);
    assert!(out.status.success(), "cairn {all:?}: {}", text(&out));
}

/// A drill report as `cairn drill` stores it: a `cairn.v1.DrillReport` in default/default
/// named `<unix ms, 15 digits>-<drill>`, its data the report's JSON.
const DRILL_REPORT: &str = r#"{
  "id": {"name": "001764448000000-failover",
         "type": {"group": "cairn", "group_version": "v1", "kind": "DrillReport"},
         "tenancy": {"partition": "default", "namespace": "default"}},
  "data": {"type_url": "cairn/drill-report+json", "json":
    {"drill":"failover","members":"cairn dev in .cairn-dev","verdict":"pass","leader_before":1,
     "term_before":2,"leader_after":3,"term_after":3,"action_ms":1400,
     "write_gap":{"from_ms":-3,"to_ms":1145,"gap_ms":1148},"writes_acknowledged":1500,
     "writes_failed":3,"writes_unknown":1,"lost_writes":0,"reads":700,"reads_backwards":0,
     "steps":[{"at_ms":0,"what":"killing node 1"}],"problems":[]}}
}"#;

#[test]
fn the_console_shows_the_cluster_browses_tails_lists_drills_and_follows_a_failover() {
    let test =
        "console::the_console_shows_the_cluster_browses_tails_lists_drills_and_follows_a_failover";
    let Some(path) = browser_or_skip(test) else {
        return;
    };
    let started = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let dev = DevCluster::start(&dir.path().join("dev"), &[], vec![])
        .unwrap_or_else(|why| panic!("{why}"));
    write(
        &dev,
        &[
            "--type",
            "demo.v1.Thing",
            "--name",
            "hello",
            "--data-json",
            r#"{"hi": 1}"#,
        ],
    );
    write(
        &dev,
        &[
            "--type",
            "demo.v1.Thing",
            "--name",
            "elsewhere",
            "--tenancy",
            "team-a/web",
        ],
    );
    let report = dir.path().join("report.json");
    std::fs::write(&report, DRILL_REPORT).unwrap();
    write(&dev, &["--file", report.to_str().unwrap()]);
    let leader = real_leader(&dev).expect("cairn status names a leader");
    let follower = (1..=3u64).find(|id| *id != leader).unwrap();
    let mut browser = Browser::start(&path);

    // 1. The cluster, from a follower's console: the real leader, every member with its
    //    term and indexes.
    browser.navigate(&format!("http://{}/ui", dev.ops_address(follower as u16)));
    browser.wait_for(
        &format!("document.getElementById('leader').dataset.id === '{leader}'"),
        Duration::from_secs(10),
    );
    browser.wait_for(
        "[...document.querySelectorAll('#members tbody tr')].length === 3 && \
         [...document.querySelectorAll('#members tbody tr')].every(r => \
           /^[0-9]+$/.test(r.dataset.term) && /^[0-9]+$/.test(r.dataset.commit) && \
           /^[0-9]+$/.test(r.dataset.applied))",
        Duration::from_secs(10),
    );
    let roles = browser.evaluate(
        "[...document.querySelectorAll('#members tbody tr')].map(r => r.dataset.id + ':' + r.dataset.role).join(',')",
    );
    assert!(
        roles
            .as_str()
            .unwrap()
            .contains(&format!("{leader}:leader")),
        "{roles}"
    );
    browser.wait_for(
        &format!("document.getElementById('node').textContent.startsWith('node {follower} ·')"),
        Duration::from_secs(5),
    );
    browser.wait_for(
        "document.getElementById('alarms').textContent === 'No alarms.'",
        Duration::from_secs(5),
    );
    screenshot(&mut browser, "console-cluster.png");

    // 2. The browser: types and tenancies with their counts, a listing, one resource's JSON.
    browser.evaluate("location.hash = '#resources'");
    browser.wait_for(
        "(() => { const r = document.querySelector('#types tr[data-type=\"demo.Thing\"][data-tenancy=\"default/default\"]'); \
           return r && r.lastChild.textContent === '1'; })()",
        Duration::from_secs(10),
    );
    browser.wait_for(
        "!!document.querySelector('#types tr[data-type=\"demo.Thing\"][data-tenancy=\"team-a/web\"]') && \
         !!document.querySelector('#types tr[data-type=\"cairn.DrillReport\"]')",
        Duration::from_secs(5),
    );
    type_into(&mut browser, "b-group", "demo");
    type_into(&mut browser, "b-kind", "Thing");
    click(&mut browser, "#browse-form button[type=submit]");
    browser.wait_for(
        "document.querySelectorAll('#resource-list tbody tr[data-name]').length === 2",
        Duration::from_secs(10),
    );
    click(&mut browser, "#resource-list tr[data-name=\"hello\"]");
    let shown = browser.wait_for(
        "(() => { const t = document.getElementById('resource-json').textContent; \
           return t.includes('\"hi\": 1') && t.includes('\"kind\": \"Thing\"') ? t : ''; })()",
        Duration::from_secs(10),
    );
    let resource: Value =
        serde_json::from_str(shown.as_str().unwrap()).expect("the page shows JSON");
    assert_eq!(resource["id"]["name"], "hello");
    assert_eq!(resource["data"]["json"]["hi"], 1);
    screenshot(&mut browser, "console-resources.png");

    // 3. The live tail shows a write made after it opened (and not what was there before).
    browser.evaluate("location.hash = '#watch'");
    type_into(&mut browser, "t-group", "demo");
    type_into(&mut browser, "t-kind", "Thing");
    click(&mut browser, "#tail-start");
    browser.wait_for(
        "document.getElementById('tail-state').dataset.state === 'open'",
        Duration::from_secs(10),
    );
    write(
        &dev,
        &[
            "--type",
            "demo.v1.Thing",
            "--name",
            "after-open",
            "--data-json",
            r#"{"n": 2}"#,
        ],
    );
    browser.wait_for(
        "!!document.querySelector('#tail li[data-type=\"upsert\"][data-name=\"after-open\"]')",
        Duration::from_secs(10),
    );
    assert_eq!(
        browser.evaluate("document.querySelectorAll('#tail li[data-name=\"hello\"]').length"),
        0,
        "the tail starts from now: no snapshot of what was there"
    );
    click(&mut browser, "#tail li[data-name=\"after-open\"]");
    browser.wait_for(
        "document.getElementById('tail-json').textContent.includes('\"n\": 2')",
        Duration::from_secs(5),
    );
    screenshot(&mut browser, "console-watch.png");
    click(&mut browser, "#tail-stop");

    // 4. The drill report is listed, with its verdict, gap and leaders; whole on a click.
    browser.evaluate("location.hash = '#drills'");
    browser.wait_for(
        "(() => { const r = document.querySelector('#drill-list tr[data-name=\"001764448000000-failover\"]'); \
           return r && r.dataset.verdict === 'pass' && r.textContent.includes('1148 ms') && \
             r.textContent.includes('node 1 (term 2) → node 3 (term 3)'); })()",
        Duration::from_secs(10),
    );
    click(
        &mut browser,
        "#drill-list tr[data-name=\"001764448000000-failover\"]",
    );
    browser.wait_for(
        "document.getElementById('drill-json').textContent.includes('\"writes_acknowledged\": 1500')",
        Duration::from_secs(10),
    );
    screenshot(&mut browser, "console-drills.png");

    // 5. The leader is killed: the same open page, on a survivor, shows the new leader.
    browser.evaluate("location.hash = '#cluster'");
    let pid = dev.node_pid(leader as u16).expect("the leader's process");
    let killed = Instant::now();
    // SAFETY: kill(2) on a node of this test's own cluster.
    unsafe {
        libc::kill(pid as i32, libc::SIGKILL);
    }
    let shown = browser.wait_for(
        &format!(
            "(() => {{ const id = document.getElementById('leader').dataset.id; \
               return id !== '' && id !== '{leader}' ? id : ''; }})()"
        ),
        Duration::from_secs(20),
    );
    let followed_ms = killed.elapsed().as_millis();
    let new_leader: u64 = shown.as_str().unwrap().parse().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let real = loop {
        match real_leader(&dev) {
            Some(id) if id != leader => break id,
            _ if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(200)),
            other => panic!("cairn status names no new leader: {other:?}"),
        }
    };
    assert_eq!(
        new_leader, real,
        "the page shows the leader cairn status names"
    );
    browser.wait_for(
        &format!(
            "(() => {{ const r = document.querySelector('#members tr[data-id=\"{leader}\"]'); \
               return r && !/^[0-9]+$/.test(r.dataset.term); }})()"
        ),
        Duration::from_secs(5),
    );
    eprintln!(
        "the page showed the new leader (node {new_leader}) {followed_ms} ms after the kill; \
         {} ms in all",
        started.elapsed().as_millis()
    );
}

/// `[auth]` with an admin grant (also the nodes' own token) that writes (and reads) everything, a
/// reader of `demo.Thing` in `default/*`, and a slow reader: the same, at one request a second.
/// Returns the admin's, the reader's and the slow reader's tokens, and the file.
fn grants(dir: &std::path::Path) -> (String, String, String, PathBuf) {
    let (admin, admin_hash) = new_token();
    let (reader, reader_hash) = new_token();
    let (slow, slow_hash) = new_token();
    let node_token = dir.join("node.token");
    std::fs::write(&node_token, format!("{admin}\n")).unwrap();
    let config = format!(
        r#"
[auth]
node_token_file = "{}"

[[auth.grants]]
name = "admin"
{admin_hash}
admin = true
write = {{ types = ["*"], tenancies = ["*"] }}

[[auth.grants]]
name = "reader"
{reader_hash}
read = {{ types = ["demo.Thing"], tenancies = ["default/*"] }}

[[auth.grants]]
name = "slow"
{slow_hash}
read = {{ types = ["demo.Thing"], tenancies = ["default/*"] }}
requests_per_second = 1
"#,
        node_token.display()
    );
    let path = dir.join("auth.toml");
    std::fs::write(&path, config).unwrap();
    (admin, reader, slow, path)
}

fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

/// The JSON error body of a refusal.
fn error_of(body: &str) -> Value {
    let v: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"));
    v["error"].clone()
}

/// Opens a console watch stream on `ops` and reads its status line; the stream stays open
/// while the returned connection lives.
fn open_tail(ops: &str, token: &str) -> (u16, std::net::TcpStream) {
    use std::io::{BufRead, Write};
    let mut stream = std::net::TcpStream::connect(ops).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(
        stream,
        "GET /ui/api/watch?group=demo&kind=Thing HTTP/1.0\r\nHost: {ops}\r\nAuthorization: Bearer {token}\r\n\r\n"
    )
    .unwrap();
    let mut status_line = String::new();
    std::io::BufReader::new(stream.try_clone().unwrap())
        .read_line(&mut status_line)
        .expect("a status line");
    let status = status_line
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP answer: {status_line:?}"));
    (status, stream)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_grants_the_console_needs_a_token_and_shows_only_what_it_grants() {
    let test = "console::with_grants_the_console_needs_a_token_and_shows_only_what_it_grants";
    let Some(path) = browser_or_skip(test) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (admin, reader, slow, config) = grants(dir.path());
    let mut o = options(3);
    o.metrics = true;
    o.extra_args = vec!["--config".into(), config.display().to_string()];
    o.admin_token = Some(admin.clone());
    let cluster = Cluster::start(o);
    let leader = cluster.wait_for_leader(Duration::from_secs(20)).await;
    let endpoints = cluster.endpoints().join(",");
    for (name, tenancy) in [("mine", "default/default"), ("theirs", "team-b/db")] {
        let out = cairn(&[
            "write",
            "--endpoints",
            &endpoints,
            "--token",
            &admin,
            "--type",
            "demo.v1.Thing",
            "--name",
            name,
            "--tenancy",
            tenancy,
        ]);
        assert!(out.status.success(), "{}", text(&out));
    }
    let ops = cluster
        .node(leader)
        .metrics_address
        .clone()
        .expect("an ops listener");
    let get = |path: &str, token: Option<&str>| {
        let authorization = token.map(bearer);
        let headers: Vec<(&str, &str)> = authorization
            .as_deref()
            .map(|a| vec![("Authorization", a)])
            .unwrap_or_default();
        http_get_with(&ops, path, &headers)
    };

    // The page itself holds no data: anyone gets it.
    let (status, page) = get("/ui", None);
    assert_eq!(status, 200);
    assert!(page.contains("Cairn console"), "{page}");

    // No token, an unknown one: 401, saying so. A token without the permission: 403,
    // naming it.
    for path in [
        "/ui/api/cluster",
        "/ui/api/types",
        "/ui/api/drills",
        "/ui/api/watch?group=demo&kind=Thing",
    ] {
        let (status, body) = get(path, None);
        assert_eq!(status, 401, "{path}: {body}");
        assert_eq!(error_of(&body)["kind"], "UNAUTHENTICATED", "{path}");
        let (status, body) = get(path, Some("cairn-not-a-known-token"));
        assert_eq!(status, 401, "{path}: {body}");
    }
    let (status, body) = get("/ui/api/cluster", Some(&reader));
    assert_eq!(status, 403, "{body}");
    let error = error_of(&body);
    assert_eq!(error["kind"], "PERMISSION_DENIED");
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains("grant \"reader\" lacks admin"),
        "{error}"
    );
    let (status, body) = get("/ui/api/drills", Some(&reader));
    assert_eq!(status, 403, "{body}");
    assert!(
        error_of(&body)["message"]
            .as_str()
            .unwrap()
            .contains("cairn.DrillReport"),
        "{body}"
    );

    // Within its grant, a reader sees only what it may read: its listing, its counts.
    let (status, body) = get("/ui/api/resources?group=demo&kind=Thing", Some(&reader));
    assert_eq!(status, 200, "{body}");
    let listed: Value = serde_json::from_str(&body).unwrap();
    let names: Vec<&str> = listed["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["mine"], "{body}");
    let (status, body) = get("/ui/api/types", Some(&reader));
    assert_eq!(status, 200, "{body}");
    let counts: Value = serde_json::from_str(&body).unwrap();
    let tenancies: Vec<String> = counts["types"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            format!(
                "{}.{} {}/{}",
                t["group"].as_str().unwrap(),
                t["kind"].as_str().unwrap(),
                t["partition"].as_str().unwrap(),
                t["namespace"].as_str().unwrap()
            )
        })
        .collect();
    assert_eq!(tenancies, ["demo.Thing default/default"], "{body}");
    let (status, body) = get(
        "/ui/api/resource?group=demo&version=v1&kind=Thing&partition=team-b&namespace=db&name=theirs",
        Some(&reader),
    );
    assert_eq!(status, 403, "{body}");
    let (status, body) = get(
        "/ui/api/resource?group=demo&version=v1&kind=Thing&partition=team-b&namespace=db&name=theirs",
        Some(&admin),
    );
    assert_eq!(status, 200, "{body}");

    // Bad parameters are named; a missing resource is 404.
    for (path, parameter) in [
        ("/ui/api/resources?group=de*mo&kind=Thing", "group"),
        ("/ui/api/resources?group=demo&kind=Thing&limit=501", "limit"),
        (
            "/ui/api/resources?group=demo&kind=Thing&colour=red",
            "\"colour\"",
        ),
        ("/ui/api/resource?group=demo&version=v1&kind=Thing", "name"),
        ("/ui/api/watch?group=demo&kind=Thing&after=soon", "after"),
    ] {
        let (status, body) = get(path, Some(&admin));
        assert_eq!(status, 400, "{path}: {body}");
        assert_eq!(error_of(&body)["parameter"], parameter, "{path}: {body}");
    }
    let (status, body) = get(
        "/ui/api/resource?group=demo&version=v1&kind=Thing&partition=default&namespace=default&name=nobody",
        Some(&admin),
    );
    assert_eq!(status, 404, "{body}");

    // A grant's rate holds on the console as on the client port: at one request a second
    // (a burst of one, and at most a second's wait), of five asked at once at least one is
    // refused, 429 naming the limit, while the reader without a rate is never held back.
    let asked: Vec<(u16, String)> = std::thread::scope(|scope| {
        let calls: Vec<_> = (0..5)
            .map(|_| scope.spawn(|| get("/ui/api/types", Some(&slow))))
            .collect();
        calls.into_iter().map(|c| c.join().unwrap()).collect()
    });
    let refused: Vec<&(u16, String)> = asked.iter().filter(|(status, _)| *status != 200).collect();
    assert!(
        !refused.is_empty(),
        "five at once at one a second: {asked:?}"
    );
    for (status, body) in refused {
        assert_eq!(*status, 429, "{body}");
        let error = error_of(body);
        assert_eq!(error["kind"], "RESOURCE_EXHAUSTED", "{body}");
        assert!(
            error["message"]
                .as_str()
                .unwrap()
                .contains("requests_per_second"),
            "{body}"
        );
    }
    for _ in 0..5 {
        let (status, body) = get("/ui/api/types", Some(&reader));
        assert_eq!(status, 200, "{body}");
    }

    // The console's watch streams are bounded per node: one more is refused with 429.
    let mut tails = Vec::new();
    for _ in 0..8 {
        let (status, stream) = open_tail(&ops, &admin);
        assert_eq!(status, 200);
        tails.push(stream);
    }
    let (status, _) = open_tail(&ops, &admin);
    assert_eq!(status, 429, "a ninth console watch stream");
    drop(tails);

    // The page asks for a token, refuses one without the permission, and works with one
    // that has it.
    let mut browser = Browser::start(&path);
    browser.navigate(&format!("http://{ops}/ui"));
    browser.wait_for(
        "(() => { const b = document.getElementById('auth-error'); return !b.hidden && b.dataset.status === '401'; })()",
        Duration::from_secs(10),
    );
    type_into(&mut browser, "token", &reader);
    click(&mut browser, "#token-save");
    browser.wait_for(
        "(() => { const b = document.getElementById('auth-error'); \
           return !b.hidden && b.dataset.status === '403' && b.textContent.includes('lacks admin'); })()",
        Duration::from_secs(10),
    );
    type_into(&mut browser, "token", &admin);
    click(&mut browser, "#token-save");
    browser.wait_for(
        &format!("document.getElementById('leader').dataset.id === '{leader}'"),
        Duration::from_secs(10),
    );
    browser.wait_for(
        "document.getElementById('auth-error').hidden && document.getElementById('token-state').textContent === 'token set'",
        Duration::from_secs(5),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_console_off_ui_answers_404_and_metrics_and_probes_are_served() {
    // `--web-console off`: every /ui path answers 404 saying the console is off (the page,
    // the API, an unknown endpoint), and the ops listener's other routes are served.
    let mut o = options(1);
    o.metrics = true;
    o.extra_args = vec!["--web-console".into(), "off".into()];
    let cluster = Cluster::start(o);
    let leader = cluster.wait_for_leader(Duration::from_secs(20)).await;
    let ops = cluster
        .node(leader)
        .metrics_address
        .clone()
        .expect("an ops listener");
    for path in [
        "/ui",
        "/ui/",
        "/ui/api/types",
        "/ui/api/cluster",
        "/ui/api/nothing",
    ] {
        let (status, body) = http_get_with(&ops, path, &[]);
        assert_eq!(status, 404, "{path}: {body}");
        let message = error_of(&body)["message"].as_str().unwrap().to_string();
        assert!(message.contains("web console is off"), "{path}: {body}");
    }
    for path in ["/metrics", "/livez"] {
        let (status, body) = http_get_with(&ops, path, &[]);
        assert_eq!(status, 200, "{path}: {body}");
    }
}
