//! Read scopes: which stored resources a caller may see.
//!
//! A [`Scope`] is every type matching one of its type patterns (`*`,
//! `group.*`, `group.kind`; never a group version) in every tenancy matching
//! one of its tenancy patterns (`*`, `partition/namespace`, either part `*`).
//! A [`ReadScope`] is the union of scopes a caller may read. The node's
//! `[auth]` grants are written in these patterns; a follower sends a
//! client's read scope with a forwarded strong list (`cairn.v1.ReadScope`),
//! so that the leader lists, and counts against the page's bounds, only
//! what that client may see.
//!
//! Scopes ignore the group version: a scope on `demo.Thing` covers every
//! version, so the answers that carry a stored resource of another version
//! (GroupVersionMismatch) stay inside it.

use cairn_proto::error::ApiError;
use cairn_proto::v1::{self as pb, Tenancy, Type};

use crate::{ResourceHead, StoredResource, TenancyHead, TypeHead};

/// One part of a tenancy pattern: `*` or a literal.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Any,
    Is(String),
}

impl Part {
    fn parse(value: &str) -> Result<Part, String> {
        match value {
            "*" => Ok(Part::Any),
            "" => Err("a tenancy part is empty".into()),
            v if v.contains('*') => Err(format!("{v:?}: '*' must stand alone")),
            v if v.chars().any(char::is_control) => Err(format!("{v:?} holds a control character")),
            v => Ok(Part::Is(v.to_string())),
        }
    }

    /// Whether a stored resource's `value` matches.
    fn matches(&self, value: &str) -> bool {
        match self {
            Part::Any => true,
            Part::Is(literal) => literal == value,
        }
    }

    /// Whether some value matches both this and a request's part (which
    /// may be `*`).
    fn overlaps(&self, requested: &str) -> bool {
        match self {
            Part::Any => true,
            Part::Is(literal) => requested == "*" || literal == requested,
        }
    }
}

/// A type pattern: `*`, `group.*` or `group.kind` (never a version).
#[derive(Debug, Clone, PartialEq, Eq)]
enum TypePattern {
    Any,
    Group(String),
    Kind { group: String, kind: String },
}

/// Whether a segment looks like a group version (`v1`, `v2beta1`).
fn looks_like_version(segment: &str) -> bool {
    let mut chars = segment.chars();
    chars.next() == Some('v') && chars.next().is_some_and(|c| c.is_ascii_digit())
}

impl TypePattern {
    fn parse(value: &str) -> Result<TypePattern, String> {
        if value == "*" {
            return Ok(TypePattern::Any);
        }
        let Some((group, kind)) = value.rsplit_once('.') else {
            return Err(format!("{value:?}: expected group.kind, group.* or *"));
        };
        if group.is_empty() || kind.is_empty() || group.contains('*') {
            return Err(format!("{value:?}: expected group.kind, group.* or *"));
        }
        if let Some((_, last)) = group.rsplit_once('.') {
            if looks_like_version(last) {
                return Err(format!(
                    "{value:?} names a group version: a grant covers every version of a type, \
                     write it as group.kind"
                ));
            }
        }
        match kind {
            "*" => Ok(TypePattern::Group(group.to_string())),
            k if k.contains('*') => Err(format!("{value:?}: '*' must stand alone")),
            k => Ok(TypePattern::Kind {
                group: group.to_string(),
                kind: k.to_string(),
            }),
        }
    }

    /// Group and kind decide; the group version never does.
    fn matches(&self, type_: &TypeHead<'_>) -> bool {
        match self {
            TypePattern::Any => true,
            TypePattern::Group(group) => *group == type_.group,
            TypePattern::Kind { group, kind } => *group == type_.group && *kind == type_.kind,
        }
    }
}

/// A tenancy pattern: `partition/namespace`, each part `*` or a literal.
#[derive(Debug, Clone, PartialEq, Eq)]
struct TenancyPattern {
    partition: Part,
    namespace: Part,
}

impl TenancyPattern {
    fn parse(value: &str) -> Result<TenancyPattern, String> {
        if value == "*" {
            return Ok(TenancyPattern {
                partition: Part::Any,
                namespace: Part::Any,
            });
        }
        let Some((partition, namespace)) = value.split_once('/') else {
            return Err(format!("{value:?}: expected partition/namespace or *"));
        };
        if namespace.contains('/') {
            return Err(format!("{value:?}: expected partition/namespace or *"));
        }
        Ok(TenancyPattern {
            partition: Part::parse(partition).map_err(|e| format!("{value:?}: {e}"))?,
            namespace: Part::parse(namespace).map_err(|e| format!("{value:?}: {e}"))?,
        })
    }

    fn matches(&self, tenancy: &TenancyHead<'_>) -> bool {
        self.partition.matches(tenancy.partition) && self.namespace.matches(tenancy.namespace)
    }

    fn overlaps(&self, requested: &Tenancy) -> bool {
        self.partition.overlaps(&requested.partition)
            && self.namespace.overlaps(&requested.namespace)
    }
}

/// Every type matching one of `types` in every tenancy matching one of
/// `tenancies`; it keeps the patterns as written, to send them on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scope {
    types: Vec<TypePattern>,
    tenancies: Vec<TenancyPattern>,
    written: pb::ScopePatterns,
}

impl Scope {
    /// Parses the patterns; an error says which one is wrong and why.
    pub fn parse(types: &[String], tenancies: &[String]) -> Result<Scope, String> {
        if types.is_empty() {
            return Err("`types` is empty (use [\"*\"] for every type)".into());
        }
        if tenancies.is_empty() {
            return Err("`tenancies` is empty (use [\"*\"] for every tenancy)".into());
        }
        Ok(Scope {
            types: types
                .iter()
                .map(|t| TypePattern::parse(t))
                .collect::<Result<_, _>>()?,
            tenancies: tenancies
                .iter()
                .map(|t| TenancyPattern::parse(t))
                .collect::<Result<_, _>>()?,
            written: pb::ScopePatterns {
                types: types.to_vec(),
                tenancies: tenancies.to_vec(),
            },
        })
    }

