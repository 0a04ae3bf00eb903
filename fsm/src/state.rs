//! The versioned table: persistent maps that a view shares with the writer.

use std::ops::Bound;
use std::sync::Arc;

use cairn_proto::v1::{Id, Tenancy, Type};
use imbl::{OrdMap, OrdSet};

use crate::capacity::Usage;
use crate::key::{self, Key};
use crate::lease::Lease;
use crate::{FsmError, ReadScope, StoredResource};

/// The table at one revision. Cloning is O(1): the maps are persistent and
/// share structure, so a clone is a point-in-time copy the writer never
/// disturbs.
#[derive(Clone, Default)]
pub(crate) struct State {
    /// The applied index this state reflects.
    pub revision: u64,
    /// Storage key -> the resource as last stored.
    pub resources: OrdMap<Key, StoredResource>,
    /// Owner-index entry (owner prefix ++ storage key) -> the owned resource.
    pub owned: OrdMap<Key, StoredResource>,
    /// What the table accounts for ([`crate::capacity`]): every stored resource.
    pub usage: Usage,
    /// The same per type and tenancy (`group NUL kind NUL partition NUL namespace`, the
    /// storage key without its name); only non-empty ones are held.
    pub by_type: OrdMap<Key, Usage>,
    /// The same per tenancy (`partition NUL namespace`); only non-empty ones are held.
    pub by_tenancy: OrdMap<Key, Usage>,
    /// The leases ([`crate::lease`]), by id.
    pub leases: OrdMap<u64, Lease>,
    /// (lease id, storage key) of every stored resource attached to a lease.
    pub lease_keys: OrdSet<(u64, Key)>,
    /// Derived ([`crate::lifecycle`]): the owner prefixes (as in [`State::owned`]) of the
    /// owners that are not stored (with that uid) while something names them: what the
    /// leader collects.
    pub dangling: OrdSet<Key>,
    /// Derived: the storage keys of the marked resources holding the orphan finalizer.
    pub orphaning: OrdSet<Key>,
    /// Derived ([`crate::integrity`]): the wrapping sum of every stored resource's
    /// [`crate::integrity::entry_digest`].
    pub digest: u64,
}

/// The owner prefix (as the owner index keys it) of the resource stored at `key` with
/// `uid`: its storage key, its uid, each followed by the separator.
pub(crate) fn self_prefix(key: &str, uid: &str) -> Key {
    let mut s = String::with_capacity(key.len() + uid.len() + 2);
    s.push_str(key);
    s.push(key::SEPARATOR);
    s.push_str(uid);
    s.push(key::SEPARATOR);
    Key::from(s)
}

/// The storage key and uid an owner prefix names (the inverse of [`self_prefix`]).
pub(crate) fn split_owner_prefix(prefix: &str) -> (&str, &str) {
    let body = prefix.strip_suffix(key::SEPARATOR).unwrap_or(prefix);
    match body.rfind(key::SEPARATOR) {
        Some(at) => (&body[..at], &body[at + 1..]),
        None => unreachable!("an owner prefix has six fields"),
    }
}

/// The id (uid included, group version empty) an owner prefix names.
pub(crate) fn owner_id_of_prefix(prefix: &str) -> Id {
    let (storage_key, uid) = split_owner_prefix(prefix);
    let [group, kind, partition, namespace, name] = key::fields(storage_key);
    Id {
        uid: uid.to_string(),
        name: name.to_string(),
        r#type: Some(Type {
            group: group.to_string(),
            group_version: String::new(),
            kind: kind.to_string(),
        }),
        tenancy: Some(Tenancy {
            partition: partition.to_string(),
            namespace: namespace.to_string(),
        }),
    }
}

/// The type-and-tenancy part of a storage key (`group NUL kind NUL partition NUL
/// namespace`): the key without its last field, the name.
pub(crate) fn type_key(storage_key: &str) -> &str {
    match storage_key.rfind(key::SEPARATOR) {
        Some(end) => &storage_key[..end],
        None => unreachable!("a storage key has five fields"),
    }
}

/// The tenancy part of a type key (`partition NUL namespace`).
pub(crate) fn tenancy_key(type_key: &str) -> &str {
    let mut separators = type_key.match_indices(key::SEPARATOR).map(|(i, _)| i);
    match separators.nth(1) {
        Some(start) => &type_key[start + 1..],
        None => unreachable!("a type key has four fields"),
    }
}

/// Adds (`add`) or removes `bytes` of one resource under `key` in `map`, dropping an entry
/// that becomes empty.
fn count(map: &mut OrdMap<Key, Usage>, key: &str, bytes: u64, add: bool) {
    match map.get_mut(key) {
        Some(usage) => {
            usage.change(bytes, add);
            if usage.count == 0 {
                assert_eq!(usage.bytes, 0, "an empty tenant holds no bytes");
                map.remove(key);
            }
        }
        None => {
            assert!(add, "a resource removed was counted");
            let mut usage = Usage::default();
            usage.change(bytes, true);
            map.insert(Key::from(key), usage);
        }
    }
}

