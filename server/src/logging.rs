//! `log_level`: which values it takes ([`check_log_level`]) and the log filter it stands for
//! ([`filter`]).
//!
//! `log_level` takes `tracing`'s filter directives: a level (`info`), targets
//! (`cairn_server=debug,warn`), or both. openraft logs its routine work at INFO: every vote it
//! handles ("handle vote request result …"), each step of an election, its state at start and
//! at shutdown. That is a screenful on every start of a three-node cluster, and it would bury
//! the node's own INFO lines (its listeners, the cluster it joined, leader and health
//! changes). So openraft's INFO is kept one level below the node's: when `log_level`'s
//! default level is `info` and it says nothing of openraft, openraft logs at `warn` and
//! above. From `debug` on everything shows, openraft's INFO included; and a directive naming
//! openraft (`info,openraft=info`) is taken as written.
//!
//! openraft also logs routine events as WARN and ERROR: every failed call to a peer (each
//! AppendEntries retry, three lines every 200 ms while a peer is down; each vote request of an
//! election; each heartbeat of a strong read), and every late reply its core ignores ("A
//! message will be ignored because vote changed", after each election). While peers start, or
//! while one is down, that is a flood that says one thing. So below `debug`, and unless a
//! directive names openraft, those events (`OPENRAFT_ROUTINE`) are left out, and the node
//! says it once instead: a peer that has not answered for a while is reported at WARN, and its
//! return at INFO (`raft::contacts`). openraft's other warnings and errors show.

use serde::{Deserialize, Serialize};
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::EnvFilter;

/// `log_format`: log lines as text, or as one JSON object each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

/// The directive added when openraft's INFO must stay below the node's level.
const OPENRAFT_BELOW_INFO: &str = "openraft=warn";

/// openraft's routine warnings and errors, left out below `debug` (module docs): its
/// replication tasks and the progress they report (each failed AppendEntries), the core's
/// per-peer failures (its events with a `target` field: a vote request or a strong read's
/// heartbeat that failed), and the core's warnings (each about a late reply it ignores, or a
/// removed peer). The core's other errors show.
const OPENRAFT_ROUTINE: &str = "openraft::replication=off,\
openraft::engine::handler::replication_handler=off,openraft::core::raft_core=error,\
openraft::core::raft_core[{target}]=off";

/// The log levels `log_level` takes, alone or after `TARGET=`.
const LOG_LEVELS: &[&str] = &["off", "error", "warn", "info", "debug", "trace"];

/// The comma-separated directives of a `log_level`, trimmed, empty ones left out.
fn parts(level: &str) -> Vec<&str> {
    level
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .collect()
}

/// Checks a `log_level`: a level (`error`, `warn`, `info`, `debug`, `trace`, `off`), or a
/// comma-separated tracing filter of levels and `TARGET=LEVEL` directives
/// (`warn,cairn_server::raft=debug`). A bare word that is no level (`verbose`) is refused:
/// the filter syntax would read it as a target and log nothing of Cairn's.
pub fn check_log_level(value: &str) -> Result<(), String> {
    let levels = LOG_LEVELS.join(", ");
    let directives = parts(value);
    if directives.is_empty() {
        return Err(format!("is empty: give one of {levels}"));
    }
    for directive in directives {
        let level = match directive.rsplit_once('=') {
            Some((target, level)) if !target.trim().is_empty() => level,
            Some(_) => {
                return Err(format!(
                    "{directive:?} names no target: write TARGET=LEVEL, as in cairn_server=debug"
                ))
            }
            None => directive,
        };
        if !LOG_LEVELS.contains(&level.trim().to_ascii_lowercase().as_str()) {
            let within = if level == value {
                String::new()
            } else {
                format!(" (in {value:?})")
            };
            return Err(format!(
                "{level:?}{within} is not a log level: give one of {levels}, or a filter \
                 such as warn,cairn_server=debug"
            ));
        }
    }
    EnvFilter::try_new(value)
        .map(|_| ())
        .map_err(|e| format!("{value:?} is not a log filter: {e}"))
}

/// The directives `log_level` stands for: `level` itself; unless a directive of its own names
/// openraft, plus `OPENRAFT_BELOW_INFO` when its default level is `info`, and
/// `OPENRAFT_ROUTINE` when it is `info`, `warn` or `error`.
pub fn directives(level: &str) -> String {
    let level = level.trim();
    let parts = parts(level);
    let names_openraft = parts.iter().any(|p| p.starts_with("openraft"));
    // The default level: the last directive that is a bare level.
    let default = parts
        .iter()
        .rev()
        .find_map(|p| p.parse::<LevelFilter>().ok());
    let mut directives = level.to_string();
    if names_openraft {
        return directives;
    }
    if default == Some(LevelFilter::INFO) {
        directives = format!("{directives},{OPENRAFT_BELOW_INFO}");
    }
    if matches!(
        default,
        Some(LevelFilter::INFO | LevelFilter::WARN | LevelFilter::ERROR)
    ) {
        directives = format!("{directives},{OPENRAFT_ROUTINE}");
    }
    directives
}

