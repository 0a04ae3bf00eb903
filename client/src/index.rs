//! Indexes over a [`WatchCache`](crate::WatchCache)'s table: the built-in
//! index by owner and the user's [`Index`]es. Pure: no I/O, no locks, no
//! tasks; the cache keeps them under its table lock.
//!
//! ## Invariants
//! - An index holds exactly the resources of the table it describes, each
//!   under exactly the keys computed from the resource the table holds now:
//!   `Indexes::insert` first removes whatever the key was indexed under
//!   before, `Indexes::remove` removes every entry of the key. The table
//!   calls one of them for every change of its maps (upsert, delete, and
//!   every key a mark-and-sweep resync adds, replaces or sweeps).
//! - Every entry is the table's own `Arc` (no resource is copied), and the
//!   two directions of an index agree: a key's recorded index keys are
//!   exactly the index keys holding an entry for it. Inserting an entry that
//!   is already there, or removing one that is not, is a broken invariant
//!   and panics.
//! - The owner index follows the node's ListByOwner (`docs/contract.md`):
//!   an owner matches on group, kind, partition, namespace, name and uid; the
//!   group version is ignored.
//! - Results come in index-key order, then storage-key order (group, kind,
//!   partition, namespace, name) within one index key.

use std::borrow::Borrow;
use std::collections::BTreeMap;
use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use cairn_proto::v1::{Id, Resource};

use crate::error::ClientError;
use crate::watch_cache::ResourceKey;

/// The function of a user index: the keys a resource is found under (zero,
/// one or several; repeats count once).
type KeysFn = dyn Fn(&Resource) -> Vec<String> + Send + Sync;

/// A user-defined index of a [`WatchCache`](crate::WatchCache), declared
/// when the cache starts ([`WatchCacheBuilder::index`](crate::WatchCacheBuilder::index))
/// and queried with [`WatchCache::by_index`](crate::WatchCache::by_index).
///
/// The function must be a pure function of the resource (the same resource
/// gives the same keys) and quick: it runs under the cache's table lock on
/// every change. One that panics indexes the resource under no key (and logs
/// an error naming the index and the resource).
///
/// ```
/// use cairn_client::Index;
/// // Every resource under the value of its `tier` metadata entry, if any.
/// let by_tier = Index::new("by-tier", |r| r.metadata.get("tier").cloned().into_iter().collect());
/// assert_eq!(by_tier.name(), "by-tier");
/// ```
#[derive(Clone)]
pub struct Index {
    name: String,
    keys: Arc<KeysFn>,
}

impl Index {
    pub fn new(
        name: impl Into<String>,
        keys: impl Fn(&Resource) -> Vec<String> + Send + Sync + 'static,
    ) -> Index {
        Index {
            name: name.into(),
            keys: Arc::new(keys),
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The keys of `resource`, sorted and without repeats; none when the
    /// function panics.
    fn keys_of(&self, key: &ResourceKey, resource: &Resource) -> Vec<String> {
        match catch_unwind(AssertUnwindSafe(|| (self.keys)(resource))) {
            Ok(mut keys) => {
                keys.sort();
                keys.dedup();
                keys
            }
            Err(_) => {
                tracing::error!(index = %self.name, resource = ?key, "watch cache: the index function panicked; the resource is indexed under no key");
                Vec::new()
            }
        }
    }
}

impl fmt::Debug for Index {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Index").field("name", &self.name).finish()
    }
}

/// What an owner is matched on: its storage key and its uid (not its group
/// version), as the node's ListByOwner.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct OwnerKey {
    key: ResourceKey,
    uid: String,
}

impl OwnerKey {
    fn of(owner: &Id) -> OwnerKey {
        OwnerKey {
            key: ResourceKey::of_id(owner),
            uid: owner.uid.clone(),
        }
    }
}

/// One index, both ways: the entries under each index key, and the index
/// keys each resource is entered under.
#[derive(Debug)]
struct KeyIndex<K> {
    entries: BTreeMap<K, BTreeMap<ResourceKey, Arc<Resource>>>,
    keys_of: BTreeMap<ResourceKey, Vec<K>>,
}

impl<K: Ord + Clone + fmt::Debug> KeyIndex<K> {
    fn new() -> KeyIndex<K> {
        KeyIndex {
            entries: BTreeMap::new(),
            keys_of: BTreeMap::new(),
        }
    }

