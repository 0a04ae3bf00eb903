//! The `cairn` data commands: `read`, `write`, `delete`, `list`, `owned-by`
//! and `watch`. The `cairn` binary flattens [`DataCommand`] into its own
//! subcommands and calls [`run`].
//!
//! ## Syntax
//!
//! - `--type GROUP.GROUP_VERSION.KIND`, e.g. `catalog.v2.Service`: the last
//!   dot-separated segment is the kind, the one before it the group version,
//!   the rest the group (which may itself contain dots). `list` and `watch`
//!   ignore the group version and also accept `GROUP.KIND`.
//! - `--tenancy PARTITION/NAMESPACE` (default `default/default`); `list` and
//!   `watch` accept `*` for either part (`'*/*'` = every tenancy).
//! - `--endpoints host:port,...` (or `CAIRN_ENDPOINTS`), default the three
//!   nodes of `cairn dev`.
//! - `--token TOKEN` (or `CAIRN_TOKEN`): the bearer token of a cluster that
//!   requires one (see `docs/security.md`).
//! - `--consistency strong|eventual` (default strong) applies to `read`,
//!   `list`, and to the reads that `write` and `owned-by` make to fill in a
//!   uid, and to `watch`'s snapshot (strong: it holds every write acknowledged
//!   before the watch was opened); `delete` and `write --upsert` always read
//!   strongly (their CAS needs the latest version), `owned-by` is served by
//!   one node's local state.
//! - `-o table|json` (default table). JSON is the form of [`super::json`]:
//!   `cairn read -o json ... | cairn write --file -` writes back what was read.
//!
//! `cairn write` takes either `--file PATH` (`-` = stdin) holding a resource
//! in JSON, or flags: `--type --name [--uid] [--data-json JSON |
//! --data-base64 B64] [--data-type-url URL] [--metadata K=V]...
//! [--owner TYPE/NAME/UID]`. With no `--version` it creates (a ULID uid is
//! generated when none is given) and fails with exit code 4 if something is
//! stored; `--version V` replaces version V (compare-and-set); `--upsert`
//! creates or replaces whatever is stored. The default data type URL is
//! `type.googleapis.com/GROUP.GROUP_VERSION.KIND`.
//!
//! `cairn delete` without `--version` deletes whatever is current (or only
//! the lifetime `--uid`); with `--version` (and `--uid`, or the stored uid
//! read first) it deletes only that version. Deleting nothing is success.
//!
//! `cairn list` asks for the listing one page at a time (`--page-size N`, 0
//! = the node's `list_page_size_max`) and prints each page as it comes, so
//! its memory stays bounded however large the type; every page reflects the
//! first page's revision, which the JSON form prints last.
//!
//! `cairn watch` prints one line per event (a table line, or a JSON object
//! per line with `-o json`) until Ctrl-C or `--max-events`. When the stream
//! breaks it re-opens the watch from the last revision it printed, so the
//! output goes on without gaps or repeats; if the node no longer has that
//! history it exits with code 1.
//!
//! ## Exit codes
//!
//! By the one table of [`super::common`]: 0 ok, 1 other error, 2 usage or
//! invalid argument, 3 not found, 4 CAS conflict, 5 unavailable, 6 not
//! authorized.

use std::collections::BTreeMap;
use std::io::{Read as _, Write};
use std::time::Duration;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use bytes::Bytes;
use cairn_client::{Client, ClientError, ClientOptions, Outcome};
use cairn_proto::google::protobuf::Any;
use cairn_proto::v1::{
    watch_event, Consistency, DeleteRequest, DeleteResponse, Id, ListRequest, Resource, Status,
    Tenancy, Type, WatchEvent, WatchListRequest, WriteStatusRequest,
};
use clap::{Args, Subcommand, ValueEnum};
use serde_json::{json, Value};

use super::common::{exit, exit_code, GlobalArgs, OutputFormat};
use super::json::{json_payload, payload_as_json, resource_from_json, resource_to_json};

/// The data commands of `cairn`.
#[derive(Subcommand, Debug, Clone)]
pub enum DataCommand {
    /// Read one resource.
    Read(ReadArgs),
    /// Create or replace a resource (create by default; --version for CAS; --upsert).
    Write(WriteArgs),
    /// Delete a resource (whatever is current, or exactly --version).
    Delete(DeleteArgs),
    /// Write one controller's entry of a resource's status (--status-key), checked against its
    /// uid and, only with --version, its version: it never conflicts with a data write.
    WriteStatus(WriteStatusArgs),
    /// List the resources of a type.
    List(ListArgs),
    /// List the resources owned by one resource.
    OwnedBy(OwnedByArgs),
    /// Print the events of a type as they happen, until Ctrl-C.
    Watch(WatchArgs),
}

/// Options every data command takes. The cluster, output and timeout flags
/// are the same (same names, same types) as [`GlobalArgs`]'s, so that the
/// `cairn` binary's global flags reach the data commands too.
#[derive(Args, Debug, Clone)]
pub struct CommonArgs {
    #[command(flatten)]
    pub global: GlobalArgs,
    /// Consistency of the reads the command makes.
    #[arg(long, value_enum, default_value = "strong")]
    pub consistency: ConsistencyArg,
    /// PARTITION/NAMESPACE (list and watch accept `*` parts).
    #[arg(long, default_value = "default/default", value_parser = parse_tenancy)]
    pub tenancy: Tenancy,
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConsistencyArg {
    Strong,
    Eventual,
}

impl From<ConsistencyArg> for Consistency {
    fn from(c: ConsistencyArg) -> Consistency {
        match c {
            ConsistencyArg::Strong => Consistency::Strong,
            ConsistencyArg::Eventual => Consistency::Eventual,
        }
    }
}

#[derive(Args, Debug, Clone)]
pub struct ReadArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// GROUP.GROUP_VERSION.KIND
    #[arg(long = "type", value_parser = parse_type)]
    pub type_: Type,
    #[arg(long)]
    pub name: String,
    /// Read only this lifetime (default: whatever is current).
    #[arg(long, default_value = "")]
    pub uid: String,
}

