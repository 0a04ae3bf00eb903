//! `cairn tls init DIR`: development certificates. Writes, in DIR:
//!
//! | file | what |
//! | --- | --- |
//! | `ca.pem`, `ca-key.pem` | a CA (kept if present: run again to add nodes) |
//! | `node-N.pem`, `node-N-key.pem` | node N's certificate, for both ports and as a peer client (N = 1..=--nodes) |
//! | `client.pem`, `client-key.pem` | a client certificate (subject `--client-name`) |
//!
//! Node certificates name `localhost`, `127.0.0.1`, `::1` and every
//! `--host`. Existing certificates are kept unless `--force` (the CA is
//! never replaced: remove it to start a new one). Keys are written mode 0600.
//! These certificates are for development and tests; production clusters
//! use certificates from their own PKI, with the same roles.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use clap::{Args, Subcommand};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

use crate::cli::exit;

#[derive(Subcommand)]
pub enum TlsCommand {
    /// Write a development CA, one certificate per node and a client certificate into DIR.
    Init(InitArgs),
}

#[derive(Args, Clone)]
pub struct InitArgs {
    /// Directory to write the files into (created if missing).
    pub dir: PathBuf,
    /// Number of node certificates (node-1 .. node-N).
    #[arg(long, default_value_t = 3)]
    pub nodes: u32,
    /// Another host name or IP address the nodes' certificates must name (repeatable).
    #[arg(long = "host")]
    pub hosts: Vec<String>,
    /// Subject (common name) of the client certificate.
    #[arg(long, default_value = "cairn-client")]
    pub client_name: String,
    /// Replace existing node and client certificates (never the CA).
    #[arg(long)]
    pub force: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum InitError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("certificate generation: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("{0}")]
    Invalid(String),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> InitError + '_ {
    move |source| InitError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// What `init` wrote or kept, for the summary.
#[derive(Debug, Default)]
pub struct Written {
    pub created_ca: bool,
    pub written: Vec<PathBuf>,
    pub kept: Vec<PathBuf>,
}

/// Paths of the files of `init`.
pub fn ca_file(dir: &Path) -> PathBuf {
    dir.join("ca.pem")
}
pub fn node_cert_file(dir: &Path, id: u64) -> PathBuf {
    dir.join(format!("node-{id}.pem"))
}
pub fn node_key_file(dir: &Path, id: u64) -> PathBuf {
    dir.join(format!("node-{id}-key.pem"))
}
pub fn client_cert_file(dir: &Path) -> PathBuf {
    dir.join("client.pem")
}
pub fn client_key_file(dir: &Path) -> PathBuf {
    dir.join("client-key.pem")
}

fn this_year() -> i32 {
    let seconds = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    1970 + (seconds / 31_556_952) as i32
}

fn validity(params: &mut CertificateParams, years: i32) {
    let year = this_year();
    params.not_before = rcgen::date_time_ymd(year - 1, 1, 1);
    params.not_after = rcgen::date_time_ymd(year + years, 1, 1);
}

fn write_file(path: &Path, contents: &str, private: bool) -> Result<(), InitError> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    if private {
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    }
    let mut file = options.open(path).map_err(io(path))?;
    file.write_all(contents.as_bytes()).map_err(io(path))?;
    file.sync_all().map_err(io(path))
}

/// Writes the files (see the module docs). Pure of printing: returns what it did.
pub fn init(args: &InitArgs) -> Result<Written, InitError> {
    if args.nodes == 0 || args.nodes > 100 {
        return Err(InitError::Invalid(
            "--nodes must be between 1 and 100".into(),
        ));
    }
    if args.client_name.trim().is_empty() {
        return Err(InitError::Invalid("--client-name is empty".into()));
    }
    std::fs::create_dir_all(&args.dir).map_err(io(&args.dir))?;
    let mut written = Written::default();
    let ca_cert_path = ca_file(&args.dir);
    let ca_key_path = args.dir.join("ca-key.pem");
    let issuer = if ca_cert_path.exists() && ca_key_path.exists() {
        let key_pem = std::fs::read_to_string(&ca_key_path).map_err(io(&ca_key_path))?;
        let cert_pem = std::fs::read_to_string(&ca_cert_path).map_err(io(&ca_cert_path))?;
        written.kept.push(ca_cert_path.clone());
        Issuer::from_ca_cert_pem(&cert_pem, KeyPair::from_pem(&key_pem)?)?
    } else {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(Vec::new())?;
        params
            .distinguished_name
            .push(DnType::CommonName, "Cairn development CA");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        validity(&mut params, 10);
        let cert = params.self_signed(&key)?;
        write_file(&ca_key_path, &key.serialize_pem(), true)?;
        write_file(&ca_cert_path, &cert.pem(), false)?;
        written.created_ca = true;
        written.written.push(ca_cert_path.clone());
        Issuer::new(params, key)
    };

    let mut names = vec![
        "localhost".to_string(),
        "127.0.0.1".to_string(),
        "::1".to_string(),
    ];
    for host in &args.hosts {
        if host.trim().is_empty() {
            return Err(InitError::Invalid("--host is empty".into()));
        }
        names.push(host.trim().to_string());
    }
    let mut leaf = |cert_path: PathBuf,
                    key_path: PathBuf,
                    common_name: &str,
                    sans: Vec<String>,
                    usages: Vec<ExtendedKeyUsagePurpose>|
     -> Result<(), InitError> {
        if cert_path.exists() && key_path.exists() && !args.force {
            written.kept.push(cert_path);
            return Ok(());
        }
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(sans)?;
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = usages;
        params.use_authority_key_identifier_extension = true;
        validity(&mut params, 2);
        let cert = params.signed_by(&key, &issuer)?;
        write_file(&key_path, &key.serialize_pem(), true)?;
        write_file(&cert_path, &cert.pem(), false)?;
        written.written.push(cert_path);
        Ok(())
    };
    for id in 1..=u64::from(args.nodes) {
        leaf(
            node_cert_file(&args.dir, id),
            node_key_file(&args.dir, id),
            &format!("cairn-node-{id}"),
            names.clone(),
            vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ],
        )?;
    }
    leaf(
        client_cert_file(&args.dir),
        client_key_file(&args.dir),
        &args.client_name,
        Vec::new(),
        vec![ExtendedKeyUsagePurpose::ClientAuth],
    )?;
    Ok(written)
}

pub fn run(command: TlsCommand) -> u8 {
    let TlsCommand::Init(args) = command;
    match init(&args) {
        Ok(w) => {
            let dir = args.dir.display();
            println!(
                "{} in {dir}: {} file(s) written, {} kept.",
                if w.created_ca {
                    "New development CA"
                } else {
                    "Existing CA"
                },
                w.written.len(),
                w.kept.len()
            );
            println!("\nStart node N with:");
            println!(
                "  cairn agent ... --tls-cert-file {dir}/node-N.pem --tls-key-file {dir}/node-N-key.pem --tls-ca-file {dir}/ca.pem"
            );
            println!("\nThen reach the cluster with:");
            println!(
                "  export CAIRN_CACERT={dir}/ca.pem CAIRN_CERT={dir}/client.pem CAIRN_KEY={dir}/client-key.pem"
            );
            println!("  cairn status --endpoints https://127.0.0.1:7001");
            exit::OK
        }
        Err(e @ InitError::Invalid(_)) => {
            eprintln!("cairn tls init: {e}");
            exit::USAGE
        }
        Err(e) => {
            eprintln!("cairn tls init: {e}");
            exit::ERROR
        }
    }
}
