//! A real headless browser for tests of what a person sees: `chromium-headless-shell`
//! driven over the Chrome DevTools Protocol on `--remote-debugging-pipe` (JSON messages,
//! each ended by a NUL byte, commands on the browser's fd 3 and answers and events on its
//! fd 4), so no websocket is needed.
//!
//! [`Browser::start`] opens one page of 1280x900; [`Browser::navigate`],
//! [`Browser::evaluate`] (a JavaScript expression's value, promises awaited),
//! [`Browser::wait_for`] (until a predicate holds, or a panic naming it) and
//! [`Browser::screenshot`] (a PNG) drive it. Dropping the browser kills its process group
//! (the browser and its renderers) and removes its profile directory.

use std::io::{Read, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// The browser's executable (Debian's package of the same name).
pub const BROWSER: &str = "chromium-headless-shell";
/// How long one protocol command may take.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(20);

/// The browser's executable, if installed: on PATH or in /usr/bin.
pub fn browser_path() -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([
            PathBuf::from("/usr/bin"),
            PathBuf::from("/usr/lib/chromium"),
        ])
        .map(|dir| dir.join(BROWSER))
        .find(|candidate| candidate.is_file())
}

/// The browser, or `None` after saying SKIP when it is missing outside CI; under
/// `CI=true` a missing browser fails the test (`.ci/run` installs it).
pub fn browser_or_skip(test: &str) -> Option<PathBuf> {
    match browser_path() {
        Some(path) => Some(path),
        None if std::env::var("CI").as_deref() == Ok("true") => panic!(
            "{test}: {BROWSER} is not installed, and CI=true requires it (.ci/run installs the \
             Debian package {BROWSER})"
        ),
        None => {
            eprintln!("SKIPPED {test}: {BROWSER} is not installed (apt-get install {BROWSER}); CI installs it");
            None
        }
    }
}

pub struct Browser {
    child: std::process::Child,
    commands: std::fs::File,
    answers: mpsc::Receiver<Value>,
    session: String,
    next_id: u64,
    _profile: tempfile::TempDir,
}

/// A pipe whose both ends close on exec (the child gets its copies through `dup2`).
fn pipe() -> (OwnedFd, OwnedFd) {
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills the two descriptors we then own.
    let made = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
    assert_eq!(made, 0, "pipe2: {}", std::io::Error::last_os_error());
    // SAFETY: both descriptors were just made and are owned by nothing else.
    unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
}