#[derive(Args, Debug, Clone)]
pub struct WriteArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// A resource in JSON (`-` = stdin); instead of the resource flags.
    #[arg(short = 'f', long, conflicts_with_all = ["type_", "name", "uid", "data_json", "data_base64", "data_type_url", "metadata", "owner"])]
    pub file: Option<String>,
    /// GROUP.GROUP_VERSION.KIND
    #[arg(long = "type", value_parser = parse_type, required_unless_present = "file")]
    pub type_: Option<Type>,
    #[arg(long, required_unless_present = "file")]
    pub name: Option<String>,
    /// The resource's uid (default: generated on create, kept on replace).
    #[arg(long)]
    pub uid: Option<String>,
    /// The data as JSON text, stored as compact JSON.
    #[arg(long, conflicts_with = "data_base64")]
    pub data_json: Option<String>,
    /// The data as base64 bytes (for protobuf payloads).
    #[arg(long)]
    pub data_base64: Option<String>,
    /// The data's type URL (default type.googleapis.com/GROUP.GROUP_VERSION.KIND).
    #[arg(long)]
    pub data_type_url: Option<String>,
    /// KEY=VALUE metadata (repeatable).
    #[arg(long, value_parser = parse_key_value)]
    pub metadata: Vec<(String, String)>,
    /// The owner as GROUP.GROUP_VERSION.KIND/NAME/UID, in the same tenancy.
    #[arg(long)]
    pub owner: Option<String>,
    /// Replace only this stored version (compare-and-set).
    #[arg(long, conflicts_with = "upsert")]
    pub version: Option<String>,
    /// Create, or replace whatever is stored.
    #[arg(long)]
    pub upsert: bool,
    /// Attach the resource to this lease (`cairn lease grant`): it is deleted when the
    /// lease expires or is revoked. A write without it detaches the resource.
    #[arg(long)]
    pub lease: Option<u64>,
}

#[derive(Args, Debug, Clone)]
pub struct DeleteArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// GROUP.GROUP_VERSION.KIND
    #[arg(long = "type", value_parser = parse_type)]
    pub type_: Type,
    #[arg(long)]
    pub name: String,
    /// Delete only this lifetime.
    #[arg(long, default_value = "")]
    pub uid: String,
    /// Delete only this version (compare-and-set).
    #[arg(long)]
    pub version: Option<String>,
    /// Keep what the resource owns: their owner reference is cleared instead of their
    /// being deleted with it (cluster version 0.2).
    #[arg(long)]
    pub orphan: bool,
}

#[derive(Args, Debug, Clone)]
pub struct WriteStatusArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// GROUP.GROUP_VERSION.KIND
    #[arg(long = "type", value_parser = parse_type)]
    pub type_: Type,
    #[arg(long)]
    pub name: String,
    /// The lifetime the status is about (default: whatever is current).
    #[arg(long, default_value = "")]
    pub uid: String,
    /// The status entry to replace: one per controller (the API's `key`; `--key` is the
    /// TLS client key).
    #[arg(long)]
    pub status_key: String,
    /// The status as JSON (`{"observed_generation": "..", "conditions": [..],
    /// "updated_at": ".."}`), or `-` to read it from stdin.
    #[arg(long)]
    pub status: String,
    /// Write only if this version is stored (compare-and-set; default: any version).
    #[arg(long)]
    pub version: Option<String>,
}

#[derive(Args, Debug, Clone)]
pub struct ListArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// GROUP.KIND or GROUP.GROUP_VERSION.KIND (the version is ignored).
    #[arg(long = "type", value_parser = parse_list_type)]
    pub type_: Type,
    /// Only names starting with this.
    #[arg(long, default_value = "")]
    pub prefix: String,
    /// Only resources whose metadata matches this selector (Kubernetes' label-selector
    /// syntax: `app=web,tier!=db,env in (prod,staging),!canary`).
    #[arg(short = 'l', long, default_value = "")]
    pub selector: String,
    /// Resources asked for per page (0 = the node's list_page_size_max;
    /// more is capped to it). The listing is printed page by page.
    #[arg(long, default_value_t = 0)]
    pub page_size: u32,
}

#[derive(Args, Debug, Clone)]
pub struct OwnedByArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// The owner's GROUP.GROUP_VERSION.KIND.
    #[arg(long = "type", value_parser = parse_type)]
    pub type_: Type,
    /// The owner's name.
    #[arg(long)]
    pub name: String,
    /// The owner's uid (default: the current lifetime's, read first).
    #[arg(long)]
    pub uid: Option<String>,
}

#[derive(Args, Debug, Clone)]
pub struct WatchArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// GROUP.KIND or GROUP.GROUP_VERSION.KIND (the version is ignored).
    #[arg(long = "type", value_parser = parse_list_type)]
    pub type_: Type,
    /// Only names starting with this.
    #[arg(long, default_value = "")]
    pub prefix: String,
    /// Only resources whose metadata matches this selector (as `cairn list -l`): one
    /// that stops matching is printed as a delete, one that starts as an upsert.
    #[arg(short = 'l', long, default_value = "")]
    pub selector: String,
    /// Replay the changes after this revision instead of starting with a snapshot.
    #[arg(long, default_value_t = 0)]
    pub from_revision: u64,
    /// Stop after this many events (EndOfSnapshot included); 0 = until Ctrl-C.
    #[arg(long, default_value_t = 0)]
    pub max_events: u64,
}

// ------------------------------------------------------------- parsing ----

/// `GROUP.GROUP_VERSION.KIND`: kind last, version before it, group the rest.
pub fn parse_type(s: &str) -> Result<Type, String> {
    let (rest, kind) = s
        .rsplit_once('.')
        .ok_or_else(|| format!("{s:?} is not GROUP.GROUP_VERSION.KIND"))?;
    let (group, group_version) = rest
        .rsplit_once('.')
        .ok_or_else(|| format!("{s:?} is not GROUP.GROUP_VERSION.KIND"))?;
    if group.is_empty() || group_version.is_empty() || kind.is_empty() {
        return Err(format!(
            "{s:?}: group, group version and kind must not be empty"
        ));
    }
    Ok(Type {
        group: group.into(),
        group_version: group_version.into(),
        kind: kind.into(),
    })
}

/// `GROUP.KIND` or `GROUP.GROUP_VERSION.KIND`.
pub fn parse_list_type(s: &str) -> Result<Type, String> {
    if s.matches('.').count() == 1 {
        let (group, kind) = s.split_once('.').unwrap_or_default();
        if group.is_empty() || kind.is_empty() {
            return Err(format!("{s:?}: group and kind must not be empty"));
        }
        return Ok(Type {
            group: group.into(),
            group_version: String::new(),
            kind: kind.into(),
        });
    }
    parse_type(s)
}

