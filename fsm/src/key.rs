//! Internal keys: one string per entry, fields joined by NUL.
//!
//! Validation forbids control characters in every field, so NUL never occurs
//! inside a field and byte order on the joined string equals the lexicographic
//! order on the tuple of fields. A key is an `Arc<str>`: cloning it (as the
//! persistent maps do when they copy a node) is a reference-count increment.

use std::sync::Arc;

use cairn_proto::v1::{Id, Resource, Tenancy, Type};

pub(crate) type Key = Arc<str>;

pub(crate) const SEPARATOR: char = '\0';

fn type_of(id: &Id) -> (&str, &str, &str) {
    id.r#type
        .as_ref()
        .map(|t| (t.group.as_str(), t.group_version.as_str(), t.kind.as_str()))
        .unwrap_or(("", "", ""))
}

fn tenancy_of(id: &Id) -> (&str, &str) {
    id.tenancy
        .as_ref()
        .map(|t| (t.partition.as_str(), t.namespace.as_str()))
        .unwrap_or(("", ""))
}

/// The parts of a stored resource's id. Stored resources passed validation,
/// so the id is present; an absent one would read as all-empty.
pub(crate) struct IdParts<'a> {
    pub uid: &'a str,
    pub name: &'a str,
    pub group: &'a str,
    pub group_version: &'a str,
    pub kind: &'a str,
    pub partition: &'a str,
    pub namespace: &'a str,
}

pub(crate) fn parts(id: Option<&Id>) -> IdParts<'_> {
    match id {
        Some(id) => {
            let (group, group_version, kind) = type_of(id);
            let (partition, namespace) = tenancy_of(id);
            IdParts {
                uid: &id.uid,
                name: &id.name,
                group,
                group_version,
                kind,
                partition,
                namespace,
            }
        }
        None => IdParts {
            uid: "",
            name: "",
            group: "",
            group_version: "",
            kind: "",
            partition: "",
            namespace: "",
        },
    }
}

pub(crate) fn resource_parts(resource: &Resource) -> IdParts<'_> {
    parts(resource.id.as_ref())
}

fn join(fields: &[&str], trailing_separator: bool) -> String {
    let len_bytes: usize = fields.iter().map(|f| f.len() + 1).sum();
    let mut s = String::with_capacity(len_bytes);
    for (i, f) in fields.iter().enumerate() {
        if i > 0 {
            s.push(SEPARATOR);
        }
        s.push_str(f);
    }
    if trailing_separator {
        s.push(SEPARATOR);
    }
    s
}

/// The storage key (group, kind, partition, namespace, name) of an id.
pub(crate) fn storage_key(id: &Id) -> String {
    let p = parts(Some(id));
    join(&[p.group, p.kind, p.partition, p.namespace, p.name], false)
}

/// Calls `f` with the storage key of `id`, built on the stack when it fits
/// (the common case: no allocation on the read path).
pub(crate) fn with_storage_key<R>(id: &Id, f: impl FnOnce(&str) -> R) -> R {
    const STACK_BYTES: usize = 256;
    let p = parts(Some(id));
    let fields = [p.group, p.kind, p.partition, p.namespace, p.name];
    let len_bytes = fields.iter().map(|f| f.len()).sum::<usize>() + fields.len() - 1;
    if len_bytes > STACK_BYTES {
        return f(&storage_key(id));
    }
    let mut buf = [0u8; STACK_BYTES];
    let mut at = 0;
    for (i, field) in fields.iter().enumerate() {
        if i > 0 {
            buf[at] = SEPARATOR as u8;
            at += 1;
        }
        buf[at..at + field.len()].copy_from_slice(field.as_bytes());
        at += field.len();
    }
    assert_eq!(at, len_bytes);
    match std::str::from_utf8(&buf[..at]) {
        Ok(key) => f(key),
        Err(_) => unreachable!("UTF-8 fields joined by NUL are UTF-8"),
    }
}

