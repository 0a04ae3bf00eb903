//! Limits and input validation.
//!
//! The node calls these with its configured [`Limits`] before proposing or
//! serving a request. The store calls them again on every applied command,
//! restored resource and snapshot record, but against the fixed hard bounds
//! ([`Limits::applied`]: the `*_HARD_MAX` constants, the largest values a
//! node may configure), never against this node's configured limits: nodes
//! may be configured differently (or a limit lowered before a restart), and
//! a committed entry must apply the same way on every replica, or their
//! state machines diverge. So the table never holds a resource beyond the
//! hard bounds, and a resource over a configured limit is refused before it
//! is proposed.

use cairn_proto::v1::{Id, Resource, Tenancy, Type};
use prost::Message;

use crate::FsmError;

/// Bounds on what the store accepts and retains.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Maximum encoded size of one resource.
    pub resource_bytes_max: usize,
    /// Maximum size of every identifier string (group, group version, kind,
    /// partition, namespace, name, uid, version, list prefix).
    pub name_bytes_max: usize,
    /// How many changes the history keeps for past reads and watch replays.
    pub history_changes_max: usize,
    /// How many bytes of resources the table no longer holds the history may keep (the
    /// older images of changed and deleted resources); the oldest changes go first, and
    /// the newest is always kept.
    pub history_bytes_max: usize,
    /// Capacity of each watch's buffer of live events; a watch whose buffer
    /// is full when an event arrives is closed as lagging.
    pub watch_buffer_events: usize,
    /// Most metadata entries on one resource.
    pub metadata_entries_max: usize,
    /// Most resources one owner lookup (ListByOwner) answers (enforced by
    /// the node's executor with [`crate::View::list_by_owner_at_most`]).
    /// Lists are paged instead ([`Limits::list_page_size_max`]).
    pub list_results_max: usize,
    /// Most resources in one page of a List, whatever the request's `limit`
    /// ([`crate::PageBounds::for_request`]).
    pub list_page_size_max: usize,
    /// Most status conditions on one resource, over all its status entries.
    pub status_conditions_max: usize,
    /// Bytes of live events one watch may hold unread; a watch that would go
    /// over is closed as lagging.
    pub watch_buffer_bytes_max: usize,
    /// Bytes of live events all watches together may hold unread; the watch
    /// whose event would go over is closed as lagging.
    pub watch_buffers_bytes_max: usize,
    /// The shortest and longest TTL a lease may be granted ([`crate::lease`]).
    pub lease_ttl_min_ms: u64,
    pub lease_ttl_max_ms: u64,
    /// Most leases that may exist at once.
    pub leases_max: usize,
}

/// The largest `resource_bytes_max` a node may configure, and the bound on
/// every resource applied.
pub const RESOURCE_BYTES_HARD_MAX: usize = 16 * 1024 * 1024;
/// The largest `name_bytes_max`, and the bound on every applied identifier.
pub const NAME_BYTES_HARD_MAX: usize = 4096;
/// The largest `metadata_entries_max`, and the bound at apply.
pub const METADATA_ENTRIES_HARD_MAX: usize = 100_000;
/// The largest `status_conditions_max`, and the bound at apply.
pub const STATUS_CONDITIONS_HARD_MAX: usize = 100_000;

impl Limits {
    /// The limits committed entries, restore chunks and snapshot records are
    /// checked against when applied: these limits with every bound on what
    /// is stored replaced by its fixed hard maximum, the same on every
    /// replica whatever its configuration. (The limits on lists, history and
    /// watch buffers are this node's own: they never change what is stored.)
    pub fn applied(&self) -> Limits {
        Limits {
            resource_bytes_max: RESOURCE_BYTES_HARD_MAX,
            name_bytes_max: NAME_BYTES_HARD_MAX,
            metadata_entries_max: METADATA_ENTRIES_HARD_MAX,
            status_conditions_max: STATUS_CONDITIONS_HARD_MAX,
            lease_ttl_min_ms: 1,
            lease_ttl_max_ms: crate::lease::LEASE_TTL_HARD_MAX_MS,
            leases_max: crate::lease::LEASES_HARD_MAX,
            ..self.clone()
        }
    }
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            resource_bytes_max: 1024 * 1024,
            name_bytes_max: 256,
            history_changes_max: 10_000,
            history_bytes_max: 256 * 1024 * 1024,
            watch_buffer_events: 4096,
            metadata_entries_max: 64,
            list_results_max: 100_000,
            list_page_size_max: 1000,
            status_conditions_max: 64,
            watch_buffer_bytes_max: 8 * 1024 * 1024,
            watch_buffers_bytes_max: 512 * 1024 * 1024,
            lease_ttl_min_ms: 1_000,
            lease_ttl_max_ms: 24 * 60 * 60 * 1000,
            leases_max: crate::lease::LEASES_HARD_MAX,
        }
    }
}

