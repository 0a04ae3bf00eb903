//! Earlier releases, pinned by commit in [`RELEASES_FILE`], and their `cairn` binaries built
//! from those commits.
//!
//! [`build`] makes `<target>/compat/cairn-<version>` (`<target>` is this program's target
//! directory) once: a git worktree of the release's commit at `<target>/compat/src-<version>`,
//! built there with `cargo build --release --locked -p <package> --bin <bin> --target-dir
//! <target>`, so that the dependencies both builds share are compiled once; the binary is
//! copied out, the commit it was built from written beside it (`cairn-<version>.commit`), and
//! the worktree removed. A binary whose commit file names the pinned commit is used as it is.
//! A commit that is not in the clone is an error that says so; nothing is fetched.
//!
//! Both builds link `<target>/release/cairn`: after a [`build`], the current build's binary
//! must be linked there again before it is used ([`crate::runner::cairn_binary`] runs cargo,
//! which links a fresh unit's output again), and [`check_version`] tells the two apart. A
//! current binary given by path (which may be that very file) is checked and copied aside by
//! [`keep_aside`] before the earlier release is built.
//!
//! Cargo tells a workspace package's artifacts apart by its name, its version and its path
//! inside the workspace, not by the workspace's place on disk: a package of the release with
//! the same name and version as one of this workspace ([`shared_packages`], from both
//! `Cargo.lock`s) would overwrite this build's artifacts with its own, which this build would
//! then take as fresh. Such a release is built in a target directory of its own,
//! `<target>/compat/target` (every dependency compiled again, once).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Deserialize;

/// The pins, relative to the workspace.
pub const RELEASES_FILE: &str = "tests/compat/releases.toml";

/// One earlier release: what [`RELEASES_FILE`] says of it.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Release {
    /// `MAJOR.MINOR.PATCH`, what its `cairn --version` prints after `cairn `.
    pub version: String,
    /// The full hash of the commit it was built from.
    pub commit: String,
    /// The package and binary that commit builds `cairn` from.
    pub package: String,
    pub bin: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReleasesFile {
    release: Vec<Release>,
}

/// What [`shared_packages`] reads of a `Cargo.lock`.
#[derive(Deserialize)]
struct LockFile {
    #[serde(default)]
    package: Vec<LockedPackage>,
}

#[derive(Deserialize)]
struct LockedPackage {
    name: String,
    version: String,
    /// Absent for a package of the workspace (a path package).
    source: Option<String>,
}

/// The workspace packages (`name version`) that two `Cargo.lock` texts both hold: what two
/// builds in one target directory would mistake for each other (see the module docs).
pub fn shared_packages(lock: &str, other_lock: &str) -> Result<Vec<String>, String> {
    let local = |text: &str| -> Result<std::collections::BTreeSet<String>, String> {
        let lock: LockFile = toml::from_str(text).map_err(|e| format!("Cargo.lock: {e}"))?;
        Ok(lock
            .package
            .into_iter()
            .filter(|p| p.source.is_none())
            .map(|p| format!("{} {}", p.name, p.version))
            .collect())
    };
    let other = local(other_lock)?;
    Ok(local(lock)?.intersection(&other).cloned().collect())
}

impl Release {
    /// The version as numbers, for ordering.
    fn numbers(&self) -> Result<(u64, u64, u64), String> {
        let parts: Vec<u64> = self
            .version
            .split('.')
            .map(str::parse)
            .collect::<Result<_, _>>()
            .map_err(|_| format!("release {:?}: not MAJOR.MINOR.PATCH", self.version))?;
        match parts[..] {
            [major, minor, patch] => Ok((major, minor, patch)),
            _ => Err(format!("release {:?}: not MAJOR.MINOR.PATCH", self.version)),
        }
    }

    /// The first 7 characters of the commit, as `git log --oneline` shows it.
    pub fn short_commit(&self) -> &str {
        &self.commit[..7.min(self.commit.len())]
    }
}

/// Parses the text of a releases file: every release with a `MAJOR.MINOR.PATCH` version, a
/// 40-digit hex commit, a package and a binary, no version twice; at least one release.
pub fn parse(text: &str) -> Result<Vec<Release>, String> {
    let file: ReleasesFile = toml::from_str(text).map_err(|e| e.to_string())?;
    if file.release.is_empty() {
        return Err("no [[release]]".into());
    }
    let mut seen = std::collections::BTreeSet::new();
    for release in &file.release {
        release.numbers()?;
        if release.commit.len() != 40 || !release.commit.chars().all(|c| c.is_ascii_hexdigit()) {
            return Err(format!(
                "release {}: commit {:?} is not a full (40 hex digits) commit hash",
                release.version, release.commit
            ));
        }
        if release.package.is_empty() || release.bin.is_empty() {
            return Err(format!(
                "release {}: package and bin must name what to build",
                release.version
            ));
        }
        if !seen.insert(release.version.clone()) {
            return Err(format!("release {} is listed twice", release.version));
        }
    }
    Ok(file.release)
}

