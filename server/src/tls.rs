//! A node's TLS: the server configurations of its two ports, the client
//! configuration of the connections it opens, their reload, and
//! [`client_cert_subject`] for request handlers.
//!
//! - Client port: this node's certificate; client certificates per
//!   `tls_client_auth` (`none`, `optional`, `required`), verified against
//!   `tls_client_ca_file` (default `tls_ca_file`) and, when that is another
//!   CA, the cluster CA too: other nodes call this port (join, leader
//!   transfer, the membership check at start) presenting their node
//!   certificate, and authenticate by their node token.
//! - Peer port: mutual TLS, always: a peer without a certificate from the
//!   cluster CA (`tls_ca_file`) fails the handshake, so it can send no Raft
//!   message, forwarded request or snapshot; and the certificate must name
//!   the node the message claims to come from (`cairn-node-{id}`, checked by
//!   the peer gate, `crate::raft::peer_gate`).
//! - Outgoing (Raft, forwarding, node-to-node admin calls): this node's
//!   certificate as client certificate, the cluster CA as trust anchor.
//!
//! Reload ([`NodeTls::reload`], driven by `crate::reload`): every file is
//! read again on SIGHUP, and every `tls_reload_interval_ms` when a file's
//! bytes changed. A reload that fails (a file half-written, a key that does
//! not match) keeps the configuration in force; the next change or SIGHUP
//! tries again. Open connections keep the configuration they started with.
//!
//! Tasks: none.

use std::path::PathBuf;
use std::sync::Arc;

use cairn_tls::rustls::ServerConfig;
use cairn_tls::{ClientAuth, ClientFiles, ClientTls, Reloadable, ServerFiles, TlsError};
use parking_lot::Mutex;

use crate::config::Config;
use crate::connections::ConnectionInfo;

/// The subject (common name, else the whole distinguished name) of the client
/// certificate that the request's connection verified in its TLS handshake;
/// `None` on a plaintext port or when the client presented no certificate.
pub fn client_cert_subject<T>(request: &tonic::Request<T>) -> Option<&str> {
    request
        .extensions()
        .get::<ConnectionInfo>()
        .and_then(|info| info.client_subject.as_deref())
}

/// The file paths of a node's TLS.
#[derive(Debug, Clone, PartialEq, Eq)]
struct NodeFiles {
    cert_file: PathBuf,
    key_file: PathBuf,
    ca_file: PathBuf,
    client_ca_file: PathBuf,
    client_auth: ClientAuth,
}

impl NodeFiles {
    fn all(&self) -> [&PathBuf; 4] {
        [
            &self.cert_file,
            &self.key_file,
            &self.ca_file,
            &self.client_ca_file,
        ]
    }
}

/// Every configuration built from one reading of the files.
struct Built {
    client_port: ServerConfig,
    peer_port: ServerConfig,
    outgoing: cairn_tls::rustls::ClientConfig,
}

fn build(files: &NodeFiles) -> Result<Built, TlsError> {
    let mut client_ca_files = vec![files.client_ca_file.clone()];
    if files.client_ca_file != files.ca_file {
        client_ca_files.push(files.ca_file.clone());
    }
    let client_port = cairn_tls::server_config(&ServerFiles {
        cert_file: files.cert_file.clone(),
        key_file: files.key_file.clone(),
        client_ca_files,
        client_auth: files.client_auth,
    })?;
    let peer_port = cairn_tls::server_config(&ServerFiles {
        cert_file: files.cert_file.clone(),
        key_file: files.key_file.clone(),
        client_ca_files: vec![files.ca_file.clone()],
        client_auth: ClientAuth::Required,
    })?;
    cairn_tls::assert_h2(&client_port.alpn_protocols);
    cairn_tls::assert_h2(&peer_port.alpn_protocols);
    let outgoing = cairn_tls::client_config(&ClientFiles {
        ca_file: Some(files.ca_file.clone()),
        cert_file: Some(files.cert_file.clone()),
        key_file: Some(files.key_file.clone()),
    })?;
    Ok(Built {
        client_port,
        peer_port,
        outgoing,
    })
}

/// A node's TLS configurations, swapped whole on reload.
pub struct NodeTls {
    files: NodeFiles,
    pub client_port: Reloadable<ServerConfig>,
    pub peer_port: Reloadable<ServerConfig>,
    /// What this node dials peers (and other nodes' client ports) with.
    pub outgoing: ClientTls,
    /// The files' bytes at the last attempt, loaded or not: a poll tries
    /// again only when they change (a broken file is reported once, not at
    /// every poll).
    last_read: Mutex<Vec<Vec<u8>>>,
}

impl NodeTls {
    /// `None` when the configuration has TLS off; an error names the file.
    pub fn load(config: &Config) -> Result<Option<Arc<NodeTls>>, TlsError> {
        let (Some(cert_file), Some(key_file), Some(ca_file)) = (
            config.tls_cert_file.clone(),
            config.tls_key_file.clone(),
            config.tls_ca_file.clone(),
        ) else {
            return Ok(None);
        };
        let files = NodeFiles {
            client_ca_file: config
                .tls_client_ca_file
                .clone()
                .unwrap_or_else(|| ca_file.clone()),
            cert_file,
            key_file,
            ca_file,
            client_auth: config.tls_client_auth.into(),
        };
        let contents = read_all(&files);
        let built = build(&files)?;
        Ok(Some(Arc::new(NodeTls {
            client_port: Reloadable::new(built.client_port),
            peer_port: Reloadable::new(built.peer_port),
            outgoing: ClientTls::new(built.outgoing),
            files,
            last_read: Mutex::new(contents),
        })))
    }

    /// Re-reads the files (always, or only if one changed since the last
    /// attempt) and swaps every configuration. `Ok(false)`: nothing changed.
    pub fn reload(&self, only_if_changed: bool) -> Result<bool, TlsError> {
        let contents = read_all(&self.files);
        {
            let mut last_read = self.last_read.lock();
            if only_if_changed && *last_read == contents {
                return Ok(false);
            }
            *last_read = contents;
        }
        let built = build(&self.files)?;
        self.client_port.replace(built.client_port);
        self.peer_port.replace(built.peer_port);
        self.outgoing.replace(built.outgoing);
        Ok(true)
    }
}

/// Each file's bytes (empty when unreadable: the build reports why).
fn read_all(files: &NodeFiles) -> Vec<Vec<u8>> {
    files
        .all()
        .iter()
        .map(|p| std::fs::read(p).unwrap_or_default())
        .collect()
}
