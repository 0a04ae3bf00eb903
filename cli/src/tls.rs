//! `cairn tls init DIR` and `cairn tls client-cert DIR NAME`: development
//! certificates. `init` writes, in DIR:
//!
//! | file | what |
//! | --- | --- |
//! | `ca.pem`, `ca-key.pem` | a CA (kept if both are present: run again to add nodes; one without the other is an error) |
//! | `node-N.pem`, `node-N-key.pem` | node N's certificate, for both ports and as a peer client (N = 1..=--nodes) |
//! | `client.pem`, `client-key.pem` | a client certificate (subject `--client-name`) |
//!
//! `client-cert` issues one more client certificate from DIR's CA, whose
//! subject (common name) is NAME: `client-NAME.pem`, `client-NAME-key.pem`.
//! A grant with `subject = "NAME"` then stands for its holder.
//!
//! Node certificates name `localhost`, `127.0.0.1`, `::1` and every
//! `--host`. Existing certificates are kept unless `--force` (the CA is
//! never replaced: remove both its files to start a new one). Keys are written mode 0600.
//! These certificates are for development and tests; production clusters
//! use certificates from their own PKI, with the same roles.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use clap::{Args, Subcommand};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

use crate::common::exit;

#[derive(Subcommand)]
pub enum TlsCommand {
    /// Write a development CA, one certificate per node and a client certificate into DIR.
    Init(InitArgs),
    /// Issue another client certificate, with common name NAME, from the CA in DIR
    /// (written as DIR/client-NAME.pem and DIR/client-NAME-key.pem).
    ClientCert(ClientCertArgs),
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

#[derive(Args, Clone)]
pub struct ClientCertArgs {
    /// Directory holding the CA (`cairn tls init DIR` wrote it).
    pub dir: PathBuf,
    /// The certificate's subject (common name), as a grant's `subject` names it:
    /// letters, digits, '.', '_' and '-', at most 64.
    pub name: String,
    /// Replace the certificate if it exists.
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
pub fn named_client_cert_file(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("client-{name}.pem"))
}
pub fn named_client_key_file(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("client-{name}-key.pem"))
}
fn ca_key_file(dir: &Path) -> PathBuf {
    dir.join("ca-key.pem")
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

/// The CA of `dir`: `None` when neither of its files is there. A CA
/// certificate without its key (kept away from the nodes, as
/// `docs/security.md` advises) is an error naming the missing file: issuing
/// from a new CA would silently split the cluster's trust.
fn existing_ca(dir: &Path) -> Result<Option<Issuer<'static, KeyPair>>, InitError> {
    let (cert_path, key_path) = (ca_file(dir), ca_key_file(dir));
    match (cert_path.exists(), key_path.exists()) {
        (false, false) => return Ok(None),
        (true, true) => {}
        (true, false) => {
            return Err(InitError::Invalid(format!(
                "{} is there but its key {} is not: certificates can only be issued with \
                 the CA's key. Put the key back (or run this where it is kept); remove {} \
                 only to start a new CA, whose certificates the old cluster will refuse",
                cert_path.display(),
                key_path.display(),
                cert_path.display()
            )))
        }
        (false, true) => {
            return Err(InitError::Invalid(format!(
                "{} is there but the CA certificate {} is not: put it back, or remove the \
                 key to start a new CA",
                key_path.display(),
                cert_path.display()
            )))
        }
    }
    let key_pem = std::fs::read_to_string(&key_path).map_err(io(&key_path))?;
    let cert_pem = std::fs::read_to_string(&cert_path).map_err(io(&cert_path))?;
    Ok(Some(Issuer::from_ca_cert_pem(
        &cert_pem,
        KeyPair::from_pem(&key_pem)?,
    )?))
}

/// A new CA in `dir`.
fn new_ca(dir: &Path) -> Result<Issuer<'static, KeyPair>, InitError> {
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
    write_file(&ca_key_file(dir), &key.serialize_pem(), true)?;
    write_file(&ca_file(dir), &cert.pem(), false)?;
    Ok(Issuer::new(params, key))
}

/// One leaf certificate to issue.
struct Leaf<'a> {
    cert_file: PathBuf,
    key_file: PathBuf,
    common_name: &'a str,
    /// Subject alternative names (host names and IP addresses).
    names: Vec<String>,
    usages: Vec<ExtendedKeyUsagePurpose>,
}