/// `PARTITION/NAMESPACE`; either part may be empty or `*`.
pub fn parse_tenancy(s: &str) -> Result<Tenancy, String> {
    let (partition, namespace) = s
        .split_once('/')
        .ok_or_else(|| format!("{s:?} is not PARTITION/NAMESPACE"))?;
    if namespace.contains('/') {
        return Err(format!("{s:?} is not PARTITION/NAMESPACE (one '/')"));
    }
    Ok(Tenancy {
        partition: partition.into(),
        namespace: namespace.into(),
    })
}

fn parse_key_value(s: &str) -> Result<(String, String), String> {
    let (k, v) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?} is not KEY=VALUE"))?;
    if k.is_empty() {
        return Err(format!("{s:?}: the key is empty"));
    }
    Ok((k.into(), v.into()))
}

/// `GROUP.GROUP_VERSION.KIND/NAME/UID` (the name may contain '/').
fn parse_owner(s: &str, tenancy: &Tenancy) -> Result<Id, ClientError> {
    let bad = || {
        ClientError::invalid(
            "owner",
            format!("{s:?} is not GROUP.GROUP_VERSION.KIND/NAME/UID"),
        )
    };
    let (type_text, rest) = s.split_once('/').ok_or_else(bad)?;
    let (name, uid) = rest.rsplit_once('/').ok_or_else(bad)?;
    let type_ = parse_type(type_text).map_err(|reason| ClientError::invalid("owner", reason))?;
    if name.is_empty() {
        return Err(bad());
    }
    Ok(Id {
        uid: uid.into(),
        name: name.into(),
        r#type: Some(type_),
        tenancy: Some(tenancy.clone()),
    })
}

// ------------------------------------------------------------- running ----

/// Runs a data command, printing to stdout and stderr; returns the exit code.
pub async fn run(command: DataCommand) -> u8 {
    let mut out = std::io::stdout();
    let mut err = std::io::stderr();
    run_with(command, &mut out, &mut err).await
}

/// As [`run`], writing to the given streams (for tests and embedding).
pub async fn run_with(
    command: DataCommand,
    out: &mut (dyn Write + Send),
    err: &mut (dyn Write + Send),
) -> u8 {
    match execute(command, out).await {
        Ok(code) => code,
        Err(e) => {
            let note = match e.outcome() {
                Outcome::Unknown => " (the change may or may not have been applied)",
                Outcome::NotApplied => "",
            };
            // Nothing more useful to do if stderr is gone.
            let _ = writeln!(err, "error: {e}{note}");
            exit_code(&e)
        }
    }
}

/// The client of a command that reads or writes resources: the cluster's
/// endpoints, token and TLS, each call bounded by `--timeout-ms`.
pub fn client_of(global: &GlobalArgs) -> Result<Client, ClientError> {
    client_at(&global.cluster, &global.cluster.endpoints, global.timeout())
}

/// A client of `endpoints` (some or all of `cluster`'s) reached as `cluster`
/// says (token, TLS), each call bounded by `timeout`.
pub fn client_at(
    cluster: &crate::common::ClusterArgs,
    endpoints: &[String],
    timeout: Duration,
) -> Result<Client, ClientError> {
    let options = ClientOptions {
        request_timeout: timeout,
        connect_timeout: timeout.min(Duration::from_secs(1)),
        token: cluster.bearer_token()?,
        tls: cluster.tls.options(&cluster.endpoints),
        ..ClientOptions::default()
    };
    Client::new(endpoints, options)
}

fn common(command: &DataCommand) -> &CommonArgs {
    match command {
        DataCommand::Read(a) => &a.common,
        DataCommand::Write(a) => &a.common,
        DataCommand::Delete(a) => &a.common,
        DataCommand::WriteStatus(a) => &a.common,
        DataCommand::List(a) => &a.common,
        DataCommand::OwnedBy(a) => &a.common,
        DataCommand::Watch(a) => &a.common,
    }
}

async fn execute(command: DataCommand, out: &mut (dyn Write + Send)) -> Result<u8, ClientError> {
    let c = common(&command).clone();
    let client = client_of(&c.global)?;
    match command {
        DataCommand::Read(a) => {
            let id = Id {
                uid: a.uid,
                name: a.name,
                r#type: Some(a.type_),
                tenancy: Some(c.tenancy),
            };
            let r = client.read(id, c.consistency.into()).await?;
            print_resources(out, c.global.output, &[r], None)?;
        }
        DataCommand::Write(a) => {
            let stored = write(&client, &c, a).await?;
            print_resources(out, c.global.output, &[stored], None)?;
        }
        DataCommand::Delete(a) => {
            let id = Id {
                uid: a.uid,
                name: a.name,
                r#type: Some(a.type_),
                tenancy: Some(c.tenancy),
            };
            let deleted = match a.version {
                Some(version) => {
                    let exact = with_stored_uid(&client, id, c.consistency.into()).await?;
                    let request = DeleteRequest {
                        id: Some(exact.clone()),
                        version: version.clone(),
                        fence: None,
                        orphan_dependents: a.orphan,
                    };
                    let answer = client.delete_request(request).await?;
                    let resource = Resource {
                        id: Some(exact),
                        version,
                        ..Default::default()
                    };
                    Some((resource, answer))
                }
                None => client.delete_current_request(id, a.orphan).await?,
            };
            print_deleted(out, c.global.output, deleted.as_ref())?;
        }
        DataCommand::WriteStatus(a) => {
            let status = status_of(&a.status)?;
            let id = Id {
                uid: a.uid,
                name: a.name,
                r#type: Some(a.type_),
                tenancy: Some(c.tenancy.clone()),
            };
            let id = with_stored_uid(&client, id, c.consistency.into()).await?;
            let request = WriteStatusRequest {
                id: Some(id),
                key: a.status_key,
                status: Some(status),
                version: a.version.unwrap_or_default(),
                fence: None,
            };
            let stored = client.write_status(request).await?;
            print_resources(out, c.global.output, &[stored], None)?;
        }
        DataCommand::List(a) => {
            let request = ListRequest {
                r#type: Some(a.type_),
                tenancy: Some(c.tenancy),
                name_prefix: a.prefix,
                consistency: Consistency::from(c.consistency) as i32,
                limit: a.page_size,
                selector: a.selector,
                ..ListRequest::default()
            };
            // One page at a time: printed, then dropped.
            let mut pages = client.list_pages(request);
            let mut printer = ListingPrinter::new(c.global.output);
            while let Some(page) = pages.next().await {
                printer.page(out, &page?.resources).map_err(output_error)?;
            }
            let revision = pages.revision().ok_or_else(|| ClientError::Internal {
                message: "a listing ended without a page".into(),
                outcome: Outcome::NotApplied,
            })?;
            printer.finish(out, revision).map_err(output_error)?;
        }
        DataCommand::OwnedBy(a) => {
            let owner = Id {
                uid: a.uid.unwrap_or_default(),
                name: a.name,
                r#type: Some(a.type_),
                tenancy: Some(c.tenancy),
            };
            let owner = if owner.uid.is_empty() {
                with_stored_uid(&client, owner, c.consistency.into()).await?
            } else {
                owner
            };
            let listed = client.list_by_owner(owner).await?;
            print_resources(
                out,
                c.global.output,
                &listed.resources,
                Some(listed.revision),
            )?;
        }
        DataCommand::Watch(a) => return watch(&client, &c, a, out).await,
    }
    Ok(exit::OK)
}

