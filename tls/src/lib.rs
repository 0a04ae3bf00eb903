//! # cairn-tls — TLS for Cairn's gRPC connections
//!
//! **Purpose.** Turns PEM files named by path into rustls configurations,
//! keeps them swappable ([`Reloadable`]) so that a node picks up replaced
//! certificates without a restart, and dials every tonic channel of Cairn's, over TLS with
//! the configuration current at each dial or in plaintext, each dial bounded by its connect
//! timeout, as a connection h2 coalesces small frames on ([`Connector`], [`lazy_channel`],
//! [`connect_channel`], [`WRITE_VECTORED`]). The node's accept side (handshake deadline,
//! connection limits) lives in `cairn-server`; this crate only builds what both
//! sides share.
//!
//! **What it must not do.** Read a file anywhere but in the `load_*`
//! functions (so every file error names its path and role); pick a crypto
//! provider implicitly: every configuration is built with ring, named here,
//! so another crate enabling a second rustls provider cannot make the
//! process default ambiguous; hand tonic an `https://` URI (TLS is done by
//! this crate's connector, so tonic's own TLS features, if some crate enables
//! them, never see our connections).
//!
//! **Concurrency model.** A [`Reloadable`] is an `Arc` swapped whole under a
//! short `parking_lot` lock; a connection clones the `Arc` current when it is
//! dialled or accepted and keeps it for its life.
//!
//! ## Invariants
//! - Every configuration built here advertises ALPN `h2` (gRPC clients such
//!   as grpc-go refuse a TLS server that does not): set in one place
//!   (`advertise_h2`), asserted there and wherever a configuration is
//!   handed over to dial with ([`ClientTls`]).
//! - A reload never changes an open connection; it only changes the
//!   configuration the next connection uses.
//! - A peer's certificate chain is verified by rustls during the handshake,
//!   before a byte of HTTP/2 is read or written.

use std::future::Future;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use parking_lot::RwLock;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tonic::transport::{Channel, Endpoint};

pub use rustls;
pub use tokio_rustls;

/// The ALPN protocol of gRPC.
pub const ALPN_H2: &[u8] = b"h2";

/// Makes `h2` the one ALPN protocol of a configuration's list.
fn advertise_h2(alpn_protocols: &mut Vec<Vec<u8>>) {
    *alpn_protocols = vec![ALPN_H2.to_vec()];
    assert_h2(alpn_protocols);
}

/// Panics unless `alpn_protocols` offers `h2` (a broken invariant: every
/// configuration is built by this crate).
pub fn assert_h2(alpn_protocols: &[Vec<u8>]) {
    assert!(
        alpn_protocols.iter().any(|p| p == ALPN_H2),
        "a TLS configuration of Cairn must advertise ALPN h2"
    );
}

/// What went wrong loading TLS material. Each names the file and its role.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read the {role} file {path}: {reason}")]
    File {
        role: &'static str,
        path: PathBuf,
        reason: String,
    },
    #[error("the {role} file {path} holds no {expected}")]
    Empty {
        role: &'static str,
        path: PathBuf,
        expected: &'static str,
    },
    #[error("TLS configuration: {0}")]
    Config(String),
}

/// The crypto provider of every configuration built here.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Every certificate of a PEM file (a chain: leaf first).
pub fn load_certificates(
    role: &'static str,
    path: &Path,
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let file_error = |reason: String| TlsError::File {
        role,
        path: path.to_path_buf(),
        reason,
    };
    let certificates = CertificateDer::pem_file_iter(path)
        .map_err(|e| file_error(e.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_error(e.to_string()))?;
    if certificates.is_empty() {
        return Err(TlsError::Empty {
            role,
            path: path.to_path_buf(),
            expected: "PEM certificate",
        });
    }
    Ok(certificates)
}

/// The private key of a PEM file (PKCS#8, PKCS#1 or SEC1).
pub fn load_private_key(
    role: &'static str,
    path: &Path,
) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| match e {
        rustls::pki_types::pem::Error::NoItemsFound => TlsError::Empty {
            role,
            path: path.to_path_buf(),
            expected: "PEM private key",
        },
        other => TlsError::File {
            role,
            path: path.to_path_buf(),
            reason: other.to_string(),
        },
    })
}