impl State {
    /// Puts (or with `None` removes) the resource at `key`, keeping the owner
    /// index in step. Returns the resource that was stored before.
    pub fn set(&mut self, key: &Key, value: Option<StoredResource>) -> Option<StoredResource> {
        let new_entry = value.as_ref().and_then(|r| r.owner_entry().cloned());
        let previous = match &value {
            Some(v) => self.resources.insert(key.clone(), v.clone()),
            None => self.resources.remove(key),
        };
        if let Some(old) = previous.as_ref().and_then(StoredResource::owner_entry) {
            if new_entry.as_ref() != Some(old) {
                let removed = self.owned.remove(old);
                assert!(removed.is_some(), "owner index holds every owned resource");
            }
        }
        let new_lease = value.as_ref().map_or(0, StoredResource::lease);
        if let Some(old) = previous.as_ref().map(StoredResource::lease) {
            if old != 0 && old != new_lease {
                let removed = self.lease_keys.remove(&(old, key.clone()));
                assert!(
                    removed.is_some(),
                    "the lease index holds every leased resource"
                );
            }
        }
        if new_lease != 0 {
            self.lease_keys.insert((new_lease, key.clone()));
        }
        if let Some(old) = &previous {
            self.account(key, old.accounted_bytes(key.len()), false);
            self.digest = self.digest.wrapping_sub(crate::integrity::entry_digest(
                key.as_bytes(),
                old.encoded(),
            ));
        }
        if let Some(new) = &value {
            self.account(key, new.accounted_bytes(key.len()), true);
            self.digest = self.digest.wrapping_add(crate::integrity::entry_digest(
                key.as_bytes(),
                new.encoded(),
            ));
        }
        let old_prefix = previous
            .as_ref()
            .and_then(StoredResource::owner_entry)
            .map(|e| Key::from(&e[..e.len() - key.len()]));
        let new_prefix = new_entry
            .as_ref()
            .map(|e| Key::from(&e[..e.len() - key.len()]));
        if let (Some(entry), Some(v)) = (new_entry, value.as_ref()) {
            self.owned.insert(entry, v.clone());
        }
        assert!(
            self.owned.len() <= self.resources.len(),
            "owner index is never larger than the table"
        );
        self.track_lifecycle(
            key,
            previous.as_ref(),
            value.as_ref(),
            old_prefix,
            new_prefix,
        );
        previous
    }

    /// Keeps the derived lifecycle indexes ([`State::dangling`], [`State::orphaning`]) in
    /// step with a change at `key` from `previous` to `value`, whose owners' prefixes were
    /// `old_prefix` and are `new_prefix`.
    fn track_lifecycle(
        &mut self,
        key: &Key,
        previous: Option<&StoredResource>,
        value: Option<&StoredResource>,
        old_prefix: Option<Key>,
        new_prefix: Option<Key>,
    ) {
        match value.is_some_and(|v| v.lifecycle().orphaning) {
            true => self.orphaning.insert(key.clone()),
            false => self.orphaning.remove(key),
        };
        if self.owned.is_empty() && self.dangling.is_empty() {
            return;
        }
        // As a dependent: the owner it named may have no dependent left; the one it names
        // may not be stored.
        if old_prefix != new_prefix {
            if let Some(p) = &old_prefix {
                if !self.has_owned_prefix(p) {
                    self.dangling.remove(p);
                }
            }
        }
        if let Some(p) = &new_prefix {
            let (owner_key, uid) = split_owner_prefix(p);
            if self.resources.get(owner_key).is_none_or(|o| o.uid() != uid) {
                self.dangling.insert(p.clone());
            }
        }
        // As an owner: stored now, or gone with dependents left.
        let old_self = previous.map(|r| self_prefix(key, r.uid()));
        let new_self = value.map(|r| self_prefix(key, r.uid()));
        if let Some(p) = &new_self {
            self.dangling.remove(p);
        }
        if let Some(p) = old_self {
            if Some(&p) != new_self.as_ref() && self.has_owned_prefix(&p) {
                self.dangling.insert(p);
            }
        }
        debug_assert!(
            self.dangling.iter().all(|p| self.has_owned_prefix(p)),
            "a dangling owner has dependents"
        );
    }

    /// Whether anything names the owner of prefix `prefix`.
    pub fn has_owned_prefix(&self, prefix: &str) -> bool {
        self.owned
            .range::<_, str>((Bound::Included(prefix), Bound::Unbounded))
            .next()
            .is_some_and(|(k, _)| k.starts_with(prefix))
    }