/// The id with the uid of the stored lifetime, when it has none.
async fn with_stored_uid(
    client: &Client,
    id: Id,
    consistency: Consistency,
) -> Result<Id, ClientError> {
    if !id.uid.is_empty() {
        return Ok(id);
    }
    let stored = match client.read(id.clone(), consistency).await {
        Ok(r) => r,
        Err(ClientError::GroupVersionMismatch { stored, .. }) => *stored,
        Err(e) => return Err(e),
    };
    Ok(Id {
        uid: stored.id.map(|i| i.uid).unwrap_or_default(),
        ..id
    })
}

/// The text of the file `path` (`-`: stdin); an error names the flag `field`.
fn text_of(field: &str, path: &str) -> Result<String, ClientError> {
    if path == "-" {
        let mut s = String::new();
        std::io::stdin()
            .read_to_string(&mut s)
            .map_err(|e| ClientError::invalid(field, format!("cannot read stdin: {e}")))?;
        Ok(s)
    } else {
        std::fs::read_to_string(path)
            .map_err(|e| ClientError::invalid(field, format!("cannot read {path}: {e}")))
    }
}

/// The status `cairn write-status --status` gives: JSON text, or `-` for stdin.
fn status_of(arg: &str) -> Result<Status, ClientError> {
    let text = if arg == "-" {
        text_of("status", arg)?
    } else {
        arg.to_string()
    };
    let value: Value = serde_json::from_str(&text)
        .map_err(|e| ClientError::invalid("status", format!("not JSON: {e}")))?;
    Ok(crate::json::status_from_json(&value, "status")?)
}

/// The resource `cairn write` was asked to store.
fn resource_of(c: &CommonArgs, a: &WriteArgs) -> Result<Resource, ClientError> {
    if let Some(path) = &a.file {
        let text = text_of("file", path)?;
        let value: Value = serde_json::from_str(&text)
            .map_err(|e| ClientError::invalid("file", format!("not JSON: {e}")))?;
        let mut r = resource_from_json(&value)?;
        if let Some(id) = r.id.as_mut() {
            if id.tenancy.is_none() {
                id.tenancy = Some(c.tenancy.clone());
            }
        }
        return Ok(r);
    }
    let (Some(type_), Some(name)) = (a.type_.clone(), a.name.clone()) else {
        return Err(ClientError::invalid(
            "type",
            "--type and --name are required without --file",
        ));
    };
    let type_url = a.data_type_url.clone().unwrap_or_else(|| {
        format!(
            "type.googleapis.com/{}.{}.{}",
            type_.group, type_.group_version, type_.kind
        )
    });
    let data =
        match (&a.data_json, &a.data_base64) {
            (Some(text), _) => {
                let v: Value = serde_json::from_str(text)
                    .map_err(|e| ClientError::invalid("data-json", format!("not JSON: {e}")))?;
                Some(Any {
                    type_url,
                    value: Bytes::from(json_payload(&v)),
                })
            }
            (None, Some(b64)) => Some(Any {
                type_url,
                value: Bytes::from(BASE64.decode(b64.as_bytes()).map_err(|e| {
                    ClientError::invalid("data-base64", format!("not base64: {e}"))
                })?),
            }),
            (None, None) => a.data_type_url.clone().map(|type_url| Any {
                type_url,
                value: Bytes::new(),
            }),
        };
    let owner = a
        .owner
        .as_deref()
        .map(|o| parse_owner(o, &c.tenancy))
        .transpose()?;
    Ok(Resource {
        id: Some(Id {
            uid: a.uid.clone().unwrap_or_default(),
            name,
            r#type: Some(type_),
            tenancy: Some(c.tenancy.clone()),
        }),
        owner: owner.map(Box::new),
        version: String::new(),
        generation: String::new(),
        metadata: a.metadata.iter().cloned().collect::<BTreeMap<_, _>>(),
        status: BTreeMap::new(),
        data,
        lease: 0,
    })
}

async fn write(client: &Client, c: &CommonArgs, a: WriteArgs) -> Result<Resource, ClientError> {
    let mut resource = resource_of(c, &a)?;
    if let Some(lease) = a.lease {
        if lease == 0 {
            return Err(ClientError::invalid("lease", "0 is not a lease id"));
        }
        resource.lease = lease;
    }
    if let Some(version) = &a.version {
        resource.version = version.clone();
    }
    if a.upsert {
        return upsert(client, resource).await;
    }
    if resource.version.is_empty() {
        let name = resource
            .id
            .as_ref()
            .map(|i| i.name.clone())
            .unwrap_or_default();
        return match client.create(resource).await {
            // With an empty expected version the store answers WrongUid (a
            // new uid met the stored one) or CasFailure: either way, taken.
            Err(e) if e.is_cas_conflict() => Err(ClientError::CasFailure(format!(
                "{name:?} already exists ({e}); use --upsert, or --version to replace a known version"
            ))),
            other => other,
        };
    }
    // A CAS replace: the version pins the state, so taking the stored uid
    // when none is given cannot replace anything but that version.
    let id = resource.id.clone().unwrap_or_default();
    resource.id = Some(with_stored_uid(client, id, c.consistency.into()).await?);
    client.write(resource).await
}