/// The trust anchors of a PEM file of CA certificates.
pub fn load_roots(role: &'static str, path: &Path) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for certificate in load_certificates(role, path)? {
        roots.add(certificate).map_err(|e| TlsError::File {
            role,
            path: path.to_path_buf(),
            reason: format!("not a usable CA certificate: {e}"),
        })?;
    }
    Ok(roots)
}

/// The system's trust anchors (for `https://` endpoints without a CA file).
pub fn native_roots() -> Result<RootCertStore, TlsError> {
    let found = rustls_native_certs::load_native_certs();
    let mut roots = RootCertStore::empty();
    let (_added, _ignored) = roots.add_parsable_certificates(found.certs);
    if roots.is_empty() {
        return Err(TlsError::Config(format!(
            "no CA file given and no system CA certificates found{}",
            found
                .errors
                .first()
                .map(|e| format!(" ({e})"))
                .unwrap_or_default()
        )));
    }
    Ok(roots)
}

/// Whether a server asks its clients for a certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientAuth {
    /// Never asks.
    None,
    /// Asks; a client may present none, but one it presents must verify.
    Optional,
    /// A client without a certificate that verifies is refused in the handshake.
    Required,
}

/// The files of a TLS server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerFiles {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    /// CAs that client certificates must chain to, one of them (needed
    /// unless `client_auth` is `None`).
    pub client_ca_files: Vec<PathBuf>,
    pub client_auth: ClientAuth,
}

/// Reads the files of a server and builds its configuration (ALPN h2).
pub fn server_config(files: &ServerFiles) -> Result<ServerConfig, TlsError> {
    let certificates = load_certificates("certificate", &files.cert_file)?;
    let key = load_private_key("private key", &files.key_file)?;
    let builder = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?;
    let builder = match (files.client_auth, files.client_ca_files.as_slice()) {
        (ClientAuth::None, _) => builder.with_no_client_auth(),
        (_, []) => {
            return Err(TlsError::Config(
                "client certificate authentication needs a client CA file".into(),
            ))
        }
        (mode, cas) => {
            let mut roots = RootCertStore::empty();
            for ca in cas {
                roots.roots.extend(load_roots("client CA", ca)?.roots);
            }
            let roots = Arc::new(roots);
            let verifier =
                rustls::server::WebPkiClientVerifier::builder_with_provider(roots, provider());
            let verifier = if mode == ClientAuth::Optional {
                verifier.allow_unauthenticated()
            } else {
                verifier
            };
            let verifier = verifier.build().map_err(|e| {
                let files: Vec<_> = cas.iter().map(|ca| ca.display().to_string()).collect();
                TlsError::Config(format!("client CA {}: {e}", files.join(", ")))
            })?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder.with_single_cert(certificates, key).map_err(|e| {
        TlsError::Config(format!(
            "certificate {} and key {} do not make a usable pair: {e}",
            files.cert_file.display(),
            files.key_file.display()
        ))
    })?;
    advertise_h2(&mut config.alpn_protocols);
    Ok(config)
}

/// The files of a TLS client. With no CA file, the system's CAs are trusted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientFiles {
    pub ca_file: Option<PathBuf>,
    /// Client certificate and key, presented to servers that ask (both or neither).
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
}

/// Reads the files of a client and builds its configuration (ALPN h2).
pub fn client_config(files: &ClientFiles) -> Result<ClientConfig, TlsError> {
    let roots = match &files.ca_file {
        Some(ca) => load_roots("CA", ca)?,
        None => native_roots()?,
    };
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?
        .with_root_certificates(roots);
    let mut config = match (&files.cert_file, &files.key_file) {
        (None, None) => builder.with_no_client_auth(),
        (Some(cert), Some(key)) => {
            let certificates = load_certificates("client certificate", cert)?;
            let key_der = load_private_key("client key", key)?;
            builder
                .with_client_auth_cert(certificates, key_der)
                .map_err(|e| {
                    TlsError::Config(format!(
                        "client certificate {} and key {} do not make a usable pair: {e}",
                        cert.display(),
                        key.display()
                    ))
                })?
        }
        (Some(_), None) => {
            return Err(TlsError::Config(
                "a client certificate needs its key file too".into(),
            ))
        }
        (None, Some(_)) => {
            return Err(TlsError::Config(
                "a client key needs its certificate file too".into(),
            ))
        }
    };
    advertise_h2(&mut config.alpn_protocols);
    Ok(config)
}

/// A value swapped whole on reload; readers take the current `Arc`.
pub struct Reloadable<T>(Arc<RwLock<Arc<T>>>);

impl<T> Clone for Reloadable<T> {
    fn clone(&self) -> Self {
        Reloadable(self.0.clone())
    }
}

impl<T> Reloadable<T> {
    pub fn new(value: T) -> Reloadable<T> {
        Reloadable(Arc::new(RwLock::new(Arc::new(value))))
    }

    /// The current value (kept by the caller for as long as it needs it).
    pub fn current(&self) -> Arc<T> {
        self.0.read().clone()
    }

    /// Replaces the value for every later [`Reloadable::current`].
    pub fn replace(&self, value: T) {
        *self.0.write() = Arc::new(value);
    }
}

/// Outgoing TLS: the client configuration every new connection dials with.
#[derive(Clone)]
pub struct ClientTls {
    config: Reloadable<ClientConfig>,
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClientTls")
    }
}