/// A field's dotted name, built only when a check fails: validation runs
/// several times on every write (before proposal and at apply on every
/// node), so the passing path allocates nothing.
#[derive(Clone, Copy)]
struct Field<'a> {
    parent: Option<&'a Field<'a>>,
    name: &'a str,
}

impl<'a> Field<'a> {
    fn root(name: &'a str) -> Field<'a> {
        Field { parent: None, name }
    }

    fn child(&'a self, name: &'a str) -> Field<'a> {
        Field {
            parent: Some(self),
            name,
        }
    }

    fn path(&self) -> String {
        match self.parent {
            Some(parent) => format!("{}.{}", parent.path(), self.name),
            None => self.name.to_string(),
        }
    }

    fn invalid(&self, reason: impl Into<String>) -> FsmError {
        FsmError::invalid(self.path(), reason)
    }
}

/// Checks one identifier-like string: bounded, no control characters (they
/// are also the separators of the internal keys), optionally non-empty, and
/// optionally without `*`.
fn check_text(
    field: Field<'_>,
    value: &str,
    required: bool,
    star_allowed: bool,
    limits: &Limits,
) -> Result<(), FsmError> {
    text_problem(value, required, star_allowed, limits).map_err(|reason| field.invalid(reason))
}

/// What is wrong with an identifier-like string (see [`check_text`]), if anything.
fn text_problem(
    value: &str,
    required: bool,
    star_allowed: bool,
    limits: &Limits,
) -> Result<(), String> {
    if required && value.is_empty() {
        return Err("must not be empty".into());
    }
    if value.len() > limits.name_bytes_max {
        return Err(format!(
            "is {} bytes, more than the limit name_bytes_max = {}",
            value.len(),
            limits.name_bytes_max
        ));
    }
    if value.chars().any(char::is_control) {
        return Err("must not contain control characters".into());
    }
    if !star_allowed && value.contains('*') {
        return Err("must not contain '*'".into());
    }
    Ok(())
}

/// In a list or watch, a tenancy field is either exactly `*` or a literal
/// without `*`.
fn check_tenancy_pattern(field: &str, value: &str, limits: &Limits) -> Result<(), FsmError> {
    if value == "*" {
        return Ok(());
    }
    check_text(Field::root(field), value, false, true, limits)?;
    if value.contains('*') {
        return Err(FsmError::invalid(field, "'*' must stand alone"));
    }
    Ok(())
}

fn check_type(field: Field<'_>, type_: Option<&Type>, limits: &Limits) -> Result<(), FsmError> {
    let Some(t) = type_ else {
        return Err(field.invalid("is required"));
    };
    check_text(field.child("group"), &t.group, true, false, limits)?;
    check_text(
        field.child("group_version"),
        &t.group_version,
        false,
        false,
        limits,
    )?;
    check_text(field.child("kind"), &t.kind, true, false, limits)?;
    Ok(())
}

fn check_tenancy(
    field: Field<'_>,
    tenancy: Option<&Tenancy>,
    limits: &Limits,
) -> Result<(), FsmError> {
    // An absent tenancy is the empty one ("" partition, "" namespace).
    if let Some(t) = tenancy {
        check_text(field.child("partition"), &t.partition, false, false, limits)?;
        check_text(field.child("namespace"), &t.namespace, false, false, limits)?;
    }
    Ok(())
}