/// Creates the resource, or replaces whatever lifetime and version is
/// stored (keeping its uid unless one is given), retrying CAS conflicts.
/// Creates `resource`, or replaces whatever lifetime of it is stored (compare-and-set,
/// retried on a conflict): `cairn write --upsert`, and `cairn quota set`.
pub(crate) async fn upsert(client: &Client, resource: Resource) -> Result<Resource, ClientError> {
    let id = resource.id.clone().unwrap_or_default();
    let any_lifetime = Id {
        uid: String::new(),
        ..id.clone()
    };
    for _ in 0..client.options().cas_attempts_max {
        let current = match client.read(any_lifetime.clone(), Consistency::Strong).await {
            Ok(r) => Some(r),
            Err(ClientError::GroupVersionMismatch { stored, .. }) => Some(*stored),
            Err(ClientError::NotFound) => None,
            Err(e) => return Err(e),
        };
        let mut next = resource.clone();
        let result = match current {
            None => {
                next.version = String::new();
                client.create(next).await
            }
            Some(current) => {
                next.version = current.version.clone();
                if id.uid.is_empty() {
                    let stored_uid = current.id.map(|i| i.uid).unwrap_or_default();
                    if let Some(next_id) = next.id.as_mut() {
                        next_id.uid = stored_uid;
                    }
                }
                client.write(next).await
            }
        };
        match result {
            Err(e) if e.is_cas_conflict() && id.uid.is_empty() => continue,
            Err(ClientError::CasFailure(_)) => continue,
            other => return other,
        }
    }
    Err(ClientError::CasFailure(format!(
        "upsert: still conflicting after {} attempts",
        client.options().cas_attempts_max
    )))
}

// ------------------------------------------------------------- watching ----

async fn watch(
    client: &Client,
    c: &CommonArgs,
    a: WatchArgs,
    out: &mut (dyn Write + Send),
) -> Result<u8, ClientError> {
    let mut request = WatchListRequest {
        r#type: Some(a.type_.clone()),
        tenancy: Some(c.tenancy.clone()),
        name_prefix: a.prefix.clone(),
        start_revision: a.from_revision,
        consistency: Consistency::from(c.consistency) as i32,
        selector: a.selector.clone(),
    };
    // The revision from which a re-opened watch continues without gap: the
    // last one whose changes were all printed. Known once the snapshot ended
    // (or from the start when replaying from a revision). Several changes can
    // share a revision (writes batched into one entry) and a stream can break
    // between them, so the last revision seen is complete only once a later
    // one (or a progress event) arrives; after a resume, the changes of that
    // revision that were already printed are skipped by key.
    let mut resume_from = (a.from_revision > 0).then_some(a.from_revision);
    let mut open_revision: Option<(u64, std::collections::BTreeSet<cairn_client::ResourceKey>)> =
        None;
    let mut printed: u64 = 0;
    if c.global.output == OutputFormat::Table
        && writeln!(
            out,
            "{:<16} {:>9}  {:<28} {:<24} {:<20} {:>9}  DATA",
            "EVENT", "REVISION", "TYPE", "NAME", "TENANCY", "VERSION"
        )
        .and_then(|_| out.flush())
        .is_err()
    {
        return Ok(exit::OK);
    }
    let interrupted = tokio::signal::ctrl_c();
    tokio::pin!(interrupted);
    let mut stream = client.watch_list(request.clone()).await?;
    loop {
        let next = tokio::select! {
            _ = &mut interrupted => return Ok(exit::OK),
            next = stream.next() => next,
        };
        match next {
            Some(Ok(event)) => {
                match &event.event {
                    // Everything up to its revision is printed: the snapshot
                    // ended, or (once live) nothing more matches up to there.
                    Some(watch_event::Event::EndOfSnapshot(_)) => {
                        resume_from = Some(event.revision);
                        open_revision = None;
                    }
                    Some(watch_event::Event::Progress(_)) if resume_from.is_some() => {
                        resume_from = Some(event.revision);
                        open_revision = None;
                    }
                    Some(watch_event::Event::Upsert(watch_event::Upsert { resource }))
                    | Some(watch_event::Event::Delete(watch_event::Delete { resource }))
                        if resume_from.is_some() =>
                    {
                        let key = cairn_client::ResourceKey::of(
                            resource.as_ref().unwrap_or(&Default::default()),
                        );
                        match &mut open_revision {
                            Some((r, keys)) if *r == event.revision => {
                                if !keys.insert(key) {
                                    continue; // printed before the stream broke
                                }
                            }
                            _ => {
                                if let Some((r, _)) = &open_revision {
                                    resume_from = Some(*r);
                                }
                                open_revision = Some((event.revision, [key].into()));
                            }
                        }
                    }
                    _ => {}
                }
                if print_event(out, c.global.output, &event).is_err() {
                    // The reader went away (a closed pipe): done.
                    return Ok(exit::OK);
                }
                printed += 1;
                if a.max_events > 0 && printed >= a.max_events {
                    return Ok(exit::OK);
                }
            }
            Some(Err(ClientError::Compacted {
                oldest_retained_revision,
            })) => {
                return Err(ClientError::Compacted {
                    oldest_retained_revision,
                })
            }
            Some(Err(ClientError::WatchClosed(_)))
            | Some(Err(ClientError::Unavailable { .. }))
            | None => {
                request.start_revision = resume_from.unwrap_or(0);
                if resume_from.is_none() {
                    // The snapshot was cut short: it starts again.
                    return Err(ClientError::Unavailable {
                        message: "the watch broke before its snapshot ended; run it again".into(),
                        outcome: Outcome::NotApplied,
                    });
                }
                stream = client.watch_list(request.clone()).await?;
            }
            Some(Err(e)) => return Err(e),
        }
    }
}