    /// The dependents of the owner prefix `prefix`, in owner-index order.
    pub fn owned_by_prefix<'a>(
        &'a self,
        prefix: &'a str,
    ) -> impl Iterator<Item = (&'a Key, &'a StoredResource)> + 'a {
        self.owned
            .range::<_, str>((Bound::Included(prefix), Bound::Unbounded))
            .take_while(move |(k, _)| k.starts_with(prefix))
    }
}

impl State {
    /// The owners the leader should propose a [`crate::Command::Collect`] for, at most
    /// `max`: every orphaning owner, and every dangling owner with a dependent that is
    /// not marked yet (a marked one waits for its finalizers). Each is an id with its uid
    /// (and an empty group version).
    pub fn collect_candidates(&self, max: usize) -> Vec<Id> {
        let orphaning = self.orphaning.iter().filter_map(|key| {
            let stored = self.resources.get(key)?;
            Some(self_prefix(key, stored.uid()))
        });
        let dangling = self
            .dangling
            .iter()
            .filter(|p| {
                self.owned_by_prefix(p)
                    .any(|(_, dependent)| !dependent.lifecycle().marked)
            })
            .cloned();
        orphaning
            .chain(dangling)
            .take(max)
            .map(|p| owner_id_of_prefix(&p))
            .collect()
    }

    /// The storage keys of the resources attached to the lease `id`, in order.
    pub fn keys_of_lease(&self, id: u64) -> Vec<Key> {
        let start: (u64, Key) = (id, Key::from(""));
        self.lease_keys
            .range(start..)
            .take_while(|(lease, _)| *lease == id)
            .map(|(_, key)| key.clone())
            .collect()
    }

    /// The highest lease id held (0: none).
    pub fn highest_lease_id(&self) -> u64 {
        self.leases.get_max().map_or(0, |(id, _)| *id)
    }

    /// Counts one resource at `key` in (`add`) or out of the usage totals.
    fn account(&mut self, key: &str, bytes: u64, add: bool) {
        self.usage.change(bytes, add);
        let type_key = type_key(key);
        count(&mut self.by_type, type_key, bytes, add);
        count(&mut self.by_tenancy, tenancy_key(type_key), bytes, add);
        assert!(
            self.by_type.len() as u64 <= self.usage.count
                && self.by_tenancy.len() <= self.by_type.len(),
            "every tenant entry holds a resource"
        );
    }

    /// The usage of the type (`group`, `kind`) in the tenancy, and of the tenancy.
    pub fn tenant_usage(&self, type_key: &str) -> (Usage, Usage) {
        let type_usage = self.by_type.get(type_key).copied().unwrap_or_default();
        let tenancy_usage = self
            .by_tenancy
            .get(tenancy_key(type_key))
            .copied()
            .unwrap_or_default();
        (type_usage, tenancy_usage)
    }
}

/// One change kept in the history: the resource at `key` before and after
/// the entry at `revision` (None = absent). At least one side is present.
#[derive(Clone)]
pub(crate) struct Change {
    pub revision: u64,
    pub key: Key,
    pub before: Option<StoredResource>,
    pub after: Option<StoredResource>,
}

impl Change {
    /// The bytes of its before-image: what the history holds that the table may no longer.
    pub fn before_bytes(&self) -> u64 {
        self.before.as_ref().map_or(0, |b| b.encoded().len() as u64)
    }
}

/// A consistent, immutable point-in-time view of the table. Cheap to clone;
/// holding one never blocks the writer (it only keeps old tree nodes alive).
#[derive(Clone)]
pub struct View {
    pub(crate) state: Arc<State>,
}

impl View {
    /// The owners whose dependents the leader should collect now, at most `max`
    /// ([`crate::lifecycle`]; each an id with its uid).
    pub fn collect_candidates(&self, max: usize) -> Vec<Id> {
        self.state.collect_candidates(max)
    }

    /// The applied index this view reflects.
    pub fn revision(&self) -> u64 {
        self.state.revision
    }

    /// Reads one resource, in the contract's order: nothing stored ->
    /// NotFound; a non-empty uid that differs -> NotFound; a group version
    /// that differs -> GroupVersionMismatch carrying the stored resource.
    pub fn read(&self, id: &Id) -> Result<StoredResource, FsmError> {
        let Some(stored) = key::with_storage_key(id, |key| self.state.resources.get(key)) else {
            return Err(FsmError::NotFound);
        };
        if !id.uid.is_empty() && id.uid != stored.uid() {
            return Err(FsmError::NotFound);
        }
        let requested = key::parts(Some(id));
        if requested.group_version != stored.group_version() {
            return Err(FsmError::GroupVersionMismatch {
                requested: id.r#type.clone().unwrap_or_default(),
                stored: stored.clone(),
            });
        }
        Ok(stored.clone())
    }

