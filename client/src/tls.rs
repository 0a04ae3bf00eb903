//! TLS for clients: [`TlsOptions`] (the CA to trust and an optional client
//! certificate, by file path) and [`Access`], which opens channels to nodes
//! over TLS or plaintext. [`Client`](crate::Client) uses it; so do the
//! `cairn` admin commands and nodes calling each other's client port.
//!
//! A cluster is reached all over TLS or all in plaintext: once TLS options
//! are given (or an endpoint is `https://`), every address the client dials —
//! also a leader named by a hint as bare `host:port` — is dialled over TLS.

use std::path::PathBuf;
use std::time::Duration;

use cairn_proto::v1::admin_service_client::AdminServiceClient;
use cairn_tls::{ClientFiles, ClientTls};
use tonic::transport::{Channel, Endpoint};

use crate::auth::{AuthenticatedChannel, BearerToken, Credentials};
use crate::error::ClientError;

/// Files of a TLS client. With no CA file, the system's CAs are trusted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsOptions {
    /// The CA that signed the nodes' certificates (PEM).
    pub ca_file: Option<PathBuf>,
    /// A client certificate and its key (PEM), for nodes that ask for one.
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
}

/// How to reach a node: over TLS (with these settings) or not, and with
/// which credentials ([`Credentials`]: a bearer token, or none).
#[derive(Debug, Clone, Default)]
pub struct Access {
    pub tls: Option<ClientTls>,
    pub credentials: Credentials,
}

impl Access {
    /// Plaintext connections.
    pub fn plaintext() -> Access {
        Access::default()
    }

    /// The same access, presenting `token` on every call.
    pub fn with_token(mut self, token: Option<&BearerToken>) -> Access {
        self.credentials = Credentials::new(token);
        self
    }

    /// TLS with `options` if given, plaintext otherwise. A file that cannot
    /// be read or used is `InvalidArgument` naming it.
    pub fn from_options(options: Option<&TlsOptions>) -> Result<Access, ClientError> {
        let Some(options) = options else {
            return Ok(Access::plaintext());
        };
        let tls = ClientTls::from_files(&ClientFiles {
            ca_file: options.ca_file.clone(),
            cert_file: options.cert_file.clone(),
            key_file: options.key_file.clone(),
        })
        .map_err(|e| ClientError::invalid("tls", e.to_string()))?;
        Ok(Access {
            tls: Some(tls),
            credentials: Credentials::default(),
        })
    }

    /// The tonic endpoint of `address` (`host:port`, `http://` or
    /// `https://host:port`). `https://` without TLS settings is refused.
    pub fn endpoint(&self, address: &str) -> Result<Endpoint, String> {
        let (uri, wants_tls) = cairn_tls::plain_uri(address);
        if wants_tls && self.tls.is_none() {
            return Err(format!(
                "{address} asks for TLS but no TLS settings were given"
            ));
        }
        Endpoint::from_shared(uri).map_err(|e| format!("{address:?} is not an address: {e}"))
    }

    /// A channel connected now (bounded by `connect_timeout`).
    pub async fn connect(
        &self,
        address: &str,
        connect_timeout: Duration,
    ) -> Result<Channel, String> {
        // HTTP/2 pings while a call is open: a node that stops answering (a stopped process,
        // a dead host) ends a long call (a snapshot transfer, a membership change) within
        // about 15 s instead of never.
        let endpoint = self
            .endpoint(address)?
            .http2_keep_alive_interval(Duration::from_secs(5))
            .keep_alive_timeout(Duration::from_secs(10));
        let connecting = cairn_tls::connect_channel(endpoint, self.tls.as_ref(), connect_timeout);
        match tokio::time::timeout(connect_timeout, connecting).await {
            Ok(Ok(channel)) => Ok(channel),
            Ok(Err(e)) => Err(format!(
                "cannot reach {address}: {}",
                cairn_request::decide::error_chain(&e)
            )),
            Err(_) => Err(format!(
                "cannot reach {address} within {} ms",
                connect_timeout.as_millis()
            )),
        }
    }

    /// An admin client of the node at `address`, connected now, carrying
    /// this access's credentials.
    pub async fn admin(
        &self,
        address: &str,
    ) -> Result<AdminServiceClient<AuthenticatedChannel>, String> {
        Ok(AdminServiceClient::with_interceptor(
            self.connect(address, Duration::from_secs(3)).await?,
            self.credentials.clone(),
        ))
    }
}