/// The fields of a storage key: group, kind, partition, namespace, name.
pub(crate) fn fields(key: &str) -> [&str; 5] {
    let mut fields = [""; 5];
    let mut rest = key;
    for field in fields.iter_mut().take(4) {
        match split_field(rest) {
            Some((value, after)) => {
                *field = value;
                rest = after;
            }
            None => unreachable!("a storage key has five fields"),
        }
    }
    fields[4] = rest;
    fields
}

/// The registry key of a watch: (group, kind) joined.
pub(crate) fn type_key(group: &str, kind: &str) -> String {
    join(&[group, kind], false)
}

/// The (group, kind) part of a storage key, as [`type_key`] would build it.
pub(crate) fn type_key_of_storage_key(key: &str) -> &str {
    let mut separators = key.match_indices(SEPARATOR).map(|(i, _)| i);
    let _after_group = separators.next();
    match separators.next() {
        Some(end) => &key[..end],
        None => key,
    }
}

/// Whether any key field of `id` holds the separator (never true of a stored
/// id: validation forbids control characters).
pub(crate) fn holds_separator(id: &Id) -> bool {
    let p = parts(Some(id));
    [p.group, p.kind, p.partition, p.namespace, p.name, p.uid]
        .iter()
        .any(|f| f.contains(SEPARATOR))
}

/// The prefix shared by every owner-index entry of one owner: (group, kind,
/// partition, namespace, name, uid) with a trailing separator. The owner's
/// group version is not part of it.
pub(crate) fn owner_prefix(owner: &Id) -> String {
    let p = parts(Some(owner));
    join(
        &[p.group, p.kind, p.partition, p.namespace, p.name, p.uid],
        true,
    )
}

/// The owner-index entry of a resource: its owner's prefix, then its own key.
pub(crate) fn owner_entry(owner: &Id, key: &str) -> String {
    let mut s = owner_prefix(owner);
    s.push_str(key);
    s
}

/// Where a list's range scan starts: the storage-key prefix up to the first
/// wildcard field. Every matching key starts with it; keys that start with it
/// still need [`matches`] (a wildcard field may be followed by literal ones).
pub(crate) fn list_prefix(type_: &Type, tenancy: &Tenancy, name_prefix: &str) -> String {
    let mut s = join(&[&type_.group, &type_.kind], true);
    if tenancy.partition == "*" {
        return s;
    }
    s.push_str(&tenancy.partition);
    s.push(SEPARATOR);
    if tenancy.namespace == "*" {
        return s;
    }
    s.push_str(&tenancy.namespace);
    s.push(SEPARATOR);
    s.push_str(name_prefix);
    s
}

/// Whether every key starting with [`list_prefix`] matches the list rule, so
/// no per-resource filter is needed. True when neither tenancy field is `*`:
/// the prefix then spells out group, kind, partition and namespace, each
/// followed by a separator, plus the name prefix. Stored fields contain no
/// separator, so a stored key starts with it exactly when the four fields
/// are equal and the name starts with the prefix (a query field holding a
/// separator yields a prefix with more separators than any stored key has,
/// which therefore matches nothing, as it should).
pub(crate) fn list_prefix_is_exact(tenancy: &Tenancy) -> bool {
    tenancy.partition != "*" && tenancy.namespace != "*"
}

/// Whether the fields after the scan prefix are unconstrained: the first
/// wildcard is followed only by wildcards and an empty name prefix, which
/// comes down to a `*` namespace and no name prefix.
fn scan_prefix_is_the_rule(tenancy: &Tenancy, name_prefix: &str) -> bool {
    tenancy.namespace == "*" && name_prefix.is_empty()
}

/// Splits `s` at its first separator.
fn split_field(s: &str) -> Option<(&str, &str)> {
    let at = s.as_bytes().iter().position(|b| *b == SEPARATOR as u8)?;
    Some((&s[..at], &s[at + 1..]))
}