    /// Every resource of the unversioned type (group + kind; the group
    /// version is ignored) whose tenancy matches field by field (`*` = any)
    /// and whose name starts with `name_prefix`, in storage-key order: the
    /// page scan ([`View::list_page`]) without bounds, so a whole list and a
    /// listing's pages are one scan.
    pub fn list(&self, type_: &Type, tenancy: &Tenancy, name_prefix: &str) -> Vec<StoredResource> {
        let filter = crate::ListFilter {
            type_,
            tenancy,
            name_prefix,
            selector: None,
        };
        let page = self.list_page(&filter, None, None, crate::PageBounds::UNBOUNDED);
        assert!(page.next.is_none(), "an unbounded page ends the listing");
        page.resources
    }

    /// Every resource whose owner equals `owner` on group, kind, partition,
    /// namespace, name and uid (the group version is ignored).
    pub fn list_by_owner(&self, owner: &Id) -> Vec<StoredResource> {
        self.list_by_owner_at_most(owner, None, usize::MAX)
            .unwrap_or_default()
    }

    /// As [`View::list_by_owner`], but only what `visible` shows (`None`:
    /// everything), and `None` as soon as more than `results_max` of those
    /// match.
    pub fn list_by_owner_at_most(
        &self,
        owner: &Id,
        visible: Option<&ReadScope>,
        results_max: usize,
    ) -> Option<Vec<StoredResource>> {
        if key::holds_separator(owner) {
            // No stored field holds one; and a separator inside a field would
            // shift the prefix onto other owners' entries.
            return Some(Vec::new());
        }
        let prefix = key::owner_prefix(owner);
        let found: Vec<StoredResource> = self
            .state
            .owned
            .range::<_, str>((Bound::Included(prefix.as_str()), Bound::Unbounded))
            .take_while(|(k, _)| k.starts_with(prefix.as_str()))
            .map(|(_, r)| r)
            .filter(|r| visible.is_none_or(|v| v.shows_resource(r)))
            .take(results_max.saturating_add(1))
            .cloned()
            .collect();
        (found.len() <= results_max).then_some(found)
    }

    /// What the table accounts for ([`crate::capacity`]).
    pub fn usage(&self) -> Usage {
        self.state.usage
    }

    /// The usage of each type in each tenancy: `([group, kind, partition, namespace],
    /// usage)`, in that order.
    pub fn usage_by_type(&self) -> Vec<([String; 4], Usage)> {
        self.state
            .by_type
            .iter()
            .map(|(k, usage)| {
                let mut fields = k.split(key::SEPARATOR).map(str::to_string);
                let mut next = || fields.next().unwrap_or_default();
                ([next(), next(), next(), next()], *usage)
            })
            .collect()
    }

    /// How many resources the view holds.
    pub fn len(&self) -> usize {
        self.state.resources.len()
    }

    /// Whether the view holds no resource.
    pub fn is_empty(&self) -> bool {
        self.state.resources.is_empty()
    }

    /// How many resources of each type (`group.Kind`; versions of a kind share their
    /// storage) the view holds, in type order. One pass over the keys, which sort by type.
    pub fn count_by_type(&self) -> Vec<(String, u64)> {
        let mut counts: Vec<(String, u64)> = Vec::new();
        let mut last_type_key: Option<&str> = None;
        for key in self.state.resources.keys() {
            let type_key = key::type_key_of_storage_key(key);
            match counts.last_mut() {
                Some((_, n)) if last_type_key == Some(type_key) => *n += 1,
                _ => {
                    counts.push((type_key.replace(key::SEPARATOR, "."), 1));
                    last_type_key = Some(type_key);
                }
            }
        }
        counts
    }

    /// Every lease, by id ([`crate::lease`]).
    pub fn leases(&self) -> impl Iterator<Item = &Lease> + '_ {
        self.state.leases.values()
    }

    /// How many leases exist.
    pub fn lease_count(&self) -> usize {
        self.state.leases.len()
    }

    /// The lease `id` and how many resources are attached to it.
    pub fn lease(&self, id: u64) -> Option<(Lease, u64)> {
        let lease = *self.state.leases.get(&id)?;
        let start: (u64, Key) = (id, Key::from(""));
        let attached = self
            .state
            .lease_keys
            .range(start..)
            .take_while(|(lease, _)| *lease == id)
            .count() as u64;
        Some((lease, attached))
    }

    /// The resources attached to the lease `id`, in storage-key order.
    pub fn resources_of_lease(&self, id: u64) -> Vec<StoredResource> {
        self.state
            .keys_of_lease(id)
            .iter()
            .filter_map(|key| self.state.resources.get(key).cloned())
            .collect()
    }

    /// Every resource of the view, in storage-key order.
    pub fn iter(&self) -> impl Iterator<Item = &StoredResource> + '_ {
        self.state.resources.values()
    }
}
