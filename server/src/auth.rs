//! Authentication and authorization on the client port.
//!
//! Two pure functions decide everything; the gRPC handlers (`service.rs`,
//! `admin.rs`) are thin shells that call them on every request, before any
//! work is done:
//! - [`GrantTable::authenticate`]: credentials (a bearer token, or a
//!   client certificate's subject) → a [`Caller`], or UNAUTHENTICATED;
//! - [`authorize`]: caller × [`Action`] → a [`Visibility`] (what of the
//!   answer the caller may see), or PERMISSION_DENIED naming the missing
//!   permission.
//!
//! The check runs on the node the client talks to. A follower forwards a
//! write, a strong read or a strong list only after it was authorized here;
//! a strong list carries the caller's read scope (`cairn.v1.ReadScope`), and
//! the leader lists only what it shows. The peer port that carries forwarded
//! requests never sees a client's token and is protected as a peer channel
//! (cluster id, membership, mutual TLS).
//!
//! A token is long and random (`cairn token new`: 256 bits), so the config
//! keeps only its SHA-256: a fast hash is enough when the input cannot be
//! guessed, and no secret is stored on the node.
//!
//! ## Reload
//! The [`Authenticator`] holds the grants in force as one [`GrantTable`],
//! replaced whole by [`Authenticator::reload`] (on SIGHUP, see
//! `crate::reload`): a config whose grants do not load, or that would remove
//! every grant, leaves the table in force. A request is decided by the table
//! current when it arrives. An open watch is decided again at every reload
//! ([`close_when_revoked`]): if its caller would now be refused it ends with
//! that refusal (UNAUTHENTICATED, PERMISSION_DENIED), and if its caller's
//! grant changed at all it ends with WatchClosed, so that the client lists
//! again under the new grant rather than keep a view the grant no longer
//! describes.
//!
//! ## Invariants
//! - With no grant configured every caller is [`Caller::Unrestricted`]; with
//!   at least one, no request is served without a known token or subject.
//!   A reload never goes from some grants to none.
//! - A caller never receives a resource outside its read scope: a Read,
//!   Write or Delete outside it is refused before anything is read; List and
//!   ListByOwner list only what [`Visibility::read_scope`] shows, and
//!   WatchList events pass through [`Visibility::shows`] (both read a
//!   resource's type and tenancy from its encoding, the bytes that are sent,
//!   without decoding it). A watch never outlives a change of its caller's
//!   grant.
//! - A denial depends only on the grant and the request, never on what is
//!   stored, so the error itself leaks nothing; nor does a list's page size
//!   (`list_page_size_max`) or ListByOwner's `list_results_max`, which count
//!   only what the caller may see.
//! - Scopes ignore the group version (see `cairn_fsm::Scope`).

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use cairn_forwarding::WatchStream;
use cairn_fsm::{ReadScope, Scope, TenancyHead, TypeHead};
use cairn_proto::error::ApiError;
use cairn_proto::v1::{Tenancy, Type};
use cairn_tls::Reloadable;
use futures::StreamExt as _;
use sha2::{Digest as _, Sha256};
use tokio::sync::watch;

use crate::config::{invalid, AuthConfig, ConfigError, GrantConfig};

/// What one grant allows: `read` and `write` scopes (write implies read on
/// its scope) and the `admin` role.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pub name: String,
    read: Option<Scope>,
    write: Option<Scope>,
    /// What the holder may see: read and write scopes together.
    visible: Arc<ReadScope>,
    pub admin: bool,
    /// Its own rates, where its config gives them (`None`: the node's).
    pub requests_per_second: Option<u64>,
    pub bytes_per_second: Option<u64>,
}

impl Grant {
    /// The grant `config` describes (its scopes checked by [`GrantConfig::scopes`]).
    #[cfg(test)]
    fn parse(config: &GrantConfig) -> Result<Grant, String> {
        let (read, write) = config.scopes()?;
        Ok(Grant::new(config, read, write))
    }

    fn new(config: &GrantConfig, read: Option<Scope>, write: Option<Scope>) -> Grant {
        let visible = Arc::new(ReadScope::new(
            read.iter().chain(write.iter()).cloned().collect(),
        ));
        Grant {
            name: config.name.clone(),
            read,
            write,
            visible,
            admin: config.admin,
            requests_per_second: config.requests_per_second,
            bytes_per_second: config.bytes_per_second,
        }
    }

    fn scopes(&self) -> impl Iterator<Item = &Scope> {
        self.read.iter().chain(self.write.iter())
    }

    /// Whether the grant lets its holder see this resource.
    pub fn may_read(&self, type_: &TypeHead<'_>, tenancy: &TenancyHead<'_>) -> bool {
        self.visible.contains(type_, tenancy)
    }

    fn may_write(&self, type_: &TypeHead<'_>, tenancy: &TenancyHead<'_>) -> bool {
        self.write.iter().any(|s| s.contains(type_, tenancy))
    }
}

/// Who is calling, once authenticated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    /// Authentication is off (no grant configured): everything is allowed.
    Unrestricted,
    Granted(Arc<Grant>),
}

