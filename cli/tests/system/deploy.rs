//! The deployment files in `deploy/`: the systemd unit passes `systemd-analyze verify`, and
//! every example node config loads and validates as `cairn agent` would read it.

use crate::support;

use std::path::{Path, PathBuf};

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

#[test]
fn the_systemd_unit_verifies() {
    if std::process::Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("SKIPPED the_systemd_unit_verifies: systemd-analyze is not installed");
        return;
    }
    // verify checks that ExecStart's binary exists: point it at the one under test.
    let unit = std::fs::read_to_string(deploy_dir().join("cairn.service")).expect("the unit");
    assert!(unit.contains("ExecStart=/usr/local/bin/cairn agent --config /etc/cairn/cairn.toml"));
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("cairn.service");
    std::fs::write(
        &copy,
        unit.replace("/usr/local/bin/cairn", env!("CARGO_BIN_EXE_cairn")),
    )
    .unwrap();
    let out = std::process::Command::new("systemd-analyze")
        .arg("verify")
        .arg(&copy)
        .output()
        .expect("run systemd-analyze");
    assert!(
        out.status.success() && out.stderr.is_empty(),
        "systemd-analyze verify: {}",
        support::text(&out)
    );
}

#[test]
fn the_example_configs_load_and_agree_on_the_members() {
    let mut members = Vec::new();
    for id in 1..=3u64 {
        let path = deploy_dir().join(format!("example/node-{id}.toml"));
        let config = cairn_server::config::ConfigSource {
            file: Some(path.clone()),
            flags: serde_json::json!({}),
        }
        .load()
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(config.node_id, id, "{}", path.display());
        assert!(
            config.metrics_address.is_some(),
            "probes need the ops listener"
        );
        members.push(config.members);
    }
    assert!(
        members.windows(2).all(|w| w[0] == w[1]),
        "every node lists the same members"
    );
}
