//! What every `cairn` command that talks to a cluster shares: how to reach it
//! ([`ClusterArgs`]: endpoints, token, TLS), the global flags ([`GlobalArgs`]:
//! those, `-o` and `--timeout-ms`, given before or after any subcommand), and
//! the one exit-code table ([`exit`], [`exit_code_of_kind`]).
//!
//! ## Exit codes
//!
//! | code | meaning |
//! |------|---------|
//! | 0 | success |
//! | 1 | any other error (group version mismatch, history compacted, internal) |
//! | 2 | usage error or invalid argument |
//! | 3 | not found |
//! | 4 | CAS conflict (CasFailure or WrongUid) |
//! | 5 | unavailable or inconsistent (no node, no leader, no quorum, deadline) |
//! | 6 | not authorized: no token or an unknown one, or a permission missing |

use std::time::Duration;

use cairn_client::{BearerToken, ClientError};
use cairn_proto::error::{ApiError, ErrorKind};
use clap::{Args, ValueEnum};

/// Exit codes of every `cairn` command: one table.
pub mod exit {
    pub const OK: u8 = 0;
    pub const ERROR: u8 = 1;
    pub const USAGE: u8 = 2;
    pub const NOT_FOUND: u8 = 3;
    pub const CAS_CONFLICT: u8 = 4;
    pub const UNAVAILABLE: u8 = 5;
    pub const DENIED: u8 = 6;
    /// A lease, lock or election was lost while held (`cairn lease keep-alive`, `lock`,
    /// `elect`).
    pub const LOST: u8 = 7;
    /// `cairn lock`: CMD could not be started, or was not found (as a shell says).
    pub const CANNOT_RUN: u8 = 126;
    pub const COMMAND_NOT_FOUND: u8 = 127;
}

/// The one exit-code table of the `cairn` binary: every command's error,
/// the client library's or a node's, exits by its kind.
pub fn exit_code_of_kind(kind: ErrorKind) -> u8 {
    match kind {
        ErrorKind::NotFound => exit::NOT_FOUND,
        ErrorKind::CasFailure | ErrorKind::WrongUid => exit::CAS_CONFLICT,
        ErrorKind::Unavailable | ErrorKind::NotLeader | ErrorKind::Inconsistent => {
            exit::UNAVAILABLE
        }
        ErrorKind::InvalidArgument => exit::USAGE,
        ErrorKind::Unauthenticated | ErrorKind::PermissionDenied => exit::DENIED,
        ErrorKind::GroupVersionMismatch
        | ErrorKind::FailedPrecondition
        | ErrorKind::ResourceExhausted
        | ErrorKind::WatchClosed
        | ErrorKind::Compacted
        | ErrorKind::Internal
        | ErrorKind::Unspecified => exit::ERROR,
    }
}

/// The exit code of a client error ([`exit_code_of_kind`]).
pub fn exit_code(e: &ClientError) -> u8 {
    exit_code_of_kind(e.kind())
}

/// How every `cairn` command that talks to a cluster reaches it: the nodes'
/// client addresses, a bearer token, TLS. The data commands take it inside
/// [`super::data::CommonArgs`]; the `cairn` binary takes it at its top, in [`GlobalArgs`].
/// Every flag is global: it may come before or after the subcommand.
#[derive(Args, Debug, Clone)]
pub struct ClusterArgs {
    /// Client addresses of cluster nodes, comma-separated (`host:port`,
    /// `http://host:port`, or `https://host:port` for TLS); tried in turn.
    #[arg(
        long,
        env = "CAIRN_ENDPOINTS",
        default_value = "127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003",
        value_delimiter = ',',
        global = true
    )]
    pub endpoints: Vec<String>,
    /// Bearer token, for a cluster that requires one (admin commands need
    /// one with the admin role).
    #[arg(long, env = "CAIRN_TOKEN", hide_env_values = true, global = true)]
    pub token: Option<String>,
    #[command(flatten)]
    pub tls: TlsArgs,
}

impl ClusterArgs {
    /// `--token`, checked ([`BearerToken::new`]).
    pub fn bearer_token(&self) -> Result<Option<BearerToken>, ClientError> {
        self.token.clone().map(BearerToken::new).transpose()
    }

    /// How to reach the nodes: TLS per the flags (or an `https://`
    /// endpoint), else plaintext; presenting `--token`, if given.
    pub fn access(&self) -> Result<cairn_client::Access, ClientError> {
        let token = self.bearer_token()?;
        Ok(self.tls.access(&self.endpoints)?.with_token(token.as_ref()))
    }
}

/// How the cluster flags say to reach the nodes (TLS, token), its error as the node's
/// vocabulary (the admin commands speak [`ApiError`]).
pub(crate) fn access(cluster: &ClusterArgs) -> Result<cairn_client::Access, ApiError> {
    cluster.access().map_err(|e| match e {
        ClientError::InvalidArgument { field, reason } => ApiError::invalid(field, reason),
        other => ApiError::invalid("endpoints", other.to_string()),
    })
}