/// The list rule applied to storage keys (which are already in cache while
/// scanning, unlike the resources they point to).
#[derive(Debug, Clone)]
pub(crate) struct Matcher {
    tenancy: Tenancy,
    name_prefix: String,
    /// Every matching key starts with it (see [`list_prefix`]).
    scan_prefix: String,
    /// Whether starting with `scan_prefix` is the whole rule.
    exact: bool,
    /// A query field holds a separator, so nothing stored can match.
    impossible: bool,
}

impl Matcher {
    pub fn new(type_: &Type, tenancy: &Tenancy, name_prefix: &str) -> Matcher {
        let impossible = [
            type_.group.as_str(),
            type_.kind.as_str(),
            tenancy.partition.as_str(),
            tenancy.namespace.as_str(),
            name_prefix,
        ]
        .iter()
        .any(|f| f.contains(SEPARATOR));
        Matcher {
            tenancy: tenancy.clone(),
            name_prefix: name_prefix.to_string(),
            scan_prefix: list_prefix(type_, tenancy, name_prefix),
            exact: list_prefix_is_exact(tenancy) || scan_prefix_is_the_rule(tenancy, name_prefix),
            impossible,
        }
    }

    /// The start of the range to scan; the scan ends at the first key that
    /// does not start with it.
    pub fn scan_prefix(&self) -> &str {
        &self.scan_prefix
    }

    /// Whether the resource stored at `key` matches.
    pub fn matches_key(&self, key: &str) -> bool {
        if self.impossible || !key.starts_with(self.scan_prefix.as_str()) {
            return false;
        }
        if self.exact {
            return true;
        }
        // Not exact, so the scan prefix ends right after the separator that
        // follows kind (partition is `*`) or partition (namespace is `*`):
        // the fields it covers are equal, the rest are parsed here.
        let rest = &key[self.scan_prefix.len()..];
        let rest = if self.tenancy.partition == "*" {
            match split_field(rest) {
                Some((_partition, rest)) => rest,
                None => return false,
            }
        } else {
            rest
        };
        let Some((namespace, name)) = split_field(rest) else {
            return false;
        };
        (self.tenancy.namespace == "*" || self.tenancy.namespace == namespace)
            && name.starts_with(self.name_prefix.as_str())
    }
}

/// The list rule stated on a resource, as the contract states it: same group
/// and kind (any group version), each tenancy field equal or `*`, the name
/// starting with the prefix. The reference the key-based [`Matcher`] is
/// tested against.
#[cfg(test)]
pub(crate) fn matches(
    resource: &Resource,
    type_: &Type,
    tenancy: &Tenancy,
    name_prefix: &str,
) -> bool {
    let p = resource_parts(resource);
    p.group == type_.group
        && p.kind == type_.kind
        && (tenancy.partition == "*" || tenancy.partition == p.partition)
        && (tenancy.namespace == "*" || tenancy.namespace == p.namespace)
        && p.name.starts_with(name_prefix)
}

