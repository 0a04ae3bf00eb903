//! The process's metrics recorder (Prometheus): installed at most once, by the node that
//! serves the ops port (`ops::install_recorder`, which chooses its histogram buckets and
//! describes every series); asked by whatever records whether it is on ([`recording`]);
//! rendered for a scrape ([`render`]). Without a recorder, metrics cost nothing and a
//! scrape is empty.
//!
//! It stands below everything that records (Raft's peer series, the gRPC layer, the ops
//! listener), and imports nothing of the node.

use std::sync::OnceLock;

use anyhow::Context as _;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

/// The process's Prometheus recorder, installed once by [`install`].
static RECORDER: OnceLock<PrometheusHandle> = OnceLock::new();

/// Installs the recorder `builder` makes as the process-wide one, unless one is installed
/// already (then it does nothing). `Ok(true)`: this call installed it.
pub fn install(builder: PrometheusBuilder) -> anyhow::Result<bool> {
    if recording() {
        return Ok(false);
    }
    let handle = builder
        .install_recorder()
        .context("cannot install the metrics recorder")?;
    let _ = RECORDER.set(handle);
    Ok(true)
}

/// Whether a recorder is installed: without one, callers may skip preparing what they would
/// record.
pub fn recording() -> bool {
    RECORDER.get().is_some()
}

/// Every series in the Prometheus text format; empty without a recorder.
pub fn render() -> String {
    RECORDER.get().map(|h| h.render()).unwrap_or_default()
}