/// The releases of `<workspace>/`[`RELEASES_FILE`].
pub fn load(workspace: &Path) -> Result<Vec<Release>, String> {
    let path = workspace.join(RELEASES_FILE);
    let text = std::fs::read_to_string(&path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    parse(&text).map_err(|e| format!("{}: {e}", path.display()))
}

/// The release `version`, or the newest one when `None`.
pub fn pick(releases: &[Release], version: Option<&str>) -> Result<Release, String> {
    match version {
        Some(version) => releases
            .iter()
            .find(|r| r.version == version)
            .cloned()
            .ok_or_else(|| {
                let known: Vec<&str> = releases.iter().map(|r| r.version.as_str()).collect();
                format!(
                    "no release {version} in {RELEASES_FILE} (it lists {})",
                    known.join(", ")
                )
            }),
        None => {
            let mut newest: Option<(&Release, (u64, u64, u64))> = None;
            for release in releases {
                let numbers = release.numbers()?;
                if newest.is_none_or(|(_, n)| numbers > n) {
                    newest = Some((release, numbers));
                }
            }
            newest
                .map(|(r, _)| r.clone())
                .ok_or_else(|| format!("no release in {RELEASES_FILE}"))
        }
    }
}

/// This program's target directory (`<target>/release/jepsen-tests` runs).
pub fn target_dir() -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| format!("current exe: {e}"))?;
    exe.parent()
        .and_then(Path::parent)
        .map(Path::to_path_buf)
        .ok_or_else(|| format!("{} is not in a target directory", exe.display()))
}

/// A release's binary, ready.
#[derive(Clone, Debug)]
pub struct Built {
    pub binary: PathBuf,
    /// How long its build took; `None`: it was already built from the pinned commit.
    pub build_time: Option<Duration>,
}