    /// Enters `resource` (stored at `key`) under `keys` (sorted, no
    /// repeats), and under nothing else.
    fn insert(&mut self, key: &ResourceKey, resource: &Arc<Resource>, keys: Vec<K>) {
        self.remove(key);
        for k in &keys {
            let duplicate = self
                .entries
                .entry(k.clone())
                .or_default()
                .insert(key.clone(), resource.clone());
            assert!(
                duplicate.is_none(),
                "index key {k:?} already held {key:?}, which was recorded under other keys"
            );
        }
        if !keys.is_empty() {
            self.keys_of.insert(key.clone(), keys);
        }
    }

    /// Removes every entry of `key`.
    fn remove(&mut self, key: &ResourceKey) {
        let Some(keys) = self.keys_of.remove(key) else {
            return;
        };
        for k in keys {
            let Some(held) = self.entries.get_mut(&k) else {
                panic!("{key:?} is recorded under index key {k:?}, which holds nothing");
            };
            let removed = held.remove(key);
            assert!(
                removed.is_some(),
                "{key:?} is recorded under index key {k:?}, which does not hold it"
            );
            if held.is_empty() {
                self.entries.remove(&k);
            }
        }
    }

    fn get<Q>(&self, k: &Q) -> Vec<Arc<Resource>>
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        self.entries
            .get(k)
            .map(|held| held.values().cloned().collect())
            .unwrap_or_default()
    }

    /// How many (index key, resource) entries there are.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.values().map(BTreeMap::len).sum()
    }
}

/// The owner index and the user indexes of one cache's table.
#[derive(Debug)]
pub(crate) struct Indexes {
    owner: KeyIndex<OwnerKey>,
    users: Vec<(Index, KeyIndex<String>)>,
}

impl Indexes {
    /// Indexes for `declared`, whose names are non-empty and distinct
    /// ([`Indexes::check_declared`]).
    pub(crate) fn new(declared: Vec<Index>) -> Indexes {
        assert!(
            Indexes::check_declared(&declared).is_ok(),
            "indexes are checked before the cache starts"
        );
        Indexes {
            owner: KeyIndex::new(),
            users: declared.into_iter().map(|i| (i, KeyIndex::new())).collect(),
        }
    }

    /// InvalidArgument naming the first index with an empty or repeated name.
    pub(crate) fn check_declared(declared: &[Index]) -> Result<(), ClientError> {
        for (i, index) in declared.iter().enumerate() {
            let field = format!("indexes[{i}].name");
            if index.name.is_empty() {
                return Err(ClientError::invalid(field, "an index needs a name"));
            }
            if declared[..i].iter().any(|o| o.name == index.name) {
                return Err(ClientError::invalid(
                    field,
                    format!("index {:?} is declared twice", index.name),
                ));
            }
        }
        Ok(())
    }

    /// Enters `resource`, now stored at `key`, in every index, replacing
    /// whatever `key` was entered under before.
    pub(crate) fn insert(&mut self, key: &ResourceKey, resource: &Arc<Resource>) {
        let owner: Vec<OwnerKey> = resource
            .owner
            .as_deref()
            .map(OwnerKey::of)
            .into_iter()
            .collect();
        self.owner.insert(key, resource, owner);
        for (index, entries) in &mut self.users {
            let keys = index.keys_of(key, resource);
            entries.insert(key, resource, keys);
        }
    }

    /// Removes `key`, no longer stored, from every index.
    pub(crate) fn remove(&mut self, key: &ResourceKey) {
        self.owner.remove(key);
        for (_, entries) in &mut self.users {
            entries.remove(key);
        }
    }

    /// Every resource owned by `owner` (group, kind, partition, namespace,
    /// name and uid equal; group version ignored), in storage-key order.
    pub(crate) fn by_owner(&self, owner: &Id) -> Vec<Arc<Resource>> {
        self.owner.get(&OwnerKey::of(owner))
    }

    /// Every resource the index `name` holds under `key`, in storage-key
    /// order; InvalidArgument when no index has that name.
    pub(crate) fn by_index(
        &self,
        name: &str,
        key: &str,
    ) -> Result<Vec<Arc<Resource>>, ClientError> {
        match self.users.iter().find(|(index, _)| index.name == name) {
            Some((_, entries)) => Ok(entries.get(key)),
            None => {
                let declared: Vec<&str> = self.users.iter().map(|(i, _)| i.name.as_str()).collect();
                Err(ClientError::invalid(
                    "index",
                    format!("no index named {name:?} (declared: {declared:?})"),
                ))
            }
        }
    }