/// The `cairn` binary's global flags: how to reach the cluster, the output
/// format and the overall timeout. Given before or after any subcommand
/// (`cairn --endpoints A member list`, `cairn member list --endpoints A`);
/// the data commands read the same flags through [`super::data::CommonArgs`].
#[derive(Args, Debug, Clone)]
#[command(next_help_heading = "Cluster options")]
pub struct GlobalArgs {
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// Output format.
    #[arg(
        short = 'o',
        long = "output",
        value_enum,
        default_value = "table",
        global = true
    )]
    pub output: OutputFormat,
    /// Deadline of each call to the cluster, failovers included (each
    /// endpoint gets a share of it).
    #[arg(long, default_value_t = 10_000, global = true, value_parser = clap::value_parser!(u64).range(1..))]
    pub timeout_ms: u64,
}

impl GlobalArgs {
    /// `--timeout-ms` (positive: clap refuses 0).
    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms)
    }
}

/// TLS options of every `cairn` command that talks to a cluster. Any of
/// them, or an `https://` endpoint, turns TLS on for every node dialled.
#[derive(Args, Debug, Clone, Default)]
pub struct TlsArgs {
    /// CA certificate (PEM) that signed the nodes' certificates (default:
    /// the system's CAs).
    #[arg(long, env = "CAIRN_CACERT", global = true)]
    pub cacert: Option<std::path::PathBuf>,
    /// Client certificate (PEM), for nodes that ask for one.
    #[arg(long, env = "CAIRN_CERT", requires = "key", global = true)]
    pub cert: Option<std::path::PathBuf>,
    /// The client certificate's private key (PEM).
    #[arg(long, env = "CAIRN_KEY", requires = "cert", global = true)]
    pub key: Option<std::path::PathBuf>,
}

impl TlsArgs {
    /// The TLS options these flags and `endpoints` ask for, if any.
    pub fn options(&self, endpoints: &[String]) -> Option<cairn_client::TlsOptions> {
        let wanted = self.cacert.is_some()
            || self.cert.is_some()
            || self.key.is_some()
            || endpoints.iter().any(|e| e.trim().starts_with("https://"));
        wanted.then(|| cairn_client::TlsOptions {
            ca_file: self.cacert.clone(),
            cert_file: self.cert.clone(),
            key_file: self.key.clone(),
        })
    }

    /// How to reach the nodes (TLS files read now; a bad one is InvalidArgument).
    pub fn access(&self, endpoints: &[String]) -> Result<cairn_client::Access, ClientError> {
        cairn_client::Access::from_options(self.options(endpoints).as_ref())
    }
}

/// `-o table|json`: one type for every command, since the global `-o` and a subcommand's
/// own (`cairn bench`) share their values.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OutputFormat {
    #[default]
    Table,
    Json,
}

/// The multi-threaded runtime a command runs on.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("cannot start the tokio runtime")
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_client::Outcome;

    /// The agent ignores the `CAIRN_*` variables of the cluster flags without a warning; it
    /// knows them by the list the configuration keeps, which must be these flags' own.
    #[test]
    fn the_configuration_knows_the_cluster_flags_variables() {
        let mut flags: Vec<String> = ClusterArgs::augment_args(clap::Command::new("client"))
            .get_arguments()
            .filter_map(|arg| arg.get_env())
            .map(|name| name.to_string_lossy().into_owned())
            .collect();
        flags.sort();
        let mut known: Vec<String> = cairn_server::config::COMMAND_LINE_ENVIRONMENT
            .iter()
            .map(|n| n.to_string())
            .collect();
        known.sort();
        assert_eq!(flags, known);
    }

    #[test]
    fn exit_codes_follow_the_shared_table() {
        // 3 not found, 4 CAS conflict, 5 unavailable, 2 invalid, 1 the rest.
        assert_eq!(exit_code(&ClientError::NotFound), 3);
        assert_eq!(exit_code(&ClientError::CasFailure(String::new())), 4);
        assert_eq!(exit_code(&ClientError::WrongUid(String::new())), 4);
        assert_eq!(
            exit_code(&ClientError::Unavailable {
                message: String::new(),
                outcome: Outcome::Unknown
            }),
            5
        );
        assert_eq!(
            exit_code(&ClientError::DeadlineExceeded {
                deadline_ms: 1,
                detail: String::new(),
                outcome: Outcome::NotApplied
            }),
            5
        );
        assert_eq!(exit_code(&ClientError::invalid("f", "r")), 2);
        assert_eq!(exit_code(&ClientError::WatchClosed(String::new())), 1);
        // The node's admin commands exit by the same table.
        use cairn_proto::error::{ApiError, LeaderHint};
        for (e, code) in [
            (ApiError::NotFound, 3),
            (ApiError::CasFailure(String::new()), 4),
            (ApiError::Unavailable(String::new()), 5),
            (ApiError::Inconsistent(String::new()), 5),
            (
                ApiError::NotLeader {
                    hint: LeaderHint::default(),
                },
                5,
            ),
            (ApiError::invalid("f", "r"), 2),
            (ApiError::Unauthenticated(String::new()), 6),
            (ApiError::PermissionDenied(String::new()), 6),
            (ApiError::Internal(String::new()), 1),
            (ApiError::FailedPrecondition(String::new()), 1),
        ] {
            assert_eq!(exit_code_of_kind(e.kind()), code, "{e:?}");
        }
    }
}
