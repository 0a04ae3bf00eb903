//! `write_stage_timing`: an operator who turns it on sees where each write's
//! time goes, stage by stage, on the leader's metrics port; with it off (the
//! default) no stage is recorded.

use crate::support;

use std::io::{Read, Write};
use std::time::Duration;

use support::*;

/// The leader's `/metrics` text, fetched with a bare HTTP/1.0 GET.
fn scrape(address: &str) -> String {
    let mut stream = std::net::TcpStream::connect(address).expect("metrics port");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(stream, "GET /metrics HTTP/1.0\r\nHost: {address}\r\n\r\n").unwrap();
    let mut body = String::new();
    stream.read_to_string(&mut body).unwrap();
    body
}

/// The median of one stage, from the summary the exporter renders.
fn stage_median_seconds(metrics: &str, stage: &str) -> Option<f64> {
    let prefix = format!("cairn_write_stage_seconds{{stage=\"{stage}\",quantile=\"0.5\"}} ");
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(prefix.as_str()))
        .map(|v| v.trim().parse().expect("a number"))
}

async fn leader_metrics_after_writes(timing: bool) -> String {
    let mut options = options(3);
    options.metrics = true;
    if timing {
        options.extra_args.push("--write-stage-timing".into());
    }
    let cluster = Cluster::start(options);
    let leader = cluster.wait_for_leader(Duration::from_secs(20)).await;
    let node = cluster.node(leader);
    for i in 0..50 {
        write(
            &node.client_address,
            thing(&format!("t{i}"), "", "", b"payload"),
        )
        .await
        .expect("write");
    }
    scrape(node.metrics_address.as_deref().expect("metrics on"))
}

#[tokio::test(flavor = "multi_thread")]
async fn with_timing_on_the_leader_reports_every_stage_of_its_writes() {
    let metrics = leader_metrics_after_writes(true).await;
    for stage in [
        "queue",
        "propose",
        "replicate",
        "commit",
        "apply",
        "answer",
        "total",
    ] {
        let median = stage_median_seconds(&metrics, stage)
            .unwrap_or_else(|| panic!("no {stage} stage in the leader's metrics:\n{metrics}"));
        assert!(
            (0.0..10.0).contains(&median),
            "{stage}: median {median} s is not a duration"
        );
    }
    let total = stage_median_seconds(&metrics, "total").unwrap();
    let replicate = stage_median_seconds(&metrics, "replicate").unwrap();
    assert!(
        replicate <= total,
        "a write's replication ({replicate} s) is part of its total ({total} s)"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn with_timing_off_no_stage_is_recorded() {
    let metrics = leader_metrics_after_writes(false).await;
    assert!(
        !metrics.contains("cairn_write_stage_seconds"),
        "stage timing is off by default:\n{metrics}"
    );
}