impl Caller {
    /// Who is calling, for what a caller may touch only of its own (the
    /// watches it opened): its grant's name; `None` with authentication off.
    pub fn principal(&self) -> Option<&str> {
        match self {
            Caller::Unrestricted => None,
            Caller::Granted(grant) => Some(&grant.name),
        }
    }
}

/// An operation of the AdminService; each needs the `admin` role.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdminOperation {
    Status,
    AddLearner,
    Promote,
    RemoveMember,
    TransferLeader,
    TriggerElection,
    SaveSnapshot,
    RestoreSnapshot,
    ClusterVersion,
    /// `cairn alarm list` and `cairn alarm disarm`.
    Alarm,
    /// `cairn check consistency`.
    CheckConsistency,
}

/// What a request asks to do, with its fields already validated.
#[derive(Debug, Clone, Copy)]
pub enum Action<'a> {
    /// Read one resource.
    Read {
        type_: &'a Type,
        tenancy: &'a Tenancy,
    },
    /// Write or delete one resource.
    Write {
        type_: &'a Type,
        tenancy: &'a Tenancy,
    },
    /// List or watch a type in a tenancy pattern (either part may be `*`).
    List {
        type_: &'a Type,
        tenancy: &'a Tenancy,
    },
    /// Every resource owned by one resource, whatever its type.
    ListByOwner,
    /// Grant, keep alive, look at or list leases (a revoke also needs write on what is
    /// attached to the lease: each is authorized as a [`Action::Write`]).
    Lease,
    Admin(AdminOperation),
}

/// What of an allowed request's answer the caller may see.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Visibility {
    Everything,
    Within(Arc<Grant>),
}

impl Visibility {
    /// Whether the resource `encoded` (a `cairn.v1.Resource`, as stored and
    /// sent) may be shown to the caller ([`ReadScope::shows`]: a resource
    /// without an id, type or tenancy, or whose bytes do not parse, is never
    /// shown under a grant).
    pub fn shows(&self, encoded: &[u8]) -> bool {
        self.read_scope().is_none_or(|scope| scope.shows(encoded))
    }

    /// What the caller may see; `None`: everything.
    pub fn read_scope(&self) -> Option<&Arc<ReadScope>> {
        match self {
            Visibility::Everything => None,
            Visibility::Within(grant) => Some(&grant.visible),
        }
    }
}

fn full_type(t: &Type) -> String {
    format!("{}.{}.{}", t.group, t.group_version, t.kind)
}

fn tenancy_text(t: &Tenancy) -> String {
    format!("{}/{}", t.partition, t.namespace)
}

/// The permission an action needs, as PERMISSION_DENIED names it.
pub fn permission_of(action: &Action<'_>) -> String {
    match action {
        Action::Read { type_, tenancy } => {
            format!("read on {} in {}", full_type(type_), tenancy_text(tenancy))
        }
        Action::Write { type_, tenancy } => {
            format!("write on {} in {}", full_type(type_), tenancy_text(tenancy))
        }
        Action::List { type_, tenancy } => format!(
            "read on {}.{} in {}",
            type_.group,
            type_.kind,
            tenancy_text(tenancy)
        ),
        Action::ListByOwner => "read on any type".into(),
        Action::Lease => "write on some type (leases are for writers)".into(),
        Action::Admin(operation) => format!("admin (for {operation:?})"),
    }
}

/// The authorization decision: pure, table-tested.
///
/// - Read and Write need the permission on the resource's type and tenancy.
/// - List and WatchList are refused only when no resource they could match
///   lies in the read scope; otherwise they are allowed and their answers are
///   filtered through the returned [`Visibility`].
/// - ListByOwner needs some read scope; its answer is filtered.
/// - Admin operations need the admin role.
pub fn authorize(caller: &Caller, action: &Action<'_>) -> Result<Visibility, ApiError> {
    let grant = match caller {
        Caller::Unrestricted => return Ok(Visibility::Everything),
        Caller::Granted(grant) => grant,
    };
    let allowed = match action {
        Action::Read { type_, tenancy } => grant.may_read(&(*type_).into(), &(*tenancy).into()),
        Action::Write { type_, tenancy } => grant.may_write(&(*type_).into(), &(*tenancy).into()),
        Action::List { type_, tenancy } => grant.scopes().any(|s| s.overlaps(type_, tenancy)),
        Action::ListByOwner => grant.scopes().next().is_some(),
        Action::Lease => grant.write.is_some() || grant.admin,
        Action::Admin(_) => grant.admin,
    };
    if allowed {
        Ok(Visibility::Within(grant.clone()))
    } else {
        Err(ApiError::PermissionDenied(format!(
            "grant {:?} lacks {}",
            grant.name,
            permission_of(action)
        )))
    }
}