    /// How many entries the owner index and each user index hold.
    #[cfg(test)]
    pub(crate) fn lens(&self) -> (usize, Vec<usize>) {
        (
            self.owner.len(),
            self.users.iter().map(|(_, e)| e.len()).collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_proto::v1::{Tenancy, Type};

    fn id(kind: &str, name: &str, uid: &str) -> Id {
        Id {
            uid: uid.into(),
            name: name.into(),
            r#type: Some(Type {
                group: "g".into(),
                group_version: "v1".into(),
                kind: kind.into(),
            }),
            tenancy: Some(Tenancy {
                partition: "default".into(),
                namespace: "default".into(),
            }),
        }
    }

    fn owned(name: &str, owner: Option<Id>, tier: &str) -> Arc<Resource> {
        let mut r = Resource {
            id: Some(id("K", name, "u")),
            owner: owner.map(Box::new),
            ..Default::default()
        };
        if !tier.is_empty() {
            r.metadata.insert("tier".into(), tier.into());
        }
        Arc::new(r)
    }

    fn names(found: &[Arc<Resource>]) -> Vec<String> {
        found
            .iter()
            .map(|r| r.id.as_ref().unwrap().name.clone())
            .collect()
    }

    fn by_tier() -> Index {
        Index::new("by-tier", |r: &Resource| {
            r.metadata.get("tier").cloned().into_iter().collect()
        })
    }

    #[test]
    fn an_owner_matches_on_its_uid_but_not_its_group_version() {
        // As the node's ListByOwner: another uid finds nothing; another group version finds the same.
        let mut indexes = Indexes::new(Vec::new());
        let r = owned("a", Some(id("Owner", "o", "u1")), "");
        indexes.insert(&ResourceKey::of(&r), &r);
        assert_eq!(names(&indexes.by_owner(&id("Owner", "o", "u1"))), vec!["a"]);
        assert!(indexes.by_owner(&id("Owner", "o", "u2")).is_empty());
        let mut other_version = id("Owner", "o", "u1");
        other_version.r#type.as_mut().unwrap().group_version = "v9".into();
        assert_eq!(names(&indexes.by_owner(&other_version)), vec!["a"]);
    }

    #[test]
    fn an_upsert_moves_a_resource_to_its_new_keys() {
        // The old key's entry goes; results share the resource's Arc.
        let mut indexes = Indexes::new(vec![by_tier()]);
        let before = owned("a", None, "web");
        let key = ResourceKey::of(&before);
        indexes.insert(&key, &before);
        let after = owned("a", None, "db");
        indexes.insert(&key, &after);
        assert!(indexes.by_index("by-tier", "web").unwrap().is_empty());
        let found = indexes.by_index("by-tier", "db").unwrap();
        assert!(Arc::ptr_eq(&found[0], &after));
        indexes.remove(&key);
        assert_eq!(indexes.lens(), (0, vec![0]));
    }

    #[test]
    fn an_unknown_index_is_invalid_argument_naming_it() {
        let indexes = Indexes::new(vec![by_tier()]);
        match indexes.by_index("by-colour", "red") {
            Err(ClientError::InvalidArgument { field, reason }) => {
                assert_eq!(field, "index");
                assert!(reason.contains("\"by-colour\""), "{reason}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn index_names_must_be_present_and_distinct() {
        assert!(Indexes::check_declared(&[by_tier(), Index::new("x", |_| Vec::new())]).is_ok());
        let twice = Indexes::check_declared(&[by_tier(), by_tier()]);
        assert!(
            matches!(&twice, Err(ClientError::InvalidArgument { field, .. }) if field == "indexes[1].name"),
            "{twice:?}"
        );
        let unnamed = Indexes::check_declared(&[Index::new("", |_| Vec::new())]);
        assert!(
            matches!(&unnamed, Err(ClientError::InvalidArgument { field, .. }) if field == "indexes[0].name"),
            "{unnamed:?}"
        );
    }

    #[test]
    fn a_panicking_index_function_indexes_the_resource_under_no_key() {
        // The table stays consistent: the other indexes still hold the resource.
        let mut indexes = Indexes::new(vec![Index::new("boom", |_| panic!("boom")), by_tier()]);
        let r = owned("a", None, "web");
        indexes.insert(&ResourceKey::of(&r), &r);
        assert_eq!(indexes.lens(), (0, vec![0, 1]));
    }
}