/// The list rule without the type, on a storage key (the watch registry
/// already matched the type).
pub(crate) fn tenancy_matches(key: &str, tenancy: &Tenancy, name_prefix: &str) -> bool {
    let [_group, _kind, partition, namespace, name] = fields(key);
    (tenancy.partition == "*" || tenancy.partition == partition)
        && (tenancy.namespace == "*" || tenancy.namespace == namespace)
        && name.starts_with(name_prefix)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(g: &str, k: &str, p: &str, ns: &str, n: &str) -> Id {
        Id {
            uid: String::new(),
            name: n.into(),
            r#type: Some(Type {
                group: g.into(),
                group_version: "v".into(),
                kind: k.into(),
            }),
            tenancy: Some(Tenancy {
                partition: p.into(),
                namespace: ns.into(),
            }),
        }
    }

    #[test]
    fn key_order_is_tuple_order() {
        // Joined keys sort as the tuples of their fields do (NUL sorts first).
        let tuples = [
            ("a", "k", "", "", "x"),
            ("a", "k", "", "", "xy"),
            ("a", "k", "", "n", ""),
            ("a", "k", "p", "", ""),
            ("a", "kk", "", "", ""),
            ("ab", "", "", "", ""),
            ("b", "a", "a", "a", "a"),
        ];
        let keys: Vec<String> = tuples
            .iter()
            .map(|(g, k, p, ns, n)| storage_key(&id(g, k, p, ns, n)))
            .collect();
        let mut sorted = keys.clone();
        sorted.sort();
        assert_eq!(keys, sorted);
    }

    #[test]
    fn an_exact_prefix_match_is_the_list_rule() {
        // With literal tenancy fields, starts_with(prefix) decides exactly as matches().
        let stored = [
            id("g", "k", "p", "ns", "name"),
            id("g", "k", "p", "ns", "n"),
            id("g", "k", "p", "nsx", "name"),
            id("g", "k", "", "", "name"),
            id("g", "kk", "p", "ns", "name"),
        ];
        let queries = [
            ("g", "k", "p", "ns", "n"),
            ("g", "k", "p", "ns", ""),
            ("g", "k", "p", "ns", "name"),
            ("g", "k", "p", "n", ""),
            ("g", "k", "", "", ""),
            ("g", "k", "p\0ns", "", ""),
            ("g", "k", "p", "ns\0name", ""),
            ("g\0k", "p", "ns", "name", ""),
        ];
        for (g, k, p, ns, prefix) in queries {
            let t = Type {
                group: g.into(),
                group_version: String::new(),
                kind: k.into(),
            };
            let ten = Tenancy {
                partition: p.into(),
                namespace: ns.into(),
            };
            assert!(list_prefix_is_exact(&ten));
            let scan = list_prefix(&t, &ten, prefix);
            for s in &stored {
                let r = Resource {
                    id: Some(s.clone()),
                    ..Default::default()
                };
                assert_eq!(
                    storage_key(s).starts_with(&scan),
                    matches(&r, &t, &ten, prefix),
                    "{s:?} vs {:?}",
                    (g, k, p, ns, prefix)
                );
            }
            // The same queries with wildcards, through the key matcher.
            for (wp, wns) in [(p, "*"), ("*", ns), ("*", "*"), (p, ns)] {
                let ten = Tenancy {
                    partition: wp.into(),
                    namespace: wns.into(),
                };
                let m = Matcher::new(&t, &ten, prefix);
                for s in &stored {
                    let r = Resource {
                        id: Some(s.clone()),
                        ..Default::default()
                    };
                    assert_eq!(
                        m.matches_key(&storage_key(s)),
                        matches(&r, &t, &ten, prefix),
                        "{s:?} vs {:?}",
                        (g, k, wp, wns, prefix)
                    );
                }
            }
        }
    }

    #[test]
    fn list_prefix_stops_at_the_first_wildcard() {
        // The scan prefix covers every literal field before the first "*".
        let t = Type {
            group: "g".into(),
            group_version: String::new(),
            kind: "k".into(),
        };
        let ten = |p: &str, n: &str| Tenancy {
            partition: p.into(),
            namespace: n.into(),
        };
        assert_eq!(list_prefix(&t, &ten("*", "ns"), "a"), "g\0k\0");
        assert_eq!(list_prefix(&t, &ten("p", "*"), "a"), "g\0k\0p\0");
        assert_eq!(list_prefix(&t, &ten("p", "ns"), "a"), "g\0k\0p\0ns\0a");
        assert_eq!(
            type_key_of_storage_key(&storage_key(&id("g", "k", "p", "ns", "n"))),
            type_key("g", "k")
        );
        // The stack-built key equals the allocated one, also past the stack size.
        for name in ["n".to_string(), "x".repeat(300)] {
            let i = id("g", "k", "p", "ns", &name);
            assert_eq!(with_storage_key(&i, |k| k.to_string()), storage_key(&i));
        }
    }
}