fn print_event(
    out: &mut (dyn Write + Send),
    format: OutputFormat,
    event: &WatchEvent,
) -> std::io::Result<()> {
    let (name, resource) = match &event.event {
        Some(watch_event::Event::Upsert(u)) => ("upsert", u.resource.as_ref()),
        Some(watch_event::Event::Delete(d)) => ("delete", d.resource.as_ref()),
        Some(watch_event::Event::EndOfSnapshot(_)) => ("end-of-snapshot", None),
        Some(watch_event::Event::Progress(_)) => ("progress", None),
        None => ("unknown", None),
    };
    match format {
        OutputFormat::Json => {
            let mut v = json!({"event": name, "revision": event.revision});
            if let (Some(r), Some(map)) = (resource, v.as_object_mut()) {
                map.insert("resource".into(), resource_to_json(r));
            }
            writeln!(out, "{v}")?;
        }
        OutputFormat::Table => {
            let row = resource.map(row_of).unwrap_or_default();
            let cell = |i: usize| row.get(i).map(String::as_str).unwrap_or("");
            let line = format!(
                "{:<16} {:>9}  {:<28} {:<24} {:<20} {:>9}  {}",
                name,
                event.revision,
                cell(0),
                cell(1),
                cell(2),
                cell(3),
                cell(6)
            );
            writeln!(out, "{}", line.trim_end())?;
        }
    }
    out.flush()
}

// ------------------------------------------------------------- printing ----

const HEADER: [&str; 7] = ["TYPE", "NAME", "TENANCY", "VERSION", "UID", "OWNER", "DATA"];
const DATA_CELL_CHARS_MAX: usize = 60;

/// The table cells of a resource, in [`HEADER`] order.
fn row_of(r: &Resource) -> Vec<String> {
    let id = r.id.clone().unwrap_or_default();
    let t = id.r#type.unwrap_or_default();
    let ten = id.tenancy.unwrap_or_default();
    let owner = r
        .owner
        .as_ref()
        .map(|o| {
            let ot = o.r#type.clone().unwrap_or_default();
            format!("{}.{}.{}/{}", ot.group, ot.group_version, ot.kind, o.name)
        })
        .unwrap_or_else(|| "-".into());
    let data = match &r.data {
        None => "-".to_string(),
        Some(any) => match payload_as_json(&any.value) {
            Some(v) => {
                let text = v.to_string();
                if text.chars().count() > DATA_CELL_CHARS_MAX {
                    let cut: String = text.chars().take(DATA_CELL_CHARS_MAX - 1).collect();
                    format!("{cut}…")
                } else {
                    text
                }
            }
            None => format!("<{} bytes>", any.value.len()),
        },
    };
    vec![
        format!("{}.{}.{}", t.group, t.group_version, t.kind),
        id.name,
        format!("{}/{}", ten.partition, ten.namespace),
        r.version.clone(),
        id.uid,
        owner,
        data,
    ]
}

fn print_resources(
    out: &mut (dyn Write + Send),
    format: OutputFormat,
    resources: &[Resource],
    revision: Option<u64>,
) -> Result<(), ClientError> {
    let written = match (format, revision) {
        (OutputFormat::Json, None) => resources
            .iter()
            .try_for_each(|r| writeln!(out, "{:#}", resource_to_json(r))),
        (OutputFormat::Json, Some(revision)) => {
            let list: Vec<Value> = resources.iter().map(resource_to_json).collect();
            writeln!(
                out,
                "{:#}",
                json!({"revision": revision, "resources": list})
            )
        }
        (OutputFormat::Table, _) => {
            let rows: Vec<Vec<String>> = resources.iter().map(row_of).collect();
            write_table(out, &rows)
        }
    };
    written.and_then(|_| out.flush()).map_err(output_error)
}

/// An error writing to stdout, as the commands report it.
fn output_error(e: std::io::Error) -> ClientError {
    ClientError::Internal {
        message: format!("cannot write the output: {e}"),
        outcome: Outcome::NotApplied,
    }
}

fn write_table(out: &mut (dyn Write + Send), rows: &[Vec<String>]) -> std::io::Result<()> {
    let mut table = Table::default();
    table.rows(out, rows)?;
    table.finish(out)
}

/// A table written a batch of rows at a time: the header and the column
/// widths come from the first batch; a wider cell of a later batch widens
/// its column from there on (rows already printed stay as they are).
#[derive(Default)]
struct Table {
    /// `None` until the header is printed.
    widths: Option<Vec<usize>>,
}

impl Table {
    fn rows(&mut self, out: &mut (dyn Write + Send), rows: &[Vec<String>]) -> std::io::Result<()> {
        let first = self.widths.is_none();
        let widths = self
            .widths
            .get_or_insert_with(|| HEADER.iter().map(|h| h.chars().count()).collect());
        for row in rows {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(cell.chars().count());
            }
        }
        let line = |cells: &mut dyn Iterator<Item = &str>| -> String {
            let padded: Vec<String> = cells
                .zip(widths.iter())
                .map(|(c, w)| format!("{c:<w$}", w = *w))
                .collect();
            padded.join("  ").trim_end().to_string()
        };
        if first {
            writeln!(out, "{}", line(&mut HEADER.iter().copied()))?;
        }
        for row in rows {
            writeln!(out, "{}", line(&mut row.iter().map(String::as_str)))?;
        }
        Ok(())
    }

    /// The header, if no batch printed it.
    fn finish(&mut self, out: &mut (dyn Write + Send)) -> std::io::Result<()> {
        if self.widths.is_none() {
            self.rows(out, &[])?;
        }
        Ok(())
    }
}

/// `cairn list`'s output, written page by page as the pages arrive, so that
/// only one page is held at a time. The JSON form is the one document
/// `print_resources` writes for a whole list (`{"resources": [...],
/// "revision": N}`, pretty-printed the same way): the revision, which every
/// page reflects, closes it. A listing that fails after some pages were
/// printed leaves the document unclosed (not valid JSON) and the command
/// exits non-zero.
struct ListingPrinter {
    format: OutputFormat,
    table: Table,
    /// Resources printed so far.
    printed: usize,
    /// Whether the JSON document has been opened.
    opened: bool,
}

impl ListingPrinter {
    fn new(format: OutputFormat) -> ListingPrinter {
        ListingPrinter {
            format,
            table: Table::default(),
            printed: 0,
            opened: false,
        }
    }