/// Runs `git` in `workspace`; its stdout, or an error naming the command and its stderr.
fn git(workspace: &Path, args: &[&str]) -> Result<String, String> {
    let output = std::process::Command::new("git")
        .arg("-C")
        .arg(workspace)
        .args(args)
        .output()
        .map_err(|e| format!("cannot run git {}: {e}", args.join(" ")))?;
    if !output.status.success() {
        return Err(format!(
            "git {} failed ({}): {}",
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
}

/// Makes `release`'s binary (see the module docs) in `target_dir`, from the git clone at
/// `workspace`.
pub async fn build(
    release: &Release,
    workspace: &Path,
    target_dir: &Path,
) -> Result<Built, String> {
    let compat = target_dir.join("compat");
    let binary = compat.join(format!("cairn-{}", release.version));
    let stamp = compat.join(format!("cairn-{}.commit", release.version));
    let built_from = std::fs::read_to_string(&stamp).unwrap_or_default();
    if binary.is_file() && built_from.trim() == release.commit {
        return Ok(Built {
            binary,
            build_time: None,
        });
    }
    let object = format!("{}^{{commit}}", release.commit);
    if git(workspace, &["cat-file", "-e", &object]).is_err() {
        return Err(format!(
            "release {} is pinned to commit {} ({RELEASES_FILE}), which is not in the git clone \
             at {}: fetch it (in a shallow clone, `git fetch --unshallow`)",
            release.version,
            release.commit,
            workspace.display()
        ));
    }
    std::fs::create_dir_all(&compat)
        .map_err(|e| format!("cannot create {}: {e}", compat.display()))?;
    let release_lock = git(
        workspace,
        &["show", &format!("{}:Cargo.lock", release.commit)],
    )?;
    let this_lock = std::fs::read_to_string(workspace.join("Cargo.lock")).map_err(|e| {
        format!(
            "cannot read {}: {e}",
            workspace.join("Cargo.lock").display()
        )
    })?;
    let shared = shared_packages(&release_lock, &this_lock)?;
    let build_dir = if shared.is_empty() {
        target_dir.to_path_buf()
    } else {
        println!(
            "release {} has workspace packages of the same name and version as this one ({}): \
             building it in a target directory of its own",
            release.version,
            shared.join(", ")
        );
        compat.join("target")
    };
    let source = compat.join(format!("src-{}", release.version));
    let source_text = source.display().to_string();
    // A worktree a killed run left behind (or its registration, if the directory is gone).
    if source.exists() {
        let _ = git(workspace, &["worktree", "remove", "--force", &source_text]);
        if source.exists() {
            std::fs::remove_dir_all(&source)
                .map_err(|e| format!("cannot remove {}: {e}", source.display()))?;
        }
    }
    git(workspace, &["worktree", "prune"])?;
    git(
        workspace,
        &["worktree", "add", "--detach", &source_text, &release.commit],
    )?;
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let args = [
        "build",
        "--release",
        "--locked",
        "-p",
        &release.package,
        "--bin",
        &release.bin,
    ];
    println!(
        "building release {} (commit {}): cargo {} --target-dir {} in {}",
        release.version,
        release.short_commit(),
        args.join(" "),
        build_dir.display(),
        source.display()
    );
    let started = Instant::now();
    // Async, killed when dropped: Ctrl-C or SIGTERM of the run stops the build too.
    let status = tokio::process::Command::new(cargo)
        .current_dir(&source)
        .args(args)
        .arg("--target-dir")
        .arg(&build_dir)
        .kill_on_drop(true)
        .status()
        .await;
    let build_time = started.elapsed();
    let removed = git(workspace, &["worktree", "remove", "--force", &source_text]);
    match status {
        Ok(s) if s.success() => {}
        Ok(s) => {
            return Err(format!(
                "building release {} (commit {}) failed ({s})",
                release.version,
                release.short_commit()
            ))
        }
        Err(e) => return Err(format!("cannot run cargo: {e}")),
    }
    removed?;
    copy_into_place(&build_dir.join("release").join(&release.bin), &binary)?;
    std::fs::write(&stamp, format!("{}\n", release.commit))
        .map_err(|e| format!("cannot write {}: {e}", stamp.display()))?;
    println!(
        "built release {} in {:.0} s: {}",
        release.version,
        build_time.as_secs_f64(),
        binary.display()
    );
    Ok(Built {
        binary,
        build_time: Some(build_time),
    })
}

/// Fails unless `binary --version` prints `cairn <version>`: the build it should be, not the
/// other one that links the same path.
pub fn check_version(binary: &Path, version: &str) -> Result<(), String> {
    let output = std::process::Command::new(binary)
        .arg("--version")
        .output()
        .map_err(|e| format!("cannot run {} --version: {e}", binary.display()))?;
    let printed = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    let expected = format!("cairn {version}");
    if output.status.success() && printed == expected {
        Ok(())
    } else {
        Err(format!(
            "{} --version printed {printed:?}, not {expected:?}: it is not the build of release \
             {version}",
            binary.display()
        ))
    }
}

/// Copies the current build's `binary`, once [`check_version`] says it is release `version`,
/// to `<target>/compat/cairn-<version>-current`, and returns that path: the earlier release's
/// [`build`] links `<target>/release/cairn` over the file a caller may have named (as CI names
/// the binary its test command built), and a run must upgrade to the build it was given.
pub fn keep_aside(binary: &Path, target_dir: &Path, version: &str) -> Result<PathBuf, String> {
    check_version(binary, version)?;
    let compat = target_dir.join("compat");
    std::fs::create_dir_all(&compat)
        .map_err(|e| format!("cannot create {}: {e}", compat.display()))?;
    let kept = compat.join(format!("cairn-{version}-current"));
    copy_into_place(binary, &kept)?;
    Ok(kept)
}

/// Copies `from` to `to` through `<to>.part`, renamed into place: `to` is never a half copy.
fn copy_into_place(from: &Path, to: &Path) -> Result<(), String> {
    let mut partial = to.as_os_str().to_owned();
    partial.push(".part");
    std::fs::copy(from, &partial)
        .and_then(|_| std::fs::rename(&partial, to))
        .map_err(|e| format!("cannot copy {} to {}: {e}", from.display(), to.display()))
}

/// Fails unless `binary`'s `cairn agent --help` lists every flag in `flags`: a build started
/// by this harness must know each flag the harness passes ([`crate::cluster::Cluster::agent_flags`]).
pub fn check_agent_flags(binary: &Path, flags: &[String]) -> Result<(), String> {
    let output = std::process::Command::new(binary)
        .args(["agent", "--help"])
        .output()
        .map_err(|e| format!("cannot run {} agent --help: {e}", binary.display()))?;
    let help = String::from_utf8_lossy(&output.stdout);
    let known: std::collections::BTreeSet<&str> = help
        .split(|c: char| c.is_whitespace() || c == ',' || c == '=')
        .filter(|word| word.starts_with("--"))
        .collect();
    let unknown: Vec<&str> = flags
        .iter()
        .map(String::as_str)
        .filter(|flag| !known.contains(flag))
        .collect();
    if unknown.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{} agent does not know {}, which the harness passes to every node it starts",
            binary.display(),
            unknown.join(", ")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stand-in `cairn` at `path` whose `--version` prints `cairn <version>`.
    fn fake_cairn(path: &Path, version: &str) {
        use std::os::unix::fs::PermissionsExt;
        let partial = path.with_extension("part");
        std::fs::write(&partial, format!("#!/bin/sh\necho cairn {version}\n")).unwrap();
        std::fs::set_permissions(&partial, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::rename(&partial, path).unwrap();
    }

    /// CI names `target/release/cairn`, which the earlier release's build links over: the run
    /// must go on with the build it was given, and refuse a binary of another release.
    #[test]
    fn a_given_binary_is_kept_aside_from_the_earlier_releases_build() {
        let target = tempfile::tempdir().unwrap();
        let linked = target.path().join("cairn");
        fake_cairn(&linked, "0.2.0");
        let kept = keep_aside(&linked, target.path(), "0.2.0").unwrap();
        fake_cairn(&linked, "0.1.0"); // the earlier release's build
        check_version(&kept, "0.2.0").unwrap();
        let wrong = keep_aside(&linked, target.path(), "0.2.0").unwrap_err();
        assert!(
            wrong.contains("printed \"cairn 0.1.0\", not \"cairn 0.2.0\""),
            "{wrong}"
        );
        check_version(&kept, "0.2.0").unwrap();
    }

    #[test]
    fn the_pinned_releases_parse_and_the_newest_is_picked() {
        let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let releases = load(workspace).unwrap();
        let first = pick(&releases, Some("0.1.0")).unwrap();
        assert!(first.commit.starts_with("5e071d5"), "{first:?}");
        assert_eq!(first.short_commit(), "5e071d5");
        let newest = pick(&releases, None).unwrap();
        assert!(releases
            .iter()
            .all(|r| r.numbers().unwrap() <= newest.numbers().unwrap()));
        let missing = pick(&releases, Some("9.9.9")).unwrap_err();
        assert!(missing.contains("no release 9.9.9"), "{missing}");
    }

    #[test]
    fn workspace_packages_of_the_same_name_and_version_are_found_in_two_locks() {
        let lock = |packages: &[(&str, &str, bool)]| {
            packages
                .iter()
                .map(|(name, version, registry)| {
                    let source = if *registry {
                        "source = \"registry+https://github.com/rust-lang/crates.io-index\"\n"
                    } else {
                        ""
                    };
                    format!("[[package]]\nname = \"{name}\"\nversion = \"{version}\"\n{source}\n")
                })
                .collect::<String>()
        };
        let release = lock(&[
            ("cairn-fsm", "0.1.0", false),
            ("tokio", "1.0.0", true),
            ("helper", "1.0.0", false),
        ]);
        let current = lock(&[
            ("cairn-fsm", "0.2.0", false),
            ("tokio", "1.0.0", true),
            ("helper", "1.0.0", false),
        ]);
        // A dependency from a registry is the same in both and may be shared; a workspace
        // package of the same name and version may not.
        assert_eq!(
            shared_packages(&release, &current).unwrap(),
            vec!["helper 1.0.0"]
        );
        let current = lock(&[("cairn-fsm", "0.2.0", false), ("tokio", "1.0.0", true)]);
        assert!(shared_packages(&release, &current).unwrap().is_empty());
        // The pinned 0.1.0 and this workspace share none: one target directory serves both.
        let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let this = std::fs::read_to_string(workspace.join("Cargo.lock")).unwrap();
        let release = pick(&load(workspace).unwrap(), Some("0.1.0")).unwrap();
        if let Ok(old) = git(
            workspace,
            &["show", &format!("{}:Cargo.lock", release.commit)],
        ) {
            assert_eq!(shared_packages(&old, &this).unwrap(), Vec::<String>::new());
        }
    }

    #[test]
    fn a_releases_file_is_refused_with_the_reason() {
        let entry = |version: &str, commit: &str| {
            format!(
                "[[release]]\nversion = \"{version}\"\ncommit = \"{commit}\"\npackage = \"p\"\nbin = \"cairn\"\n"
            )
        };
        let full = "5e071d5c33d98275a29bf359da05df3acc96d609";
        assert_eq!(parse(&entry("0.1.0", full)).unwrap().len(), 1);
        let newest =
            parse(&(entry("0.1.0", full) + &entry("0.10.0", full) + &entry("0.9.1", full)))
                .unwrap();
        assert_eq!(pick(&newest, None).unwrap().version, "0.10.0");
        for (text, why) in [
            (entry("0.1.0", "5e071d5"), "not a full"),
            (entry("0.1", full), "not MAJOR.MINOR.PATCH"),
            (entry("0.1.0", full) + &entry("0.1.0", full), "listed twice"),
            (String::new(), "release"),
            (entry("0.1.0", full) + "extra = 1\n", "unknown field"),
        ] {
            let error = parse(&text).unwrap_err();
            assert!(error.contains(why), "{text:?}: {error}");
        }
    }
}