impl Browser {
    /// Starts the browser at `path` with one blank page of 1280x900.
    pub fn start(path: &Path) -> Browser {
        use std::os::fd::AsRawFd;
        let profile = tempfile::tempdir().expect("a profile directory");
        let (commands_in, commands) = pipe();
        let (answers, answers_out) = pipe();
        let (child_in, child_out) = (commands_in.as_raw_fd(), answers_out.as_raw_fd());
        let mut command = std::process::Command::new(path);
        command
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--no-default-browser-check",
                "--disable-extensions",
                "--disable-background-networking",
                "--hide-scrollbars",
                "--remote-debugging-pipe",
                "--window-size=1280,900",
            ])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg("about:blank")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        // SAFETY: only async-signal-safe calls (setpgid, fcntl, dup2, close) between fork and
        // exec: the browser gets its own process group (killed whole on drop), and the pipe
        // ends as fds 3 (commands in) and 4 (answers out), moved above 10 first so that
        // neither dup2 overwrites the other.
        unsafe {
            command.pre_exec(move || {
                if libc::setpgid(0, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                let high_in = libc::fcntl(child_in, libc::F_DUPFD, 10);
                let high_out = libc::fcntl(child_out, libc::F_DUPFD, 10);
                if high_in < 0 || high_out < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if libc::dup2(high_in, 3) < 0 || libc::dup2(high_out, 4) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                libc::close(high_in);
                libc::close(high_out);
                Ok(())
            });
        }
        let child = command.spawn().expect("start the browser");
        // The child has its copies: close ours so that its exit ends the reader.
        drop(commands_in);
        drop(answers_out);
        let (send, answers_received) = mpsc::channel();
        let mut reader = std::fs::File::from(answers);
        std::thread::spawn(move || {
            let mut pending = Vec::new();
            let mut chunk = [0u8; 64 * 1024];
            loop {
                let n = match reader.read(&mut chunk) {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                pending.extend_from_slice(&chunk[..n]);
                while let Some(end) = pending.iter().position(|b| *b == 0) {
                    let message: Vec<u8> = pending.drain(..=end).collect();
                    if let Ok(value) = serde_json::from_slice::<Value>(&message[..end]) {
                        if send.send(value).is_err() {
                            return;
                        }
                    }
                }
            }
        });
        let mut browser = Browser {
            child,
            commands: std::fs::File::from(commands),
            answers: answers_received,
            session: String::new(),
            next_id: 0,
            _profile: profile,
        };
        let target = browser
            .call("Target.createTarget", json!({"url": "about:blank"}))
            .expect("a page");
        let target_id = target["targetId"]
            .as_str()
            .expect("a target id")
            .to_string();
        let attached = browser
            .call(
                "Target.attachToTarget",
                json!({"targetId": target_id, "flatten": true}),
            )
            .expect("attach to the page");
        browser.session = attached["sessionId"]
            .as_str()
            .expect("a session id")
            .to_string();
        browser.call("Page.enable", json!({})).expect("Page.enable");
        browser
            .call(
                "Emulation.setDeviceMetricsOverride",
                json!({"width": 1280, "height": 900, "deviceScaleFactor": 1, "mobile": false}),
            )
            .expect("set the window size");
        browser
    }

    /// One protocol command (on the page's session once there is one): its result, or the
    /// protocol's error.
    pub fn call(&mut self, method: &str, params: Value) -> Result<Value, String> {
        self.next_id += 1;
        let id = self.next_id;
        let mut message = json!({"id": id, "method": method, "params": params});
        if !self.session.is_empty() {
            message["sessionId"] = json!(self.session);
        }
        let mut bytes = serde_json::to_vec(&message).expect("JSON");
        bytes.push(0);
        self.commands
            .write_all(&bytes)
            .map_err(|e| format!("{method}: the browser does not take commands: {e}"))?;
        let deadline = Instant::now() + COMMAND_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let answer = self
                .answers
                .recv_timeout(left)
                .map_err(|e| format!("{method}: no answer from the browser ({e})"))?;
            if answer["id"].as_u64() != Some(id) {
                continue; // an event, or the answer to a command given up on
            }
            if let Some(error) = answer.get("error") {
                return Err(format!("{method}: {error}"));
            }
            return Ok(answer["result"].clone());
        }
    }

    /// Opens `url` and waits until the document has loaded.
    pub fn navigate(&mut self, url: &str) {
        let answer = self
            .call("Page.navigate", json!({"url": url}))
            .unwrap_or_else(|e| panic!("navigate to {url}: {e}"));
        assert!(
            answer.get("errorText").is_none(),
            "navigate to {url}: {answer}"
        );
        self.wait_for(
            &format!(
                "location.href === {} && document.readyState === 'complete'",
                json!(url)
            ),
            Duration::from_secs(10),
        );
    }

    /// The value of the JavaScript expression `js` (a promise is awaited); `Err` with the
    /// exception it threw.
    pub fn try_evaluate(&mut self, js: &str) -> Result<Value, String> {
        let answer = self.call(
            "Runtime.evaluate",
            json!({"expression": js, "returnByValue": true, "awaitPromise": true}),
        )?;
        if let Some(exception) = answer.get("exceptionDetails") {
            return Err(format!("{js}: {exception}"));
        }
        Ok(answer["result"]["value"].clone())
    }

    /// The value of `js`; panics if it throws.
    pub fn evaluate(&mut self, js: &str) -> Value {
        self.try_evaluate(js).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Waits until `js` is truthy, polling every 100 ms; panics after `timeout` with the
    /// predicate and what the page shows.
    pub fn wait_for(&mut self, js: &str, timeout: Duration) -> Value {
        let deadline = Instant::now() + timeout;
        let mut last;
        loop {
            match self.try_evaluate(js) {
                Ok(value) if truthy(&value) => return value,
                Ok(value) => last = value,
                Err(e) => last = Value::String(e),
            }
            if Instant::now() >= deadline {
                let shown = self
                    .try_evaluate("document.body ? document.body.innerText.slice(0, 3000) : ''")
                    .unwrap_or_default();
                panic!(
                    "the page did not show `{js}` within {} ms (last: {last}); it shows:\n{}",
                    timeout.as_millis(),
                    shown.as_str().unwrap_or_default()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Writes what the page shows as a PNG.
    pub fn screenshot(&mut self, path: &Path) {
        use base64::Engine as _;
        let shot = self
            .call("Page.captureScreenshot", json!({"format": "png"}))
            .expect("a screenshot");
        let png = base64::engine::general_purpose::STANDARD
            .decode(shot["data"].as_str().expect("PNG data"))
            .expect("base64 PNG");
        std::fs::write(path, png).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    }
}

/// JavaScript's truthiness of a returned value.
fn truthy(value: &Value) -> bool {
    match value {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64().is_some_and(|f| f != 0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(_) | Value::Object(_) => true,
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // SAFETY: kill(2) on the process group this browser leads (made in pre_exec).
        unsafe {
            libc::kill(-(self.child.id() as i32), libc::SIGKILL);
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