    fn page(
        &mut self,
        out: &mut (dyn Write + Send),
        resources: &[Resource],
    ) -> std::io::Result<()> {
        match self.format {
            OutputFormat::Table => {
                let rows: Vec<Vec<String>> = resources.iter().map(row_of).collect();
                self.table.rows(out, &rows)?;
                self.printed += resources.len();
            }
            OutputFormat::Json => {
                self.open(out)?;
                for r in resources {
                    let separator = if self.printed == 0 { "\n" } else { ",\n" };
                    let text = format!("{:#}", resource_to_json(r));
                    out.write_all(separator.as_bytes())?;
                    for (i, line) in text.lines().enumerate() {
                        if i > 0 {
                            out.write_all(b"\n")?;
                        }
                        write!(out, "    {line}")?;
                    }
                    self.printed += 1;
                }
            }
        }
        out.flush()
    }

    fn open(&mut self, out: &mut (dyn Write + Send)) -> std::io::Result<()> {
        if !self.opened {
            out.write_all(b"{\n  \"resources\": [")?;
            self.opened = true;
        }
        Ok(())
    }

    /// Ends the output of a listing at `revision`.
    fn finish(mut self, out: &mut (dyn Write + Send), revision: u64) -> std::io::Result<()> {
        match self.format {
            OutputFormat::Table => self.table.finish(out)?,
            OutputFormat::Json => {
                self.open(out)?;
                let close = if self.printed == 0 { "]" } else { "\n  ]" };
                write!(out, "{close},\n  \"revision\": {revision}\n}}\n")?;
            }
        }
        out.flush()
    }
}

