//! The reload task: what a node takes up without a restart.
//!
//! - **SIGHUP**: the configuration is loaded again from where it came from
//!   (file, environment, flags: [`ConfigSource`]) and its grants replace the
//!   grants in force ([`Authenticator::reload`]); its `auth.node_token_file`
//!   is read again, and the token this node presents to other nodes is
//!   replaced ([`cairn_client::Credentials::replace`]); the certificate
//!   files are read again ([`NodeTls::reload`]). One signal, one path, every
//!   reload.
//! - **Every `tls_reload_interval_ms`**: the certificate files, if their
//!   bytes changed (the grants only on SIGHUP: a config file being edited
//!   is not read half-written).
//!
//! Each reload is all or nothing: a configuration that does not load,
//! grants that do not parse, or certificates that do not make a usable
//! configuration leave what is in force, and the node logs why (`ERROR`,
//! "... reload failed"). Other settings changed in the file take effect at
//! the next restart; a SIGHUP says which (`WARN`).
//!
//! Tasks: one, the reload task; it ends with the agent. It never stops the
//! node.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::auth::Authenticator;
use crate::config::{Config, ConfigSource};
use crate::tls::NodeTls;

/// What the reload task reloads, and from where.
pub struct Reloader {
    pub source: ConfigSource,
    /// The configuration the node started with.
    pub started: Config,
    pub tls: Option<Arc<NodeTls>>,
    pub auth: Arc<Authenticator>,
    /// What this node presents when it calls other nodes' client ports.
    pub node_credentials: cairn_client::Credentials,
}

/// What woke the reload task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cause {
    Hangup,
    Poll,
}

impl Reloader {
    /// Certificates (all on SIGHUP, changed ones on a poll), then, on
    /// SIGHUP, the grants.
    fn reload(&self, cause: Cause) {
        self.reload_certificates(cause);
        if cause == Cause::Hangup {
            self.reload_auth();
        }
    }

    fn reload_certificates(&self, cause: Cause) {
        let Some(tls) = &self.tls else {
            return;
        };
        match tls.reload(cause == Cause::Poll) {
            Ok(true) => tracing::warn!(
                cause = match cause {
                    Cause::Poll => "files changed",
                    Cause::Hangup => "SIGHUP",
                },
                "TLS certificates reloaded; new connections use them"
            ),
            Ok(false) => {}
            Err(e) => tracing::error!(
                error = %e,
                "TLS reload failed; the certificates in force stay"
            ),
        }
    }

    /// The grants, then the node token, from the configuration loaded again.
    fn reload_auth(&self) {
        let config = match self.source.load() {
            Ok(config) => config,
            Err(e) => {
                tracing::error!(
                    error = %e,
                    "grants reload failed: the configuration does not load; the grants in force stay"
                );
                return;
            }
        };
        match self.auth.reload(&config.auth) {
            Ok(true) => tracing::warn!(
                grants = self.auth.current().grant_count(),
                "grants reloaded from the configuration; open watches whose grant changed are closed"
            ),
            Ok(false) => tracing::info!("SIGHUP: the grants are unchanged"),
            Err(e) => tracing::error!(
                error = %e,
                "grants reload failed; the grants in force stay"
            ),
        }
        self.reload_node_token(&config);
        let later = self.started.settings_changed(&config);
        if !later.is_empty() {
            tracing::warn!(
                settings = ?later,
                "these settings changed in the configuration; they take effect at the next restart"
            );
        }
    }
}

impl Reloader {
    /// The token of `config`'s `auth.node_token_file`, read again. A file
    /// that cannot be read or holds no valid token, or a configuration that
    /// no longer names one, leaves the token in force (removing it takes a
    /// restart, as turning authentication off does).
    fn reload_node_token(&self, config: &Config) {
        if config.auth.node_token_file.is_none() {
            if self.started.auth.node_token_file.is_some() {
                tracing::warn!(
                    "auth.node_token_file is no longer set; the node token in force stays \
                     until the next restart"
                );
            }
            return;
        }
        match crate::auth::load_node_token(&config.auth) {
            Ok(token) => {
                self.node_credentials.replace(token.as_ref());
                tracing::info!("node token reloaded from auth.node_token_file");
                crate::auth::log_auth_mode(&self.auth.current(), token.as_ref());
            }
            Err(e) => tracing::error!(
                error = %e,
                "node token reload failed; the node token in force stays"
            ),
        }
    }
}

/// Reloads on SIGHUP and, every `interval` (if any), the certificates whose
/// files changed.
pub fn spawn(
    reloader: Reloader,
    interval: Option<Duration>,
    mut stopped: watch::Receiver<bool>,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let mut hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())?;
    Ok(tokio::spawn(async move {
        let mut poll = interval.map(tokio::time::interval);
        loop {
            let cause = tokio::select! {
                _ = stopped.wait_for(|s| *s) => return,
                _ = hangup.recv() => Cause::Hangup,
                _ = async {
                    match poll.as_mut() {
                        Some(p) => { p.tick().await; }
                        None => std::future::pending::<()>().await,
                    }
                } => Cause::Poll,
            };
            reloader.reload(cause);
        }
    }))
}