/// Issues `leaf` from `issuer` (its key first, mode 0600), unless both its
/// files exist and `force` is off; records what it did in `written`.
fn issue(
    issuer: &Issuer<'_, KeyPair>,
    leaf: Leaf<'_>,
    force: bool,
    written: &mut Written,
) -> Result<(), InitError> {
    if leaf.cert_file.exists() && leaf.key_file.exists() && !force {
        written.kept.push(leaf.cert_file);
        return Ok(());
    }
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(leaf.names)?;
    params
        .distinguished_name
        .push(DnType::CommonName, leaf.common_name);
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = leaf.usages;
    params.use_authority_key_identifier_extension = true;
    validity(&mut params, 2);
    let cert = params.signed_by(&key, issuer)?;
    write_file(&leaf.key_file, &key.serialize_pem(), true)?;
    write_file(&leaf.cert_file, &cert.pem(), false)?;
    written.written.push(leaf.cert_file);
    Ok(())
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
    std::fs::create_dir_all(&args.dir).map_err(io(&args.dir))?;
    let mut written = Written::default();
    let issuer = match existing_ca(&args.dir)? {
        Some(issuer) => {
            written.kept.push(ca_file(&args.dir));
            issuer
        }
        None => {
            let issuer = new_ca(&args.dir)?;
            written.created_ca = true;
            written.written.push(ca_file(&args.dir));
            issuer
        }
    };
    for id in 1..=u64::from(args.nodes) {
        let common_name = cairn_tls::node_certificate_name(id);
        let leaf = Leaf {
            cert_file: node_cert_file(&args.dir, id),
            key_file: node_key_file(&args.dir, id),
            common_name: &common_name,
            names: names.clone(),
            usages: vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ],
        };
        issue(&issuer, leaf, args.force, &mut written)?;
    }
    let client = Leaf {
        cert_file: client_cert_file(&args.dir),
        key_file: client_key_file(&args.dir),
        common_name: &args.client_name,
        names: Vec::new(),
        usages: vec![ExtendedKeyUsagePurpose::ClientAuth],
    };
    issue(&issuer, client, args.force, &mut written)?;
    Ok(written)
}

/// Whether `name` may be a client certificate's name: it becomes the
/// certificate's subject and part of its file names, so it holds only
/// letters, digits, '.', '_' and '-', and never ends in `-key` (the files
/// of `name` and `name-key` would collide, and so would `key`'s with the
/// default client's).
fn check_client_name(name: &str) -> Result<(), InitError> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
    if name.is_empty() || name.len() > 64 || !name.chars().all(allowed) {
        return Err(InitError::Invalid(format!(
            "client name {name:?}: use 1 to 64 letters, digits, '.', '_' or '-'"
        )));
    }
    if name.starts_with(['.', '-']) || name == "key" || name.ends_with("-key") {
        return Err(InitError::Invalid(format!(
            "client name {name:?} must not start with '.' or '-', be \"key\" or end in \
             \"-key\" (its file names would collide with another certificate's)"
        )));
    }
    Ok(())
}

/// Issues the client certificate `args.name` from the CA in `args.dir`,
/// which must exist. Pure of printing: returns what it did.
pub fn client_cert(args: &ClientCertArgs) -> Result<Written, InitError> {
    check_client_name(&args.name)?;
    let issuer = existing_ca(&args.dir)?.ok_or_else(|| {
        InitError::Invalid(format!(
            "no CA in {} (ca.pem and ca-key.pem): run `cairn tls init {}` first",
            args.dir.display(),
            args.dir.display()
        ))
    })?;
    let mut written = Written::default();
    let leaf = Leaf {
        cert_file: named_client_cert_file(&args.dir, &args.name),
        key_file: named_client_key_file(&args.dir, &args.name),
        common_name: &args.name,
        names: Vec::new(),
        usages: vec![ExtendedKeyUsagePurpose::ClientAuth],
    };
    issue(&issuer, leaf, args.force, &mut written)?;
    Ok(written)
}

fn report_error(command: &str, e: InitError) -> u8 {
    eprintln!("cairn tls {command}: {e}");
    match e {
        InitError::Invalid(_) => exit::USAGE,
        _ => exit::ERROR,
    }
}

pub fn run(command: TlsCommand) -> u8 {
    match command {
        TlsCommand::Init(args) => run_init(&args),
        TlsCommand::ClientCert(args) => run_client_cert(&args),
    }
}

