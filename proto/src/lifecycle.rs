//! The metadata keys of the resource lifecycle (`docs/contract.md`, section 4b): what a
//! client writes and reads in `Resource.metadata` to use finalizers and see deletion
//! marks, the same names as Consul's. The rules themselves are the store's
//! (`cairn_fsm::lifecycle`).

use std::collections::BTreeMap;

/// The metadata key of a resource's finalizers: names separated by white space.
pub const FINALIZERS: &str = "finalizers";
/// The metadata key of a deletion mark: the RFC 3339 time the resource was marked.
pub const DELETION_TIMESTAMP: &str = "deletionTimestamp";
/// The finalizer an orphaning Delete adds to a resource that owns others.
pub const ORPHAN_FINALIZER: &str = "cairn.io/orphan";

/// The finalizers a resource's metadata holds, in order.
pub fn finalizers(metadata: &BTreeMap<String, String>) -> Vec<&str> {
    metadata
        .get(FINALIZERS)
        .map(|f| f.split_whitespace().collect())
        .unwrap_or_default()
}

/// The metadata with the finalizer `name` added (`present`) or removed; the key goes
/// when the list empties.
pub fn set_finalizer(metadata: &mut BTreeMap<String, String>, name: &str, present: bool) {
    let mut names: Vec<String> = finalizers(metadata)
        .into_iter()
        .filter(|f| *f != name)
        .map(str::to_string)
        .collect();
    if present {
        names.push(name.to_string());
    }
    match names.is_empty() {
        true => metadata.remove(FINALIZERS),
        false => metadata.insert(FINALIZERS.to_string(), names.join(" ")),
    };
}

/// Whether the metadata holds a deletion mark.
pub fn is_marked(metadata: &BTreeMap<String, String>) -> bool {
    metadata.contains_key(DELETION_TIMESTAMP)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finalizers_are_added_once_and_removed_with_their_key() {
        let mut m = BTreeMap::new();
        set_finalizer(&mut m, "a", true);
        set_finalizer(&mut m, "b", true);
        set_finalizer(&mut m, "a", true);
        assert_eq!(m[FINALIZERS], "b a");
        set_finalizer(&mut m, "b", false);
        assert_eq!(finalizers(&m), ["a"]);
        set_finalizer(&mut m, "a", false);
        assert!(!m.contains_key(FINALIZERS));
        assert!(!is_marked(&m));
    }
}
