//! Where `cairn drill` keeps its reports in a cluster, and where the web console reads them:
//! resources of type `cairn.v1.DrillReport` in tenancy `default/default`, named
//! `<unix ms, 15 digits>-<drill>` so that names sort by time, whose `data` is the report as
//! JSON under the type URL [`TYPE_URL`]. The writer is `jepsen_tests::drill::store_report`,
//! the reader `cairn_server::console`.

use crate::cairn::v1::{Tenancy, Type};

/// The type URL of a report's `data`.
pub const TYPE_URL: &str = "cairn/drill-report+json";

/// The type of the reports.
pub fn report_type() -> Type {
    Type {
        group: "cairn".into(),
        group_version: "v1".into(),
        kind: "DrillReport".into(),
    }
}

/// The tenancy of the reports.
pub fn tenancy() -> Tenancy {
    Tenancy {
        partition: "default".into(),
        namespace: "default".into(),
    }
}

/// The name of a report of `drill` stored at `unix_ms`: the time, zero-padded, then the
/// drill's words joined by `_` (`001764448000000-failover_graceful`).
pub fn report_name(drill: &str, unix_ms: u64) -> String {
    let words: Vec<&str> = drill
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| !w.is_empty())
        .collect();
    format!("{unix_ms:015}-{}", words.join("_"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_names_sort_by_time_and_name_the_drill() {
        assert_eq!(
            report_name("failover --graceful", 1_764_448_000_000),
            "001764448000000-failover_graceful"
        );
        assert_eq!(
            report_name("rolling-restart", 5),
            "000000000000005-rolling_restart"
        );
        assert!(report_name("restore", 999) < report_name("failover", 1_000));
    }
}