impl ClientTls {
    pub fn new(config: ClientConfig) -> ClientTls {
        assert_h2(&config.alpn_protocols);
        ClientTls {
            config: Reloadable::new(config),
        }
    }

    pub fn from_files(files: &ClientFiles) -> Result<ClientTls, TlsError> {
        Ok(ClientTls::new(client_config(files)?))
    }

    /// Later connections dial with `config`; open ones keep theirs.
    pub fn replace(&self, config: ClientConfig) {
        assert_h2(&config.alpn_protocols);
        self.config.replace(config);
    }
}

/// `host:port` or `http(s)://host:port` as the `http://` URI tonic is given
/// (TLS is this crate's business, never tonic's), and whether the address
/// asked for TLS (`https://`).
pub fn plain_uri(address: &str) -> (String, bool) {
    let address = address.trim();
    if let Some(rest) = address.strip_prefix("https://") {
        (format!("http://{rest}"), true)
    } else if address.starts_with("http://") {
        (address.to_string(), false)
    } else {
        (format!("http://{address}"), false)
    }
}

/// A channel that connects on first use, and again after a connection breaks: over TLS
/// with `tls`, else plaintext, each dial bounded by `connect_timeout` ([`Connector`]).
pub fn lazy_channel(
    endpoint: Endpoint,
    tls: Option<&ClientTls>,
    connect_timeout: Duration,
) -> Channel {
    endpoint.connect_with_connector_lazy(Connector::new(tls, connect_timeout))
}

/// A channel connected now: over TLS with `tls`, else plaintext, each dial bounded by
/// `connect_timeout` ([`Connector`]).
pub async fn connect_channel(
    endpoint: Endpoint,
    tls: Option<&ClientTls>,
    connect_timeout: Duration,
) -> Result<Channel, tonic::transport::Error> {
    endpoint
        .connect_with_connector(Connector::new(tls, connect_timeout))
        .await
}

/// Dials `host:port` over TCP (no Nagle) within its connect timeout, then TLS with the
/// configuration current at that moment if it has one (the server must prove the URI's host
/// name or IP); every channel of Cairn's dials with it, plaintext too, so that each
/// connection is a [`Stream`]. tonic's `Endpoint::connect_timeout` does not reach a connector
/// of one's own: the timeout is this one's.
#[derive(Clone)]
pub struct Connector {
    tls: Option<ClientTls>,
    connect_timeout: Duration,
}