/// The lowercase hex SHA-256 of a token, as the config keeps it.
pub fn token_sha256_hex(token: &str) -> String {
    Sha256::digest(token.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A new random token: `cairn-` and 256 bits from the operating system's
/// generator, in hex.
pub fn new_token() -> Result<String, String> {
    use rand::TryRngCore as _;
    let mut bytes = [0u8; 32];
    rand::rngs::OsRng
        .try_fill_bytes(&mut bytes)
        .map_err(|e| format!("the operating system's random generator failed: {e}"))?;
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    Ok(format!("cairn-{hex}"))
}

/// What a request presents: its `authorization` metadata and the verified
/// client certificate subject of its connection (none over plaintext, or
/// without a client certificate). Borrowed from the request; an open watch
/// keeps an owned copy ([`Presented::into_owned`]), to be decided again at a
/// reload. Never printed.
#[derive(Clone)]
pub struct Presented<'a> {
    /// `Err(())`: the metadata is not ASCII.
    authorization: Option<Result<Cow<'a, str>, ()>>,
    subject: Option<Cow<'a, str>>,
}

impl<'a> Presented<'a> {
    pub fn of<T>(request: &'a tonic::Request<T>) -> Presented<'a> {
        Presented {
            authorization: request
                .metadata()
                .get("authorization")
                .map(|value| value.to_str().map(Cow::Borrowed).map_err(drop)),
            subject: crate::tls::client_cert_subject(request).map(Cow::Borrowed),
        }
    }

    pub fn into_owned(self) -> Presented<'static> {
        Presented {
            authorization: self
                .authorization
                .map(|a| a.map(|value| Cow::Owned(value.into_owned()))),
            subject: self.subject.map(|s| Cow::Owned(s.into_owned())),
        }
    }
}

/// The grants of the client port, looked up by token hash or subject.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct GrantTable {
    by_token_sha256: HashMap<String, Arc<Grant>>,
    by_subject: HashMap<String, Arc<Grant>>,
}

impl GrantTable {
    /// Builds the lookup from `[auth]`; every mistake is an error naming
    /// the grant (by position and name) and what is wrong with it.
    /// The grants are checked by the configuration ([`AuthConfig::check_grants`]).
    pub fn from_config(config: &AuthConfig) -> Result<GrantTable, ConfigError> {
        let mut auth = GrantTable::default();
        for checked in config.check_grants()? {
            let grant = Arc::new(Grant::new(checked.config, checked.read, checked.write));
            if let Some(hash) = checked.token_sha256 {
                auth.by_token_sha256.insert(hash, grant.clone());
            }
            if let Some(subject) = &checked.config.subject {
                auth.by_subject.insert(subject.clone(), grant);
            }
        }
        Ok(auth)
    }

    /// Whether callers must authenticate (at least one grant is configured).
    pub fn is_enabled(&self) -> bool {
        !self.by_token_sha256.is_empty() || !self.by_subject.is_empty()
    }

    /// How many grants there are.
    pub fn grant_count(&self) -> usize {
        let mut names: HashSet<&str> = HashSet::new();
        for g in self
            .by_token_sha256
            .values()
            .chain(self.by_subject.values())
        {
            names.insert(&g.name);
        }
        names.len()
    }

    /// Whether `token` belongs to a grant with the admin role.
    pub fn token_is_admin(&self, token: &str) -> bool {
        self.by_token_sha256
            .get(&token_sha256_hex(token))
            .is_some_and(|g| g.admin)
    }

    /// Authentication, pure: the `authorization` metadata value (if any)
    /// and the verified client certificate subject (if any) → the caller.
    /// A token, when given, decides alone: a bad one is never rescued by a
    /// certificate.
    pub fn authenticate(
        &self,
        authorization: Option<&str>,
        subject: Option<&str>,
    ) -> Result<Caller, ApiError> {
        if !self.is_enabled() {
            return Ok(Caller::Unrestricted);
        }
        if let Some(value) = authorization {
            // The token's form is the client's one rule (`BearerToken::new`).
            let token = value
                .split_once(' ')
                .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
                .and_then(|(_, token)| cairn_client::BearerToken::new(token).ok())
                .ok_or_else(|| {
                    ApiError::Unauthenticated(format!(
                        "the authorization metadata must be `Bearer <token>`, the token \
                         printable ASCII without spaces, at most {} bytes",
                        cairn_client::BearerToken::LEN_MAX
                    ))
                })?;
            return self
                .by_token_sha256
                .get(&token_sha256_hex(token.secret()))
                .map(|grant| Caller::Granted(grant.clone()))
                .ok_or_else(|| {
                    ApiError::Unauthenticated("the token matches no grant of this node".into())
                });
        }
        if let Some(subject) = subject {
            return self
                .by_subject
                .get(subject)
                .map(|grant| Caller::Granted(grant.clone()))
                .ok_or_else(|| {
                    ApiError::Unauthenticated(format!(
                        "no token given, and the client certificate subject {subject:?} \
                         matches no grant of this node"
                    ))
                });
        }
        Err(ApiError::Unauthenticated(
            "no token given: this node requires `authorization: Bearer <token>` \
             (cairn --token or CAIRN_TOKEN)"
                .into(),
        ))
    }

    /// The caller of what a request presents.
    pub fn caller(&self, presented: &Presented<'_>) -> Result<Caller, ApiError> {
        if !self.is_enabled() {
            return Ok(Caller::Unrestricted);
        }
        let authorization = match &presented.authorization {
            None => None,
            Some(Ok(value)) => Some(value.as_ref()),
            Some(Err(())) => {
                return Err(ApiError::Unauthenticated(
                    "the authorization metadata is not ASCII".into(),
                ))
            }
        };
        self.authenticate(authorization, presented.subject.as_deref())
    }
}