/// Validates an id used to read or delete (`field` is its name, e.g. `id`):
/// the name, group and kind are required; the group version may be empty
/// (deletes ignore it; a read with a different one gets GroupVersionMismatch);
/// every string is bounded and free of control characters and `*`.
pub fn validate_id(field: &str, id: &Id, limits: &Limits) -> Result<(), FsmError> {
    check_id(Field::root(field), id, limits)
}

fn check_id(field: Field<'_>, id: &Id, limits: &Limits) -> Result<(), FsmError> {
    check_text(field.child("uid"), &id.uid, false, false, limits)?;
    check_text(field.child("name"), &id.name, true, false, limits)?;
    check_type(field.child("type"), id.r#type.as_ref(), limits)?;
    check_tenancy(field.child("tenancy"), id.tenancy.as_ref(), limits)?;
    Ok(())
}

/// Validates a fence ([`crate::Command::Fenced`]): an election named (type, tenancy, name,
/// as an id is; no section) and a token that is not 0. Returns the election's id (no uid).
/// Whether the fence holds is decided at apply.
pub fn validate_fence(fence: &cairn_proto::v1::Fence, limits: &Limits) -> Result<Id, FsmError> {
    let Some(election) = fence.election.as_ref() else {
        return Err(FsmError::invalid("fence.election", "is required"));
    };
    if !election.section.is_empty() {
        return Err(FsmError::invalid(
            "fence.election.section",
            "must be empty: a fence names a whole resource",
        ));
    }
    if fence.token == 0 {
        return Err(FsmError::invalid(
            "fence.token",
            "must not be 0 (it is the version the election was won at)",
        ));
    }
    let id = Id {
        uid: String::new(),
        name: election.name.clone(),
        r#type: election.r#type.clone(),
        tenancy: election.tenancy.clone(),
    };
    validate_id("fence.election", &id, limits)?;
    Ok(id)
}

/// Validates a status write ([`crate::Command::WriteStatus`]): the id as [`validate_id`]
/// with its uid required (a status is about one lifetime), the key required, bounded and
/// free of control characters as a written resource's status keys are, the expected
/// version (empty: any), and the status itself, bounded as one entry of a written
/// resource's status map is.
pub fn validate_write_status(
    id: &Id,
    key: &str,
    status: &cairn_proto::v1::Status,
    version: &str,
    limits: &Limits,
) -> Result<(), FsmError> {
    validate_id("id", id, limits)?;
    if id.uid.is_empty() {
        return Err(FsmError::invalid(
            "id.uid",
            "must be given: a status is written to one lifetime of a resource",
        ));
    }
    check_text(Field::root("key"), key, true, true, limits)?;
    check_text(Field::root("version"), version, false, false, limits)?;
    let size_bytes = status.encoded_len();
    if size_bytes > limits.resource_bytes_max {
        return Err(FsmError::invalid(
            "status",
            format!(
                "encodes to {size_bytes} bytes, more than the limit resource_bytes_max = {}",
                limits.resource_bytes_max
            ),
        ));
    }
    if status.conditions.len() > limits.status_conditions_max {
        return Err(FsmError::invalid(
            "status.conditions",
            format!(
                "holds {} conditions, more than the limit status_conditions_max = {}",
                status.conditions.len(),
                limits.status_conditions_max
            ),
        ));
    }
    for condition in &status.conditions {
        text_problem(&condition.r#type, false, true, limits)
            .map_err(|reason| FsmError::invalid("status.conditions.type", reason))?;
    }
    Ok(())
}

/// Validates a resource to be written: its id as [`validate_id`] plus a
/// non-empty group version, the owner id if any, the expected version, and
/// its encoded size.
pub fn validate_write(resource: &Resource, limits: &Limits) -> Result<(), FsmError> {
    let Some(id) = resource.id.as_ref() else {
        return Err(FsmError::invalid("resource.id", "is required"));
    };
    validate_id("resource.id", id, limits)?;
    if id
        .r#type
        .as_ref()
        .is_some_and(|t| t.group_version.is_empty())
    {
        return Err(FsmError::invalid(
            "resource.id.type.group_version",
            "must not be empty",
        ));
    }
    if let Some(owner) = resource.owner.as_ref() {
        validate_id("resource.owner", owner, limits)?;
    }
    check_text(
        Field::root("resource.version"),
        &resource.version,
        false,
        false,
        limits,
    )?;
    // The size first: every later check walks the resource.
    let size_bytes = resource.encoded_len();
    if size_bytes > limits.resource_bytes_max {
        return Err(FsmError::invalid(
            "resource",
            format!(
                "encodes to {size_bytes} bytes, more than the limit resource_bytes_max = {}",
                limits.resource_bytes_max
            ),
        ));
    }
    check_text(
        Field::root("resource.generation"),
        &resource.generation,
        false,
        true,
        limits,
    )?;
    if resource.metadata.len() > limits.metadata_entries_max {
        return Err(FsmError::invalid(
            "resource.metadata",
            format!(
                "has {} entries, more than the limit metadata_entries_max = {}",
                resource.metadata.len(),
                limits.metadata_entries_max
            ),
        ));
    }
    for key in resource.metadata.keys() {
        check_text(
            Field::root("resource.metadata key"),
            key,
            false,
            true,
            limits,
        )?;
    }
    let conditions: usize = resource.status.values().map(|s| s.conditions.len()).sum();
    if conditions > limits.status_conditions_max {
        return Err(FsmError::invalid(
            "resource.status",
            format!(
                "holds {conditions} conditions, more than the limit status_conditions_max = {}",
                limits.status_conditions_max
            ),
        ));
    }
    // A status entry without conditions still counts as one, so that the
    // map itself is bounded too.
    if resource.status.len() > limits.status_conditions_max.max(1) {
        return Err(FsmError::invalid(
            "resource.status",
            format!(
                "has {} entries, more than the limit status_conditions_max = {}",
                resource.status.len(),
                limits.status_conditions_max
            ),
        ));
    }
    for (key, status) in &resource.status {
        check_text(Field::root("resource.status key"), key, false, true, limits)?;
        for condition in &status.conditions {
            text_problem(&condition.r#type, false, true, limits).map_err(|reason| {
                FsmError::invalid(format!("resource.status[{key}].conditions.type"), reason)
            })?;
        }
    }
    Ok(())
}

/// Validates the arguments of a list or watch: group and kind required (the
/// group version is ignored), each tenancy field either `*` or a literal, and a
/// bounded name prefix.
pub fn validate_list(
    type_: &Type,
    tenancy: &Tenancy,
    name_prefix: &str,
    limits: &Limits,
) -> Result<(), FsmError> {
    check_text(Field::root("type.group"), &type_.group, true, false, limits)?;
    check_text(Field::root("type.kind"), &type_.kind, true, false, limits)?;
    check_tenancy_pattern("tenancy.partition", &tenancy.partition, limits)?;
    check_tenancy_pattern("tenancy.namespace", &tenancy.namespace, limits)?;
    check_text(
        Field::root("name_prefix"),
        name_prefix,
        false,
        false,
        limits,
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id() -> Id {
        Id {
            uid: "u".into(),
            name: "n".into(),
            r#type: Some(Type {
                group: "g".into(),
                group_version: "v1".into(),
                kind: "k".into(),
            }),
            tenancy: Some(Tenancy {
                partition: "p".into(),
                namespace: "ns".into(),
            }),
        }
    }

    fn field_of(r: Result<(), FsmError>) -> String {
        match r {
            Err(FsmError::InvalidArgument { field, .. }) => field,
            other => panic!("expected InvalidArgument, got {other:?}"),
        }
    }

    #[test]
    fn a_valid_write_passes() {
        // The reference resource is accepted, with or without tenancy and owner.
        let limits = Limits::default();
        let mut r = Resource {
            id: Some(id()),
            owner: Some(Box::new(id())),
            ..Default::default()
        };
        assert_eq!(validate_write(&r, &limits), Ok(()));
        if let Some(i) = r.id.as_mut() {
            i.tenancy = None;
        }
        assert_eq!(validate_write(&r, &limits), Ok(()));
    }

    #[test]
    fn each_write_rule_names_its_field() {
        // Every rule rejects with InvalidArgument naming the offending field.
        let limits = Limits::default();
        let with = |f: &dyn Fn(&mut Resource)| {
            let mut r = Resource {
                id: Some(id()),
                ..Default::default()
            };
            f(&mut r);
            field_of(validate_write(&r, &limits))
        };
        assert_eq!(with(&|r| r.id = None), "resource.id");
        assert_eq!(
            with(&|r| r.id.as_mut().unwrap().name.clear()),
            "resource.id.name"
        );
        assert_eq!(
            with(&|r| r.id.as_mut().unwrap().r#type = None),
            "resource.id.type"
        );
        assert_eq!(
            with(&|r| r
                .id
                .as_mut()
                .unwrap()
                .r#type
                .as_mut()
                .unwrap()
                .group
                .clear()),
            "resource.id.type.group"
        );
        assert_eq!(
            with(&|r| r.id.as_mut().unwrap().r#type.as_mut().unwrap().kind.clear()),
            "resource.id.type.kind"
        );
        assert_eq!(
            with(&|r| r
                .id
                .as_mut()
                .unwrap()
                .r#type
                .as_mut()
                .unwrap()
                .group_version
                .clear()),
            "resource.id.type.group_version"
        );
        assert_eq!(
            with(&|r| r.id.as_mut().unwrap().tenancy.as_mut().unwrap().partition = "*".into()),
            "resource.id.tenancy.partition"
        );
        assert_eq!(
            with(&|r| r.id.as_mut().unwrap().tenancy.as_mut().unwrap().namespace = "a*".into()),
            "resource.id.tenancy.namespace"
        );
        assert_eq!(
            with(&|r| r.id.as_mut().unwrap().name = "a\0b".into()),
            "resource.id.name"
        );
        assert_eq!(
            with(&|r| r.id.as_mut().unwrap().uid = "x\n".into()),
            "resource.id.uid"
        );
        assert_eq!(
            with(&|r| r.id.as_mut().unwrap().name = "x".repeat(257)),
            "resource.id.name"
        );
        assert_eq!(
            with(&|r| r.owner = Some(Box::default())),
            "resource.owner.name"
        );
        assert_eq!(with(&|r| r.version = "\u{7f}".into()), "resource.version");
        assert_eq!(
            with(&|r| {
                r.metadata.insert("big".into(), "x".repeat(1024 * 1024));
            }),
            "resource"
        );
    }

    #[test]
    fn ids_may_have_an_empty_group_version_but_not_an_empty_kind() {
        // validate_id leaves the group version to the read rules.
        let limits = Limits::default();
        let mut i = id();
        i.r#type.as_mut().unwrap().group_version.clear();
        assert_eq!(validate_id("id", &i, &limits), Ok(()));
        i.r#type.as_mut().unwrap().kind.clear();
        assert_eq!(field_of(validate_id("id", &i, &limits)), "id.type.kind");
    }

    #[test]
    fn list_tenancy_fields_are_a_lone_star_or_a_literal() {
        // "*" is the wildcard; a '*' inside a value and a missing kind are rejected.
        let limits = Limits::default();
        let t = Type {
            group: "g".into(),
            group_version: String::new(),
            kind: "k".into(),
        };
        let ten = |p: &str, n: &str| Tenancy {
            partition: p.into(),
            namespace: n.into(),
        };
        assert_eq!(validate_list(&t, &ten("*", "*"), "", &limits), Ok(()));
        assert_eq!(validate_list(&t, &ten("", ""), "a", &limits), Ok(()));
        assert_eq!(
            field_of(validate_list(&t, &ten("a*", ""), "", &limits)),
            "tenancy.partition"
        );
        assert_eq!(
            field_of(validate_list(&t, &ten("", "**"), "", &limits)),
            "tenancy.namespace"
        );
        assert_eq!(
            field_of(validate_list(&t, &ten("", ""), "a\tb", &limits)),
            "name_prefix"
        );
        let mut no_kind = t.clone();
        no_kind.kind.clear();
        assert_eq!(
            field_of(validate_list(&no_kind, &ten("", ""), "", &limits)),
            "type.kind"
        );
    }
}