impl Connector {
    pub fn new(tls: Option<&ClientTls>, connect_timeout: Duration) -> Connector {
        Connector {
            tls: tls.cloned(),
            connect_timeout,
        }
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl tower_service::Service<http::Uri> for Connector {
    type Response = TokioIo<Stream>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: http::Uri) -> Self::Future {
        let config = self.tls.as_ref().map(|tls| tls.config.current());
        let connect_timeout = self.connect_timeout;
        Box::pin(async move {
            let host = uri
                .host()
                .ok_or_else(|| format!("{uri} names no host"))?
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_string();
            let port = uri
                .port_u16()
                .ok_or_else(|| format!("{uri} names no port"))?;
            let dialled = async {
                let tcp = TcpStream::connect((host.as_str(), port)).await?;
                tcp.set_nodelay(true)?;
                let Some(config) = config else {
                    return Ok::<_, BoxError>(Stream::Plain(tcp));
                };
                let server_name = match host.parse::<IpAddr>() {
                    Ok(ip) => ServerName::IpAddress(ip.into()),
                    Err(_) => ServerName::try_from(host.clone())
                        .map_err(|e| format!("{host:?} is not a valid TLS server name: {e}"))?,
                };
                let tls = tokio_rustls::TlsConnector::from(config)
                    .connect(server_name, tcp)
                    .await
                    .map_err(|e| format!("TLS handshake with {host}:{port} failed: {e}"))?;
                Ok(Stream::Tls(Box::new(tls)))
            };
            match tokio::time::timeout(connect_timeout, dialled).await {
                Ok(stream) => Ok(TokioIo::new(stream?)),
                Err(_) => Err(format!(
                    "connecting to {host}:{port} took longer than {} ms",
                    connect_timeout.as_millis()
                )
                .into()),
            }
        })
    }
}

/// What every connection of Cairn's answers to [`AsyncWrite::is_write_vectored`], the
/// client's ([`Stream`]) and the node's accepted ones (`cairn-server`'s `connections`): no.
///
/// h2 reads it to choose how to queue a DATA frame. With vectored writes it chains each
/// payload over 256 bytes instead of copying it, and writes a chained payload before it queues
/// the next frame: a write's request or response (about 400 bytes) went out in a `writev` of
/// its own, and the trailers after it in another. Without, it copies payloads under 1 KiB into
/// its 16 KiB write buffer and writes every frame ready in one `write`. Measured at 64 clients
/// on one connection (`docs/benchmarks.md`): the leader's system calls per write 2.8 → 1.9,
/// the load generator's 4.1 → 2.4. A larger payload is still chained; it then costs two
/// `write`s instead of one `writev`.
pub const WRITE_VECTORED: bool = false;

/// A connection [`Connector`] dialled, plaintext or TLS, as a channel's HTTP/2 client writes
/// it: without vectored writes ([`WRITE_VECTORED`]).
pub enum Stream {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn is_write_vectored(&self) -> bool {
        WRITE_VECTORED
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// The name a node's certificate carries, as common name or DNS subject
/// alternative name, to be admitted as node `node_id` on the peer port:
/// `cairn-node-{node_id}`. `cairn tls init` issues node certificates with
/// it; operators who bring their own certificates give each node its name.
pub fn node_certificate_name(node_id: u64) -> String {
    format!("{NODE_NAME_PREFIX}{node_id}")
}

/// The prefix of [`node_certificate_name`].
pub const NODE_NAME_PREFIX: &str = "cairn-node-";

/// The node ids a DER certificate names ([`node_certificate_name`]) in its
/// common names and DNS subject alternative names, sorted, without
/// duplicates; empty for a certificate that names no node (a client's) or
/// does not parse.
pub fn certificate_node_ids(certificate: &CertificateDer<'_>) -> Vec<u64> {
    let Ok((_, parsed)) = x509_parser::parse_x509_certificate(certificate.as_ref()) else {
        return Vec::new();
    };
    let common_names = parsed
        .subject()
        .iter_common_name()
        .filter_map(|cn| cn.as_str().ok())
        .map(str::to_string)
        .collect::<Vec<_>>();
    let dns_names = parsed
        .subject_alternative_name()
        .ok()
        .flatten()
        .map(|san| {
            san.value
                .general_names
                .iter()
                .filter_map(|name| match name {
                    x509_parser::extensions::GeneralName::DNSName(dns) => Some(dns.to_string()),
                    _ => None,
                })
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    let mut ids: Vec<u64> = common_names
        .iter()
        .chain(&dns_names)
        .filter_map(|name| node_id_of_name(name))
        .collect();
    ids.sort_unstable();
    ids.dedup();
    ids
}

/// `cairn-node-{id}` → `id` (decimal digits only, no sign, no leading zero).
fn node_id_of_name(name: &str) -> Option<u64> {
    let digits = name.strip_prefix(NODE_NAME_PREFIX)?;
    if digits.is_empty()
        || !digits.bytes().all(|b| b.is_ascii_digit())
        || (digits.len() > 1 && digits.starts_with('0'))
    {
        return None;
    }
    digits.parse().ok()
}

/// The subject of a DER certificate as a client identity: its common name
/// if it has one, else the whole distinguished name (`CN=..,O=..`).
pub fn certificate_subject(certificate: &CertificateDer<'_>) -> Option<String> {
    let (_, parsed) = x509_parser::parse_x509_certificate(certificate.as_ref()).ok()?;
    let subject = parsed.subject();
    let common_name = subject
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .map(str::to_string);
    common_name.or_else(|| {
        let whole = subject.to_string();
        (!whole.is_empty()).then_some(whole)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_become_plain_uris_and_remember_whether_tls_was_asked() {
        assert_eq!(
            plain_uri("127.0.0.1:7001"),
            ("http://127.0.0.1:7001".into(), false)
        );
        assert_eq!(plain_uri("https://h:1"), ("http://h:1".into(), true));
        assert_eq!(plain_uri(" http://h:1 "), ("http://h:1".into(), false));
    }

    /// A CA and a leaf it issued (common name `name`, DNS names `dns`),
    /// written as PEM files into `dir`: (ca, cert, key).
    fn issue(dir: &Path, name: &str, dns: &[&str]) -> (PathBuf, PathBuf, PathBuf) {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
        let ca_key = KeyPair::generate().unwrap();
        let mut ca_params = CertificateParams::new(Vec::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let issuer = Issuer::new(ca_params, ca_key);
        let key = KeyPair::generate().unwrap();
        let mut params =
            CertificateParams::new(dns.iter().map(|d| d.to_string()).collect::<Vec<_>>()).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        let cert = params.signed_by(&key, &issuer).unwrap();
        let files = (
            dir.join(format!("{name}-ca.pem")),
            dir.join(format!("{name}.pem")),
            dir.join(format!("{name}-key.pem")),
        );
        std::fs::write(&files.0, ca.pem()).unwrap();
        std::fs::write(&files.1, cert.pem()).unwrap();
        std::fs::write(&files.2, key.serialize_pem()).unwrap();
        files
    }

    /// A dial gives a [`Stream`] that h2 coalesces small frames on ([`WRITE_VECTORED`]), in
    /// plaintext; over TLS, a handshake the server never answers is given up at the connect
    /// timeout, which names it.
    #[tokio::test]
    async fn a_dial_writes_unvectored_and_gives_up_at_its_connect_timeout() {
        use tower_service::Service;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        // Accepts and holds every connection, never writing a byte.
        let holder = tokio::spawn(async move {
            let mut held = Vec::new();
            loop {
                held.push(listener.accept().await.unwrap().0);
            }
        });
        let uri: http::Uri = format!("http://{address}").parse().unwrap();
        let plain = Connector::new(None, Duration::from_secs(5))
            .call(uri.clone())
            .await
            .unwrap();
        assert!(matches!(plain.inner(), Stream::Plain(_)));
        assert!(!plain.inner().is_write_vectored());

        let dir = tempfile::tempdir().unwrap();
        let (ca, _, _) = issue(dir.path(), "server", &["localhost"]);
        let tls = ClientTls::from_files(&ClientFiles {
            ca_file: Some(ca),
            ..ClientFiles::default()
        })
        .unwrap();
        let refused = Connector::new(Some(&tls), Duration::from_millis(200))
            .call(uri)
            .await
            .err()
            .expect("a handshake nobody answers");
        assert!(
            refused.to_string().contains(&format!(
                "connecting to 127.0.0.1:{} took longer than 200 ms",
                address.port()
            )),
            "{refused}"
        );
        holder.abort();
    }

    #[test]
    fn every_configuration_advertises_h2() {
        let dir = tempfile::tempdir().unwrap();
        let (ca, cert, key) = issue(dir.path(), "server", &["localhost"]);
        for client_auth in [ClientAuth::None, ClientAuth::Optional, ClientAuth::Required] {
            let config = server_config(&ServerFiles {
                cert_file: cert.clone(),
                key_file: key.clone(),
                client_ca_files: vec![ca.clone()],
                client_auth,
            })
            .unwrap();
            assert_eq!(config.alpn_protocols, vec![ALPN_H2.to_vec()]);
        }
        for (cert_file, key_file) in [(None, None), (Some(cert.clone()), Some(key.clone()))] {
            let config = client_config(&ClientFiles {
                ca_file: Some(ca.clone()),
                cert_file,
                key_file,
            })
            .unwrap();
            assert_eq!(config.alpn_protocols, vec![ALPN_H2.to_vec()]);
            ClientTls::new(config);
        }
    }

    #[test]
    #[should_panic(expected = "must advertise ALPN h2")]
    fn a_client_configuration_without_h2_is_a_broken_invariant() {
        let dir = tempfile::tempdir().unwrap();
        let (ca, _, _) = issue(dir.path(), "server", &[]);
        let mut config = client_config(&ClientFiles {
            ca_file: Some(ca),
            ..ClientFiles::default()
        })
        .unwrap();
        config.alpn_protocols.clear();
        ClientTls::new(config);
    }

    #[test]
    fn a_certificate_names_the_nodes_of_its_common_name_and_dns_names() {
        let dir = tempfile::tempdir().unwrap();
        let ids = |name: &str, dns: &[&str]| {
            let (_, cert, _) = issue(dir.path(), name, dns);
            certificate_node_ids(&load_certificates("certificate", &cert).unwrap()[0])
        };
        assert_eq!(ids("cairn-node-2", &["localhost", "127.0.0.1"]), vec![2]);
        assert_eq!(ids("node-two", &["cairn-node-2", "localhost"]), vec![2]);
        assert_eq!(ids("cairn-client", &["localhost"]), Vec::<u64>::new());
        assert_eq!(
            ids("cairn-node-4", &["cairn-node-4", "cairn-node-5"]),
            vec![4, 5]
        );
    }

    #[test]
    fn only_a_plain_cairn_node_name_names_a_node() {
        assert_eq!(node_id_of_name(&node_certificate_name(3)), Some(3));
        assert_eq!(
            node_id_of_name("cairn-node-18446744073709551615"),
            Some(u64::MAX)
        );
        for other in [
            "cairn-node-",
            "cairn-node-03",
            "cairn-node-+3",
            "cairn-node-3a",
            "cairn-node-18446744073709551616",
            "cairn-client",
            "xcairn-node-3",
        ] {
            assert_eq!(node_id_of_name(other), None, "{other}");
        }
    }

    #[test]
    fn a_missing_file_names_its_path_and_role() {
        let e = load_certificates("certificate", Path::new("/nonexistent/cert.pem")).unwrap_err();
        let text = e.to_string();
        assert!(text.contains("/nonexistent/cert.pem"), "{text}");
        assert!(text.contains("certificate"), "{text}");
    }

    #[test]
    fn a_file_without_pem_blocks_is_refused_as_empty() {
        let dir = std::env::temp_dir().join(format!("cairn-tls-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("garbage.pem");
        std::fs::write(&path, b"not a certificate\n").unwrap();
        assert!(matches!(
            load_certificates("CA", &path),
            Err(TlsError::Empty { .. })
        ));
        assert!(matches!(
            load_private_key("key", &path),
            Err(TlsError::Empty { .. })
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