fn print_deleted(
    out: &mut (dyn Write + Send),
    format: OutputFormat,
    deleted: Option<&(Resource, DeleteResponse)>,
) -> Result<(), ClientError> {
    let written = match (format, deleted) {
        (OutputFormat::Json, Some((r, answer))) => writeln!(
            out,
            "{:#}",
            json!({"deleted": true, "marked": answer.marked, "revision": answer.revision,
                   "resource": resource_to_json(r)})
        ),
        (OutputFormat::Json, None) => writeln!(out, "{:#}", json!({"deleted": false})),
        (OutputFormat::Table, Some((r, answer))) => {
            let row = row_of(r);
            let what = match answer.marked {
                true => "marked for deletion (it has finalizers: it goes when they are removed)",
                false => "deleted",
            };
            writeln!(
                out,
                "{what} {} {} in {} (version {}, uid {})",
                row[0], row[1], row[2], row[3], row[4]
            )
        }
        (OutputFormat::Table, None) => writeln!(out, "nothing stored: nothing deleted"),
    };
    written
        .and_then(|_| out.flush())
        .map_err(|e| ClientError::Internal {
            message: format!("cannot write the output: {e}"),
            outcome: Outcome::NotApplied,
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser, Debug)]
    #[command(name = "cairn")]
    struct TestCli {
        #[command(subcommand)]
        command: DataCommand,
    }

    fn parse(args: &[&str]) -> Result<DataCommand, clap::Error> {
        TestCli::try_parse_from(std::iter::once("cairn").chain(args.iter().copied()))
            .map(|c| c.command)
    }

    #[test]
    fn types_parse_with_the_kind_last_and_dotted_groups() {
        // GROUP.GROUP_VERSION.KIND, the group may contain dots; lists also take GROUP.KIND.
        let t = parse_type("catalog.v2.Service").unwrap();
        assert_eq!(
            (t.group.as_str(), t.group_version.as_str(), t.kind.as_str()),
            ("catalog", "v2", "Service")
        );
        let t = parse_type("hashicorp.consul.catalog.v2beta1.Service").unwrap();
        assert_eq!(t.group, "hashicorp.consul.catalog");
        assert_eq!(t.group_version, "v2beta1");
        assert!(parse_type("catalog.Service").is_err());
        assert!(parse_type("catalog..Service").is_err());
        assert!(parse_type("Service").is_err());
        let t = parse_list_type("catalog.Service").unwrap();
        assert_eq!(
            (t.group.as_str(), t.group_version.as_str()),
            ("catalog", "")
        );
        assert_eq!(parse_list_type("a.v1.K").unwrap().group_version, "v1");
    }

    #[test]
    fn tenancy_parses_as_partition_slash_namespace() {
        // Exactly one '/', parts may be empty or '*'.
        let t = parse_tenancy("default/ns").unwrap();
        assert_eq!(
            (t.partition.as_str(), t.namespace.as_str()),
            ("default", "ns")
        );
        let t = parse_tenancy("*/*").unwrap();
        assert_eq!(t.partition, "*");
        assert_eq!(parse_tenancy("/").unwrap(), Tenancy::default());
        assert!(parse_tenancy("default").is_err());
        assert!(parse_tenancy("a/b/c").is_err());
    }

    #[test]
    fn every_command_parses_with_defaults_and_flags() {
        // The documented syntax parses; defaults are the dev cluster, strong, default/default, table.
        let DataCommand::Read(r) = parse(&["read", "--type", "g.v1.K", "--name", "n"]).unwrap()
        else {
            panic!("read")
        };
        assert_eq!(r.common.global.cluster.endpoints.len(), 3);
        assert_eq!(r.common.consistency, ConsistencyArg::Strong);
        assert_eq!(r.common.tenancy.partition, "default");
        assert_eq!(r.common.global.output, OutputFormat::Table);
        let DataCommand::Write(w) = parse(&[
            "write",
            "--type",
            "g.v1.K",
            "--name",
            "n",
            "--data-json",
            "{\"a\":1}",
            "--metadata",
            "k=v",
            "--metadata",
            "x=y=z",
            "--endpoints",
            "a:1,b:2",
            "-o",
            "json",
            "--consistency",
            "eventual",
            "--tenancy",
            "p/ns",
        ])
        .unwrap() else {
            panic!("write")
        };
        assert_eq!(
            w.common.global.cluster.endpoints,
            vec!["a:1".to_string(), "b:2".to_string()]
        );
        assert_eq!(
            w.metadata,
            vec![("k".into(), "v".into()), ("x".into(), "y=z".into())]
        );
        assert_eq!(w.common.global.output, OutputFormat::Json);
        assert!(matches!(
            parse(&["write", "--file", "-"]).unwrap(),
            DataCommand::Write(_)
        ));
        assert!(matches!(
            parse(&[
                "delete",
                "--type",
                "g.v1.K",
                "--name",
                "n",
                "--version",
                "4"
            ])
            .unwrap(),
            DataCommand::Delete(_)
        ));
        assert!(matches!(
            parse(&["list", "--type", "g.K", "--tenancy", "*/*"]).unwrap(),
            DataCommand::List(_)
        ));
        assert!(matches!(
            parse(&["owned-by", "--type", "g.v1.K", "--name", "n", "--uid", "u"]).unwrap(),
            DataCommand::OwnedBy(_)
        ));
        let DataCommand::Watch(w) = parse(&[
            "watch",
            "--type",
            "g.K",
            "--from-revision",
            "7",
            "--max-events",
            "2",
        ])
        .unwrap() else {
            panic!("watch")
        };
        assert_eq!((w.from_revision, w.max_events), (7, 2));
    }

    #[test]
    fn bad_usage_is_a_parse_error() {
        // Missing required flags, bad syntax and conflicting flags are refused by the parser.
        for args in [
            &["read", "--name", "n"][..],
            &["read", "--type", "g.K", "--name", "n"],
            &["write", "--name", "n"],
            &["write", "--file", "x", "--name", "n"],
            &[
                "write",
                "--type",
                "g.v.K",
                "--name",
                "n",
                "--data-json",
                "1",
                "--data-base64",
                "AA==",
            ],
            &[
                "write",
                "--type",
                "g.v.K",
                "--name",
                "n",
                "--version",
                "3",
                "--upsert",
            ],
            &["list", "--type", "g.K", "--tenancy", "nope"],
            &["list", "--type", "g.K", "--consistency", "linearizable"],
            &[
                "write",
                "--type",
                "g.v.K",
                "--name",
                "n",
                "--metadata",
                "novalue",
            ],
        ] {
            assert!(parse(args).is_err(), "{args:?} parsed");
        }
    }

    #[test]
    fn flags_build_the_resource_with_a_default_type_url() {
        // --data-json is stored compactly under type.googleapis.com/GROUP.VERSION.KIND; --owner is parsed.
        let DataCommand::Write(w) = parse(&[
            "write",
            "--type",
            "g.v1.K",
            "--name",
            "n",
            "--data-json",
            "{ \"a\" : 1 }",
            "--owner",
            "g.v1.P/parent/u9",
        ])
        .unwrap() else {
            panic!("write")
        };
        let r = resource_of(&w.common, &w).unwrap();
        let data = r.data.unwrap();
        assert_eq!(data.type_url, "type.googleapis.com/g.v1.K");
        assert_eq!(data.value.as_ref(), br#"{"a":1}"#);
        let owner = r.owner.unwrap();
        assert_eq!((owner.name.as_str(), owner.uid.as_str()), ("parent", "u9"));
        assert_eq!(owner.r#type.unwrap().kind, "P");
        assert!(parse_owner("g.v1.P/parent", &Tenancy::default()).is_err());
    }

    #[test]
    fn a_table_pads_columns_and_truncates_long_data() {
        // Columns line up under the header; data longer than the cell limit ends with an ellipsis.
        let r = Resource {
            id: Some(Id {
                uid: "u".into(),
                name: "web".into(),
                r#type: Some(parse_type("g.v1.K").unwrap()),
                tenancy: Some(parse_tenancy("default/default").unwrap()),
            }),
            version: "12".into(),
            data: Some(Any {
                type_url: "t".into(),
                value: Bytes::from(json_payload(&json!({"k": "x".repeat(100)}))),
            }),
            ..Default::default()
        };
        let mut out = Vec::new();
        print_resources(&mut out, OutputFormat::Table, &[r], None).unwrap();
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2);
        assert!(lines[0].starts_with("TYPE    NAME  TENANCY"), "{text}");
        assert!(
            lines[1].starts_with("g.v1.K  web   default/default  12"),
            "{text}"
        );
        assert!(lines[1].ends_with('…'), "{text}");
    }

    fn named(name: &str, data: &str) -> Resource {
        Resource {
            id: Some(Id {
                uid: "u".into(),
                name: name.into(),
                r#type: Some(parse_type("g.v1.K").unwrap()),
                tenancy: Some(parse_tenancy("default/default").unwrap()),
            }),
            version: "3".into(),
            data: Some(Any {
                type_url: "t".into(),
                value: Bytes::from(json_payload(&json!({ "d": data }))),
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_listing_printed_page_by_page_is_the_document_of_the_whole_list() {
        // JSON: pages of any split (empty pages included) give exactly the bytes
        // print_resources writes for the whole list, and an empty listing too.
        let all: Vec<Resource> = (0..5).map(|i| named(&format!("n{i}"), "x")).collect();
        for splits in [
            vec![],
            vec![5],
            vec![1, 1, 1, 1, 1],
            vec![0, 2, 0, 3],
            vec![4, 1],
        ] {
            let mut whole = Vec::new();
            let count: usize = splits.iter().sum();
            print_resources(&mut whole, OutputFormat::Json, &all[..count], Some(9)).unwrap();
            let mut paged = Vec::new();
            let mut printer = ListingPrinter::new(OutputFormat::Json);
            let mut at = 0;
            for n in &splits {
                printer.page(&mut paged, &all[at..at + n]).unwrap();
                at += n;
            }
            printer.finish(&mut paged, 9).unwrap();
            assert_eq!(
                String::from_utf8(paged).unwrap(),
                String::from_utf8(whole).unwrap(),
                "{splits:?}"
            );
        }
    }

    #[test]
    fn a_table_printed_page_by_page_has_one_header_and_widens_later_columns() {
        // One header (also for an empty listing); a wider later cell widens its column.
        let mut out = Vec::new();
        let mut printer = ListingPrinter::new(OutputFormat::Table);
        printer.page(&mut out, &[named("a", "x")]).unwrap();
        printer.page(&mut out, &[]).unwrap();
        printer
            .page(&mut out, &[named("a-much-longer-name", "x")])
            .unwrap();
        printer.finish(&mut out, 4).unwrap();
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert!(lines[0].starts_with("TYPE    NAME  TENANCY"), "{text}");
        assert!(
            lines[2].contains("a-much-longer-name  default/default"),
            "{text}"
        );
        let mut empty = Vec::new();
        ListingPrinter::new(OutputFormat::Table)
            .finish(&mut empty, 4)
            .unwrap();
        assert_eq!(String::from_utf8(empty).unwrap().lines().count(), 1);
    }
}