/// The grants in force on a node: a [`GrantTable`], replaced whole by a
/// reload, and a signal that open watches wait on.
pub struct Authenticator {
    table: Reloadable<GrantTable>,
    /// Counts the reloads that changed the table.
    reloads: watch::Sender<u64>,
}

impl Authenticator {
    pub fn new(table: GrantTable) -> Authenticator {
        Authenticator {
            table: Reloadable::new(table),
            reloads: watch::Sender::new(0),
        }
    }

    /// The grants of `[auth]` (see [`GrantTable::from_config`]).
    pub fn from_config(config: &AuthConfig) -> Result<Authenticator, ConfigError> {
        GrantTable::from_config(config).map(Authenticator::new)
    }

    /// The grants in force.
    pub fn current(&self) -> Arc<GrantTable> {
        self.table.current()
    }

    /// Replaces the grants with those of `config`, all or none. `Ok(false)`:
    /// they are the grants in force already. Refused, keeping the grants in
    /// force: a config whose grants do not load, or one without grants when
    /// some are in force (that would open the client port to anyone; an
    /// operator who means it restarts the node).
    pub fn reload(&self, config: &AuthConfig) -> Result<bool, ConfigError> {
        let table = GrantTable::from_config(config)?;
        let current = self.current();
        if current.is_enabled() && !table.is_enabled() {
            return Err(invalid(
                "auth.grants",
                "the new configuration has no grant, which would let anyone use the client \
                 port: a reload never turns authentication off (restart the node for that)",
            ));
        }
        if *current == table {
            return Ok(false);
        }
        self.table.replace(table);
        self.reloads.send_modify(|count| *count += 1);
        Ok(true)
    }

    /// Authenticates a gRPC request by its metadata and its connection.
    pub fn caller<T>(&self, request: &tonic::Request<T>) -> Result<Caller, ApiError> {
        self.current().caller(&Presented::of(request))
    }

    /// Authenticates, then requires the admin role for `operation`.
    pub fn require_admin<T>(
        &self,
        request: &tonic::Request<T>,
        operation: AdminOperation,
    ) -> Result<(), ApiError> {
        let caller = self.caller(request)?;
        authorize(&caller, &Action::Admin(operation)).map(|_| ())
    }

    /// Authenticates a watch: the first step of [`WatchGuard`]'s two, so
    /// that an unknown caller learns nothing about its request (validated
    /// between the two).
    pub fn watch_caller<T>(
        self: &Arc<Self>,
        request: &tonic::Request<T>,
    ) -> Result<WatchCaller, ApiError> {
        // Subscribed before the table is read: a reload in between is seen.
        let reloads = self.reloads.subscribe();
        let presented = Presented::of(request);
        let caller = self.current().caller(&presented)?;
        Ok(WatchCaller {
            auth: self.clone(),
            presented: presented.into_owned(),
            caller,
            reloads,
        })
    }
}

/// An authenticated watch, before it is authorized.
pub struct WatchCaller {
    auth: Arc<Authenticator>,
    presented: Presented<'static>,
    caller: Caller,
    reloads: watch::Receiver<u64>,
}

impl WatchCaller {
    /// See [`Caller::principal`].
    pub fn principal(&self) -> Option<&str> {
        self.caller.principal()
    }

    /// Authorizes a watch of `type_` in `tenancy` (a validated list filter),
    /// keeping what it needs to decide again at every reload.
    pub fn authorize(self, type_: &Type, tenancy: &Tenancy) -> Result<WatchGuard, ApiError> {
        let visibility = authorize(&self.caller, &Action::List { type_, tenancy })?;
        Ok(WatchGuard {
            auth: self.auth,
            presented: self.presented,
            type_: type_.clone(),
            tenancy: tenancy.clone(),
            caller: self.caller,
            visibility,
            reloads: self.reloads,
        })
    }
}

/// An open watch's authorization, decided again at every reload.
pub struct WatchGuard {
    auth: Arc<Authenticator>,
    presented: Presented<'static>,
    type_: Type,
    tenancy: Tenancy,
    caller: Caller,
    visibility: Visibility,
    reloads: watch::Receiver<u64>,
}

impl WatchGuard {
    /// What of the watch the caller may see, as decided when it opened.
    pub fn visibility(&self) -> &Visibility {
        &self.visibility
    }

    /// Resolves at the first reload after which the watch may not go on:
    /// with the refusal a new watch would get, or WatchClosed when the
    /// caller's grant changed but still allows the watch. Never resolves
    /// while reloads leave the caller's grant as it was.
    pub async fn revoked(mut self) -> ApiError {
        loop {
            if self.reloads.changed().await.is_err() {
                // The authenticator is gone with the node: nothing changes any more.
                return std::future::pending().await;
            }
            let caller = match self.auth.current().caller(&self.presented) {
                Ok(caller) => caller,
                Err(refusal) => return refusal,
            };
            let action = Action::List {
                type_: &self.type_,
                tenancy: &self.tenancy,
            };
            if let Err(refusal) = authorize(&caller, &action) {
                return refusal;
            }
            if caller != self.caller {
                return ApiError::WatchClosed(
                    "the grants were reloaded and this caller's grant changed: list again".into(),
                );
            }
        }
    }
}