/// The filter of `log_level` ([`directives`]); `warn` when it does not parse (the
/// configuration is validated before logging starts).
pub fn filter(level: &str) -> EnvFilter {
    EnvFilter::try_new(directives(level)).unwrap_or_else(|_| EnvFilter::new("warn"))
}

/// Installs the process's log subscriber: the filter of `level` ([`filter`]), lines in
/// `format`, to stderr (`cairn agent`, and a program that embeds a node and wants its log as
/// the binary writes it). A subscriber already installed stays.
pub fn init(level: &str, format: LogFormat) {
    let filter = filter(level);
    // Colours only on a terminal: `cairn dev` and service managers send the
    // log to files, where escape codes are noise.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Json => builder.json().try_init(),
        LogFormat::Text => builder.try_init(),
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing::Level;
    use tracing_subscriber::layer::SubscriberExt as _;

    #[test]
    fn log_levels_are_levels_or_filters() {
        for good in [
            "warn",
            "INFO",
            "off",
            "warn,cairn_server=debug",
            "cairn_server::raft=trace",
        ] {
            check_log_level(good).unwrap_or_else(|e| panic!("{good}: {e}"));
        }
        for bad in [
            "verbose",
            "",
            " , ",
            "warn,loud",
            "cairn_server=loud",
            "=debug",
        ] {
            assert!(check_log_level(bad).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn openraft_info_stays_below_an_info_level_unless_named() {
        let routine = OPENRAFT_ROUTINE;
        assert_eq!(directives("info"), format!("info,openraft=warn,{routine}"));
        assert_eq!(
            directives(" INFO "),
            format!("INFO,openraft=warn,{routine}")
        );
        assert_eq!(
            directives("cairn_server=debug,info"),
            format!("cairn_server=debug,info,openraft=warn,{routine}")
        );
        // warn and error hide openraft's INFO anyway, not its failed peer calls.
        for level in ["warn", "error"] {
            assert_eq!(directives(level), format!("{level},{routine}"));
        }
        // debug and trace show everything.
        for level in ["debug", "trace", "off"] {
            assert_eq!(directives(level), level);
        }
        EnvFilter::try_new(directives("info")).expect("the added directives parse");
        // A directive of openraft's own is taken as written.
        assert_eq!(directives("info,openraft=info"), "info,openraft=info");
        assert_eq!(
            directives("info,openraft::raft=debug"),
            "info,openraft::raft=debug"
        );
        // Targets only: nothing to add.
        assert_eq!(directives("cairn_server=info"), "cairn_server=info");
    }

    /// Which of openraft's and the node's events at each level pass the filter of `level`.
    fn passes(level: &str) -> Vec<(&'static str, Level)> {
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let layer = Recorder(seen.clone());
        let subscriber = tracing_subscriber::registry()
            .with(filter(level))
            .with(layer);
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!(target: "openraft::engine", "handle vote request result");
            // Routine: four events, left out below debug.
            tracing::warn!(target: "openraft::replication", "error replication");
            tracing::warn!(target: "openraft::engine::handler::replication_handler", "update progress error");
            tracing::error!(target: "openraft::core::raft_core", target = 2, "while requesting vote");
            tracing::warn!(target: "openraft::core::raft_core", "A message will be ignored because vote changed");
            // Not routine.
            tracing::warn!(target: "openraft::storage", "a warning of its own");
            tracing::error!(target: "openraft::core::raft_core", "quit RaftCore::main on error");
            tracing::debug!(target: "openraft::core", "debug chatter");
            tracing::info!(target: "cairn_server::agent", "serving clients");
            tracing::debug!(target: "cairn_server::agent", "not ready");
        });
        let seen = seen.lock().unwrap().clone();
        seen
    }

    struct Recorder(std::sync::Arc<std::sync::Mutex<Vec<(&'static str, Level)>>>);

    impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Recorder {
        fn on_event(
            &self,
            event: &tracing::Event<'_>,
            _: tracing_subscriber::layer::Context<'_, S>,
        ) {
            let target = if event.metadata().target().starts_with("openraft") {
                "openraft"
            } else {
                "cairn"
            };
            self.0
                .lock()
                .unwrap()
                .push((target, *event.metadata().level()));
        }
    }

    #[test]
    fn at_info_openraft_keeps_its_warnings_and_errors_but_not_its_routine_ones() {
        // Of openraft's six warnings and errors, four are routine: left out.
        assert_eq!(
            passes("info"),
            vec![
                ("openraft", Level::WARN),
                ("openraft", Level::ERROR),
                ("cairn", Level::INFO)
            ]
        );
        assert_eq!(
            passes("debug").len(),
            10,
            "debug shows everything, openraft's INFO and DEBUG included"
        );
        assert_eq!(
            passes("info,openraft=info").len(),
            8,
            "named, openraft logs as written: INFO and every warning and error"
        );
        assert_eq!(
            passes("warn"),
            vec![("openraft", Level::WARN), ("openraft", Level::ERROR)]
        );
    }
}