    pub fn contains(&self, type_: &TypeHead<'_>, tenancy: &TenancyHead<'_>) -> bool {
        self.types.iter().any(|p| p.matches(type_))
            && self.tenancies.iter().any(|p| p.matches(tenancy))
    }

    /// Whether some resource of `type_` in a tenancy matching the request's
    /// (possibly wildcard) `tenancy` lies inside.
    pub fn overlaps(&self, type_: &Type, tenancy: &Tenancy) -> bool {
        self.types.iter().any(|p| p.matches(&type_.into()))
            && self.tenancies.iter().any(|p| p.overlaps(tenancy))
    }
}

/// The union of the scopes a caller may read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadScope {
    any_of: Vec<Scope>,
}

/// Scopes a forwarded list may carry, and patterns per scope: far more than
/// any grant needs, small enough that parsing one is cheap.
pub const READ_SCOPE_SCOPES_MAX: usize = 16;
pub const READ_SCOPE_PATTERNS_MAX: usize = 256;

impl ReadScope {
    pub fn new(any_of: Vec<Scope>) -> ReadScope {
        ReadScope { any_of }
    }

    /// Whether a resource of this type in this tenancy may be seen.
    pub fn contains(&self, type_: &TypeHead<'_>, tenancy: &TenancyHead<'_>) -> bool {
        self.any_of.iter().any(|s| s.contains(type_, tenancy))
    }

    /// Whether the resource `encoded` (a `cairn.v1.Resource`, as stored and
    /// sent) may be seen. Its type and tenancy are read from the bytes
    /// ([`ResourceHead::parse`]); a resource without an id, type or
    /// tenancy, or whose bytes do not parse, is never shown.
    pub fn shows(&self, encoded: &[u8]) -> bool {
        ResourceHead::parse(encoded)
            .ok()
            .and_then(|head| Some((head.type_?, head.tenancy?)))
            .is_some_and(|(type_, tenancy)| self.contains(&type_, &tenancy))
    }

    /// [`ReadScope::shows`] of a stored resource.
    pub fn shows_resource(&self, resource: &StoredResource) -> bool {
        self.shows(resource.encoded())
    }

    /// The scope as a forwarded list carries it.
    pub fn to_wire(&self) -> pb::ReadScope {
        pb::ReadScope {
            any_of: self.any_of.iter().map(|s| s.written.clone()).collect(),
        }
    }

    /// The scope a forwarded list carries, bounded and parsed as the
    /// node's grants are; an error is InvalidArgument on `read_scope`.
    pub fn from_wire(wire: &pb::ReadScope) -> Result<ReadScope, ApiError> {
        let invalid = |reason: String| ApiError::invalid("read_scope", reason);
        if wire.any_of.len() > READ_SCOPE_SCOPES_MAX {
            return Err(invalid(format!(
                "{} scopes, more than {READ_SCOPE_SCOPES_MAX}",
                wire.any_of.len()
            )));
        }
        let any_of = wire
            .any_of
            .iter()
            .map(|s| {
                let patterns = s.types.len() + s.tenancies.len();
                if patterns > READ_SCOPE_PATTERNS_MAX {
                    return Err(invalid(format!(
                        "a scope of {patterns} patterns, more than {READ_SCOPE_PATTERNS_MAX}"
                    )));
                }
                Scope::parse(&s.types, &s.tenancies).map_err(invalid)
            })
            .collect::<Result<_, _>>()?;
        Ok(ReadScope { any_of })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(values: &[&str]) -> Vec<String> {
        values.iter().map(|v| v.to_string()).collect()
    }

    fn scope(types: &[&str], tenancies: &[&str]) -> Scope {
        Scope::parse(&strings(types), &strings(tenancies)).unwrap()
    }

    #[test]
    fn a_read_scope_survives_the_forwarding_hop_unchanged() {
        let sent = ReadScope::new(vec![
            scope(&["demo.Thing"], &["default/*"]),
            scope(&["other.*"], &["team-a/web", "*"]),
        ]);
        let received = ReadScope::from_wire(&sent.to_wire()).unwrap();
        assert_eq!(received, sent);
        let thing = TypeHead {
            group: "demo",
            group_version: "v2",
            kind: "Thing",
        };
        let default = TenancyHead {
            partition: "default",
            namespace: "x",
        };
        assert!(received.contains(&thing, &default));
        assert!(!received.contains(
            &thing,
            &TenancyHead {
                partition: "other",
                namespace: "x"
            }
        ));
    }

    #[test]
    fn a_malformed_or_oversized_wire_scope_is_refused_naming_the_field() {
        let patterns = |types: Vec<String>| pb::ReadScope {
            any_of: vec![pb::ScopePatterns {
                types,
                tenancies: strings(&["*"]),
            }],
        };
        let too_many_scopes = pb::ReadScope {
            any_of: vec![patterns(strings(&["*"])).any_of[0].clone(); READ_SCOPE_SCOPES_MAX + 1],
        };
        for wire in [
            patterns(strings(&["demo.v1.Thing"])),
            patterns(Vec::new()),
            patterns(vec!["a.b".to_string(); READ_SCOPE_PATTERNS_MAX]),
            too_many_scopes,
        ] {
            match ReadScope::from_wire(&wire) {
                Err(ApiError::InvalidArgument { field, .. }) => assert_eq!(field, "read_scope"),
                other => panic!("expected InvalidArgument on read_scope, got {other:?}"),
            }
        }
    }
}