fn run_init(args: &InitArgs) -> u8 {
    let w = match init(args) {
        Ok(w) => w,
        Err(e) => return report_error("init", e),
    };
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

fn run_client_cert(args: &ClientCertArgs) -> u8 {
    let w = match client_cert(args) {
        Ok(w) => w,
        Err(e) => return report_error("client-cert", e),
    };
    let cert = named_client_cert_file(&args.dir, &args.name);
    let key = named_client_key_file(&args.dir, &args.name);
    let ca = ca_file(&args.dir);
    println!(
        "Client certificate {:?} {} {} (key {}).",
        args.name,
        if w.written.is_empty() {
            "kept in"
        } else {
            "written to"
        },
        cert.display(),
        key.display()
    );
    println!("\nIts holder is the caller of a grant with, in every node's config:");
    println!("  subject = {:?}", args.name);
    println!("\nReach the cluster with it:");
    println!(
        "  export CAIRN_CACERT={} CAIRN_CERT={} CAIRN_KEY={}",
        ca.display(),
        cert.display(),
        key.display()
    );
    exit::OK
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_names_that_would_collide_or_escape_the_directory_are_refused() {
        // A name is a subject and part of two file names.
        for good in ["dashboards", "team-a.reader", "ci_bot", "A1"] {
            assert!(check_client_name(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "key",
            "a-key",
            "../x",
            "a/b",
            "-x",
            ".hidden",
            "with space",
            "caf\u{e9}",
        ] {
            assert!(check_client_name(bad).is_err(), "{bad:?}");
        }
        assert!(check_client_name(&"x".repeat(65)).is_err());
    }

    #[test]
    fn a_ca_certificate_without_its_key_is_an_error_not_a_new_ca() {
        // The key kept elsewhere (as security.md advises): `init` must not
        // issue from a new CA the cluster would refuse; it names the file.
        let dir = tempfile::tempdir().unwrap();
        let args = InitArgs {
            dir: dir.path().to_path_buf(),
            nodes: 1,
            hosts: vec![],
            client_name: "cairn-client".into(),
            force: false,
        };
        init(&args).unwrap();
        let ca = std::fs::read(ca_file(dir.path())).unwrap();
        std::fs::remove_file(ca_key_file(dir.path())).unwrap();
        std::fs::remove_file(node_cert_file(dir.path(), 1)).unwrap();
        let Err(InitError::Invalid(why)) = init(&args) else {
            panic!("a CA without its key must be refused");
        };
        assert!(why.contains("ca-key.pem"), "{why}");
        assert_eq!(std::fs::read(ca_file(dir.path())).unwrap(), ca);
        assert!(!ca_key_file(dir.path()).exists());
        assert!(!node_cert_file(dir.path(), 1).exists(), "nothing issued");
        let named = ClientCertArgs {
            dir: dir.path().to_path_buf(),
            name: "dashboards".into(),
            force: false,
        };
        assert!(matches!(client_cert(&named), Err(InitError::Invalid(_))));
        // The key without its certificate: refused the same way.
        std::fs::remove_file(ca_file(dir.path())).unwrap();
        std::fs::write(ca_key_file(dir.path()), b"key").unwrap();
        let Err(InitError::Invalid(why)) = init(&args) else {
            panic!("a CA key without its certificate must be refused");
        };
        assert!(why.contains("ca.pem"), "{why}");
    }

    #[test]
    fn a_client_certificate_needs_the_ca_and_names_its_subject() {
        // Without a CA: refused, nothing written. With one: the subject is
        // the name, and the certificate is kept unless forced.
        let dir = tempfile::tempdir().unwrap();
        let args = ClientCertArgs {
            dir: dir.path().to_path_buf(),
            name: "dashboards".into(),
            force: false,
        };
        assert!(matches!(client_cert(&args), Err(InitError::Invalid(_))));
        assert!(!named_client_cert_file(dir.path(), "dashboards").exists());
        init(&InitArgs {
            dir: dir.path().to_path_buf(),
            nodes: 1,
            hosts: vec![],
            client_name: "cairn-client".into(),
            force: false,
        })
        .unwrap();
        let first = client_cert(&args).unwrap();
        assert_eq!(first.written.len(), 1);
        let cert_file = named_client_cert_file(dir.path(), "dashboards");
        let der = cairn_tls::load_certificates("test", &cert_file).unwrap();
        assert_eq!(
            cairn_tls::certificate_subject(&der[0]).as_deref(),
            Some("dashboards")
        );
        let before = std::fs::read(&cert_file).unwrap();
        assert_eq!(client_cert(&args).unwrap().kept.len(), 1);
        assert_eq!(std::fs::read(&cert_file).unwrap(), before);
        let forced = ClientCertArgs {
            force: true,
            ..args
        };
        assert_eq!(client_cert(&forced).unwrap().written.len(), 1);
        assert_ne!(std::fs::read(&cert_file).unwrap(), before);
    }
}