/// `events`, ended by the guard's refusal (or WatchClosed) as soon as a
/// reload revokes the watch (see [`WatchGuard::revoked`]).
pub fn close_when_revoked(events: WatchStream, guard: WatchGuard) -> WatchStream {
    let revoked: Pin<Box<dyn Future<Output = ApiError> + Send>> = Box::pin(guard.revoked());
    Box::pin(futures::stream::unfold(
        Some((events, revoked)),
        |state| async move {
            let (mut events, mut revoked) = state?;
            tokio::select! {
                biased;
                refusal = &mut revoked => Some((Err(refusal), None)),
                event = events.next() => {
                    let event = event?;
                    Some((event, Some((events, revoked))))
                }
            }
        },
    ))
}

/// Reads the node's own token from `auth.node_token_file`.
pub fn load_node_token(config: &AuthConfig) -> anyhow::Result<Option<cairn_client::BearerToken>> {
    let Some(path) = &config.node_token_file else {
        return Ok(None);
    };
    let text = std::fs::read_to_string(path).map_err(|e| {
        anyhow::anyhow!(
            "configuration field `auth.node_token_file`: cannot read {}: {e}",
            path.display()
        )
    })?;
    let token = cairn_client::BearerToken::new(text).map_err(|e| {
        anyhow::anyhow!(
            "configuration field `auth.node_token_file`: {}: {e}",
            path.display()
        )
    })?;
    Ok(Some(token))
}

/// Says in the log whether the client port requires credentials, and
/// whether the node token can do what a node needs (at start and reload).
pub fn log_auth_mode(auth: &GrantTable, node_token: Option<&cairn_client::BearerToken>) {
    if !auth.is_enabled() {
        tracing::warn!(
            "the client port is unauthenticated: no [[auth.grants]] in the config, so any \
             client that reaches it may read, write and administer the cluster"
        );
        return;
    }
    tracing::info!(
        grants = auth.grant_count(),
        "the client port requires a bearer token (or a client certificate with a grant)"
    );
    match node_token {
        None => tracing::warn!(
            "auth.node_token_file is not set: this node cannot join a cluster, hand \
             leadership off on shutdown, or check its membership at start"
        ),
        Some(token) if !auth.token_is_admin(token.secret()) => tracing::warn!(
            "the token in auth.node_token_file has no admin grant on this node: other \
             nodes need its hash in a grant with admin = true"
        ),
        Some(_) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ScopeConfig;
    use cairn_proto::v1::Resource;

    fn ty(group: &str, version: &str, kind: &str) -> Type {
        Type {
            group: group.into(),
            group_version: version.into(),
            kind: kind.into(),
        }
    }

    fn ten(partition: &str, namespace: &str) -> Tenancy {
        Tenancy {
            partition: partition.into(),
            namespace: namespace.into(),
        }
    }

    fn scope(types: &[&str], tenancies: &[&str]) -> Option<ScopeConfig> {
        Some(ScopeConfig {
            types: types.iter().map(|s| s.to_string()).collect(),
            tenancies: tenancies.iter().map(|s| s.to_string()).collect(),
        })
    }

    fn grant(read: Option<ScopeConfig>, write: Option<ScopeConfig>, admin: bool) -> Caller {
        Caller::Granted(Arc::new(
            Grant::parse(&GrantConfig {
                name: "g".into(),
                token_sha256: None,
                subject: None,
                read,
                write,
                admin,
                ..GrantConfig::default()
            })
            .unwrap(),
        ))
    }

    #[test]
    fn the_decision_table() {
        // Each row: a grant, an action, allowed or not. The grants:
        let reader = grant(scope(&["demo.Thing"], &["default/*"]), None, false);
        let writer = grant(None, scope(&["demo.*"], &["team-a/web"]), false);
        let admin = grant(None, None, true);
        let everything = grant(scope(&["*"], &["*"]), scope(&["*"], &["*"]), true);
        let thing = ty("demo", "v1", "Thing");
        let thing_v2 = ty("demo", "v2", "Thing");
        let other_kind = ty("demo", "v1", "Other");
        let other_group = ty("ops", "v1", "Thing");
        let dd = ten("default", "default");
        let dx = ten("default", "x");
        let aw = ten("team-a", "web");
        let ax = ten("team-a", "x");
        let any = ten("*", "*");
        let a_any = ten("team-a", "*");
        let any_web = ten("*", "web");
        use Action::*;
        let rows: Vec<(&Caller, Action<'_>, bool)> = vec![
            // Unrestricted: everything.
            (
                &Caller::Unrestricted,
                Write {
                    type_: &thing,
                    tenancy: &dd,
                },
                true,
            ),
            (&Caller::Unrestricted, Admin(AdminOperation::Status), true),
            // Read scope: the type in any version, its tenancies, nothing else.
            (
                &reader,
                Read {
                    type_: &thing,
                    tenancy: &dd,
                },
                true,
            ),
            (
                &reader,
                Read {
                    type_: &thing_v2,
                    tenancy: &dx,
                },
                true,
            ),
            (
                &reader,
                Read {
                    type_: &other_kind,
                    tenancy: &dd,
                },
                false,
            ),
            (
                &reader,
                Read {
                    type_: &other_group,
                    tenancy: &dd,
                },
                false,
            ),
            (
                &reader,
                Read {
                    type_: &thing,
                    tenancy: &aw,
                },
                false,
            ),
            (
                &reader,
                Write {
                    type_: &thing,
                    tenancy: &dd,
                },
                false,
            ),
            (&reader, ListByOwner, true),
            (&reader, Admin(AdminOperation::Status), false),
            // Lists: refused only when disjoint from the scope.
            (
                &reader,
                List {
                    type_: &thing,
                    tenancy: &any,
                },
                true,
            ),
            (
                &reader,
                List {
                    type_: &thing,
                    tenancy: &dd,
                },
                true,
            ),
            (
                &reader,
                List {
                    type_: &thing,
                    tenancy: &aw,
                },
                false,
            ),
            (
                &reader,
                List {
                    type_: &thing,
                    tenancy: &a_any,
                },
                false,
            ),
            (
                &reader,
                List {
                    type_: &thing,
                    tenancy: &any_web,
                },
                true,
            ),
            (
                &reader,
                List {
                    type_: &other_kind,
                    tenancy: &any,
                },
                false,
            ),
            // Write implies read on the same scope, not beyond it.
            (
                &writer,
                Write {
                    type_: &thing,
                    tenancy: &aw,
                },
                true,
            ),
            (
                &writer,
                Write {
                    type_: &other_kind,
                    tenancy: &aw,
                },
                true,
            ),
            (
                &writer,
                Read {
                    type_: &other_kind,
                    tenancy: &aw,
                },
                true,
            ),
            (
                &writer,
                Write {
                    type_: &other_group,
                    tenancy: &aw,
                },
                false,
            ),
            (
                &writer,
                Write {
                    type_: &thing,
                    tenancy: &ax,
                },
                false,
            ),
            (
                &writer,
                Read {
                    type_: &thing,
                    tenancy: &ax,
                },
                false,
            ),
            (
                &writer,
                List {
                    type_: &thing,
                    tenancy: &a_any,
                },
                true,
            ),
            (
                &writer,
                List {
                    type_: &thing,
                    tenancy: &dd,
                },
                false,
            ),
            (&writer, Admin(AdminOperation::SaveSnapshot), false),
            // Admin: every admin operation, no data.
            (&admin, Admin(AdminOperation::TransferLeader), true),
            (&admin, Admin(AdminOperation::RestoreSnapshot), true),
            (
                &admin,
                Read {
                    type_: &thing,
                    tenancy: &dd,
                },
                false,
            ),
            (
                &admin,
                List {
                    type_: &thing,
                    tenancy: &any,
                },
                false,
            ),
            (&admin, ListByOwner, false),
            // Leases: for writers (and admins), never for a read-only grant.
            (&reader, Lease, false),
            (&writer, Lease, true),
            (&admin, Lease, true),
            (
                &everything,
                Write {
                    type_: &other_group,
                    tenancy: &ax,
                },
                true,
            ),
            (&everything, Admin(AdminOperation::AddLearner), true),
        ];
        for (caller, action, allowed) in rows {
            let decision = authorize(caller, &action);
            assert_eq!(
                decision.is_ok(),
                allowed,
                "{caller:?} {action:?}: {decision:?}"
            );
            if let Err(e) = decision {
                assert!(matches!(e, ApiError::PermissionDenied(_)), "{e:?}");
            }
        }
    }

    #[test]
    fn a_denial_names_the_missing_permission() {
        // The message names what was asked, in the form operators grant it.
        let reader = grant(scope(&["demo.Thing"], &["default/*"]), None, false);
        let e = authorize(
            &reader,
            &Action::Write {
                type_: &ty("demo", "v1", "Thing"),
                tenancy: &ten("default", "default"),
            },
        )
        .unwrap_err();
        assert_eq!(
            e,
            ApiError::PermissionDenied(
                "grant \"g\" lacks write on demo.v1.Thing in default/default".into()
            )
        );
        let e = authorize(&reader, &Action::Admin(AdminOperation::TriggerElection)).unwrap_err();
        assert!(e.to_string().contains("admin (for TriggerElection)"), "{e}");
    }

    #[test]
    fn visibility_shows_only_resources_inside_the_read_scope() {
        // What a list or a watch under a grant passes through.
        let reader = grant(
            scope(&["demo.Thing"], &["default/*"]),
            scope(&["ops.*"], &["*/web"]),
            false,
        );
        let Caller::Granted(g) = reader else {
            unreachable!()
        };
        let within = Visibility::Within(g);
        let resource = |t: Type, tn: Tenancy| {
            prost::Message::encode_to_vec(&Resource {
                id: Some(cairn_proto::v1::Id {
                    r#type: Some(t),
                    tenancy: Some(tn),
                    name: "n".into(),
                    uid: "u".into(),
                }),
                ..Default::default()
            })
        };
        assert!(within.shows(&resource(ty("demo", "v9", "Thing"), ten("default", "x"))));
        assert!(within.shows(&resource(ty("ops", "v1", "Any"), ten("p", "web"))));
        assert!(!within.shows(&resource(ty("demo", "v1", "Thing"), ten("other", "x"))));
        assert!(!within.shows(&resource(ty("ops", "v1", "Any"), ten("p", "db"))));
        assert!(!within.shows(&[]));
        assert!(
            !within.shows(&[0xff]),
            "bytes that do not parse are not shown"
        );
        assert!(Visibility::Everything.shows(&[]));
    }

    fn config(grants: Vec<GrantConfig>) -> AuthConfig {
        AuthConfig {
            grants,
            node_token_file: None,
        }
    }

    fn token_grant(name: &str, token: &str) -> GrantConfig {
        GrantConfig {
            name: name.into(),
            token_sha256: Some(token_sha256_hex(token)),
            read: scope(&["*"], &["*"]),
            ..Default::default()
        }
    }

    #[test]
    fn authentication_by_token_and_by_subject() {
        // Off without grants; with grants only a known token or subject passes.
        let off = GrantTable::from_config(&AuthConfig::default()).unwrap();
        assert!(!off.is_enabled());
        assert_eq!(off.authenticate(None, None), Ok(Caller::Unrestricted));

        let mut by_subject = token_grant("ops", "unused");
        by_subject.token_sha256 = None;
        by_subject.subject = Some("CN=ops".into());
        let auth = GrantTable::from_config(&config(vec![token_grant("app", "s3cret"), by_subject]))
            .unwrap();
        assert!(auth.is_enabled());
        assert_eq!(auth.grant_count(), 2);
        let name = |c: Result<Caller, ApiError>| match c {
            Ok(Caller::Granted(g)) => g.name.clone(),
            other => format!("{other:?}"),
        };
        assert_eq!(name(auth.authenticate(Some("Bearer s3cret"), None)), "app");
        assert_eq!(name(auth.authenticate(Some("bearer s3cret"), None)), "app");
        assert_eq!(name(auth.authenticate(None, Some("CN=ops"))), "ops");
        // A token decides alone, even next to a known certificate.
        for (header, subject) in [
            (Some("Bearer wrong"), Some("CN=ops")),
            (Some("Basic s3cret"), None),
            (Some("Bearer "), None),
            (Some("s3cret"), None),
            // What the client would never send: not a token by its rule.
            (Some("Bearer s3cret s3cret"), None),
            (Some("Bearer s3\u{1}cret"), None),
            (None, Some("CN=nobody")),
            (None, None),
        ] {
            assert!(
                matches!(
                    auth.authenticate(header, subject),
                    Err(ApiError::Unauthenticated(_))
                ),
                "{header:?} {subject:?}"
            );
        }
        // A token the client's rule refuses is refused as such, by the same rule.
        let long = format!(
            "Bearer {}",
            "x".repeat(cairn_client::BearerToken::LEN_MAX + 1)
        );
        for header in [long.as_str(), "Bearer s3\u{1}cret"] {
            let Err(ApiError::Unauthenticated(why)) = auth.authenticate(Some(header), None) else {
                panic!("{header:?} must be refused");
            };
            assert!(why.contains("printable ASCII without spaces"), "{why}");
        }
        assert!(!auth.token_is_admin("s3cret"));
    }

    #[test]
    fn config_mistakes_are_named() {
        // Each mistake an operator can make in [[auth.grants]] is refused at load.
        let ok = token_grant("app", "t");
        let cases: Vec<(GrantConfig, &str)> = vec![
            (
                GrantConfig {
                    name: "".into(),
                    ..ok.clone()
                },
                "`name` is empty",
            ),
            (
                GrantConfig {
                    token_sha256: None,
                    ..ok.clone()
                },
                "give `token_sha256`",
            ),
            (
                GrantConfig {
                    token_sha256: Some("t".into()),
                    ..ok.clone()
                },
                "64 hex digits",
            ),
            (
                GrantConfig {
                    read: None,
                    ..ok.clone()
                },
                "grants nothing",
            ),
            (
                GrantConfig {
                    read: scope(&[], &["*"]),
                    ..ok.clone()
                },
                "`types` is empty",
            ),
            (
                GrantConfig {
                    read: scope(&["*"], &[]),
                    ..ok.clone()
                },
                "`tenancies` is empty",
            ),
            (
                GrantConfig {
                    read: scope(&["Thing"], &["*"]),
                    ..ok.clone()
                },
                "expected group.kind",
            ),
            (
                GrantConfig {
                    read: scope(&["demo.v1.Thing"], &["*"]),
                    ..ok.clone()
                },
                "names a group version",
            ),
            (
                GrantConfig {
                    read: scope(&["demo.Th*"], &["*"]),
                    ..ok.clone()
                },
                "must stand alone",
            ),
            (
                GrantConfig {
                    read: scope(&["*"], &["default"]),
                    ..ok.clone()
                },
                "partition/namespace",
            ),
            (
                GrantConfig {
                    read: scope(&["*"], &["a/b/c"]),
                    ..ok.clone()
                },
                "partition/namespace",
            ),
            (
                GrantConfig {
                    read: scope(&["*"], &["de*/x"]),
                    ..ok.clone()
                },
                "must stand alone",
            ),
            (
                GrantConfig {
                    read: scope(&["*"], &["/x"]),
                    ..ok.clone()
                },
                "empty",
            ),
        ];
        for (g, expected) in cases {
            let e = GrantTable::from_config(&config(vec![g.clone()])).unwrap_err();
            let text = e.to_string();
            assert!(
                text.contains("auth.grants") && text.contains(expected),
                "{g:?}: {text}"
            );
        }
        let e = GrantTable::from_config(&config(vec![ok.clone(), ok.clone()])).unwrap_err();
        assert!(e.to_string().contains("another grant has this name"), "{e}");
        let twin = GrantConfig {
            name: "twin".into(),
            ..ok.clone()
        };
        let e = GrantTable::from_config(&config(vec![ok, twin])).unwrap_err();
        assert!(e.to_string().contains("same token_sha256"), "{e}");
    }

    #[test]
    fn generated_tokens_are_long_random_and_hash_to_64_hex_digits() {
        // Two tokens never repeat; the hash is the form the config takes.
        let a = new_token().unwrap();
        let b = new_token().unwrap();
        assert_ne!(a, b);
        assert!(a.starts_with("cairn-") && a.len() == 6 + 64, "{a}");
        assert!(cairn_client::BearerToken::new(a.clone()).is_ok());
        let hash = token_sha256_hex(&a);
        assert_eq!(hash.len(), 64);
        assert_eq!(
            token_sha256_hex("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn a_reload_replaces_the_grants_whole_or_not_at_all() {
        // Changed grants replace the table; the same grants are no change;
        // a mistake or a config without grants leaves the table in force.
        let auth = Authenticator::from_config(&config(vec![token_grant("app", "a")])).unwrap();
        assert!(!auth.reload(&config(vec![token_grant("app", "a")])).unwrap());
        let both = config(vec![token_grant("app", "a"), token_grant("ci", "c")]);
        assert!(auth.reload(&both).unwrap());
        assert_eq!(auth.current().grant_count(), 2);
        let mut bad = token_grant("broken", "b");
        bad.token_sha256 = Some("not a hash".into());
        assert!(auth.reload(&config(vec![bad])).is_err());
        let e = auth.reload(&AuthConfig::default()).unwrap_err();
        assert!(
            e.to_string().contains("never turns authentication off"),
            "{e}"
        );
        assert_eq!(auth.current().grant_count(), 2, "the grants in force stay");
        // From no grants to some is allowed (authentication turned on).
        let open = Authenticator::from_config(&AuthConfig::default()).unwrap();
        assert!(open.reload(&both).unwrap());
        assert!(open.current().is_enabled());
    }

    fn watch_request(token: &str) -> tonic::Request<()> {
        let mut request = tonic::Request::new(());
        request
            .metadata_mut()
            .insert("authorization", format!("Bearer {token}").parse().unwrap());
        request
    }

    /// What `guard.revoked()` resolves to within 100 ms, if anything.
    async fn revoked_soon(guard: WatchGuard) -> Option<ApiError> {
        tokio::time::timeout(std::time::Duration::from_millis(100), guard.revoked())
            .await
            .ok()
    }

    #[tokio::test]
    async fn a_watch_ends_when_a_reload_changes_its_callers_grant() {
        // Unchanged grant: the watch goes on. Grant changed but still
        // allowing the watch: WatchClosed. Grant gone: UNAUTHENTICATED.
        // Grant that no longer covers the watch: PERMISSION_DENIED.
        let thing = ty("demo", "v1", "Thing");
        let everywhere = ten("*", "*");
        let reader = |name: &str, token: &str, tenancies: &[&str]| GrantConfig {
            name: name.into(),
            token_sha256: Some(token_sha256_hex(token)),
            read: scope(&["demo.*"], tenancies),
            ..Default::default()
        };
        let first = config(vec![
            reader("kept", "k", &["*"]),
            reader("narrowed", "n", &["*"]),
            reader("gone", "g", &["*"]),
            reader("moved", "m", &["*"]),
        ]);
        let auth = Arc::new(Authenticator::from_config(&first).unwrap());
        let guard = |token: &str| {
            auth.watch_caller(&watch_request(token))
                .and_then(|caller| caller.authorize(&thing, &everywhere))
                .unwrap()
        };
        let (kept, narrowed, gone, moved) = (guard("k"), guard("n"), guard("g"), guard("m"));
        let mut ops = token_grant("ops", "o");
        ops.admin = true;
        assert!(auth
            .reload(&config(vec![
                reader("kept", "k", &["*"]),
                reader("narrowed", "n", &["default/*"]),
                GrantConfig {
                    read: scope(&["other.*"], &["*"]),
                    ..reader("moved", "m", &["*"])
                },
                ops,
            ]))
            .unwrap());
        assert_eq!(revoked_soon(kept).await, None);
        assert!(matches!(
            revoked_soon(narrowed).await,
            Some(ApiError::WatchClosed(_))
        ));
        assert!(matches!(
            revoked_soon(gone).await,
            Some(ApiError::Unauthenticated(_))
        ));
        assert!(matches!(
            revoked_soon(moved).await,
            Some(ApiError::PermissionDenied(_))
        ));
    }
}
