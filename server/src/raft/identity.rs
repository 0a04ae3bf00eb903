//! What a data dir belongs to: one cluster (`DATA_DIR/cluster_id`) and one node
//! (`DATA_DIR/node_id`).
//!
//! The node id is recorded when the data dir is created (a node starting on an empty dir). A
//! dir written before node ids were recorded holds none: it is accepted, and its id is settled
//! from its stored state — the member of its stored membership whose peer address is this
//! node's — and recorded then ([`settle_node_id`]). The cluster id is recorded once known: set
//! by the node that initializes the cluster, learned from the cluster a node joins, or adopted
//! from the first admitted Raft message or snapshot.
//!
//! Invariants: once recorded, neither id ever changes; a node never runs on a dir recorded for
//! another node id; both files are written durably (temporary file, fsync, rename, fsync of
//! the dir) so a crash leaves the old content or the new, never a torn one.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use super::types::{NodeId, NodeInfo};

const CLUSTER_ID_FILE_NAME: &str = "cluster_id";
const NODE_ID_FILE_NAME: &str = "node_id";
/// The identity files are tiny; anything larger is not ours.
const IDENTITY_FILE_BYTES_MAX: u64 = 4096;

/// The identity of a data dir. Learned from the first Raft message of a leader, or set by
/// the node that initializes the cluster; a message from another cluster is refused.
pub struct ClusterIdentity {
    dir: PathBuf,
    cluster_id: Mutex<String>,
}

/// Reads a small identity file; `None` when it does not exist.
fn read_small(path: &Path) -> io::Result<Option<String>> {
    crate::durable::read_small(path, IDENTITY_FILE_BYTES_MAX)
}

/// Why a cluster id offered by a peer was not taken.
#[derive(Debug)]
pub enum AdoptError {
    /// This node's id is another (neither id is repeated: they are compared as secrets).
    OtherCluster,
    /// This node had none, and the offered one could not be recorded.
    Persist { path: PathBuf, source: io::Error },
}

impl std::fmt::Display for AdoptError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AdoptError::OtherCluster => write!(f, "another cluster's id"),
            AdoptError::Persist { path, source } => {
                write!(
                    f,
                    "cannot persist the cluster id in {}: {source}",
                    path.display()
                )
            }
        }
    }
}

impl std::error::Error for AdoptError {}

impl ClusterIdentity {
    pub fn open(data_dir: &Path) -> io::Result<ClusterIdentity> {
        let cluster_id = read_small(&data_dir.join(CLUSTER_ID_FILE_NAME))?.unwrap_or_default();
        Ok(ClusterIdentity {
            dir: data_dir.to_path_buf(),
            cluster_id: Mutex::new(cluster_id),
        })
    }

    pub fn cluster_id(&self) -> String {
        self.cluster_id
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Sets the cluster id (durably) if none is set yet; an id already set is kept, whatever
    /// `id` is. For the ids this node is told (by the initializer's bootstrap, the cluster it
    /// joins, its own snapshot): an id a peer offers goes through [`Self::adopt_or_check`].
    pub fn set(&self, id: &str) -> io::Result<()> {
        let mut current = self.cluster_id.lock().unwrap_or_else(|e| e.into_inner());
        if !current.is_empty() {
            return Ok(());
        }
        self.record(&mut current, id)
    }

    /// Writes `id` durably, then makes it this node's (under the caller's lock).
    fn record(&self, current: &mut String, id: &str) -> io::Result<()> {
        crate::durable::write_atomically(&self.dir.join(CLUSTER_ID_FILE_NAME), id.as_bytes())?;
        *current = id.to_string();
        Ok(())
    }

    /// Checks a cluster id a peer offers (`theirs`, not empty) against this node's, adopting
    /// it (durably) when this node has none yet. Compared and set under one lock, so that of
    /// two different ids offered at once to a node with none, one is adopted and the other
    /// refused. Compared as a secret (`same_secret`).
    pub fn adopt_or_check(&self, theirs: &str) -> Result<(), AdoptError> {
        let mut current = self.cluster_id.lock().unwrap_or_else(|e| e.into_inner());
        if current.is_empty() {
            return self
                .record(&mut current, theirs)
                .map_err(|source| AdoptError::Persist {
                    path: self.dir.join(CLUSTER_ID_FILE_NAME),
                    source,
                });
        }
        if same_secret(current.as_bytes(), theirs.as_bytes()) {
            return Ok(());
        }
        Err(AdoptError::OtherCluster)
    }

    /// Whether `theirs` is another cluster's id than this node's (`false` while it has none).
    /// Reads only: a peer's id is adopted through [`Self::adopt_or_check`].
    pub fn is_other_cluster(&self, theirs: &str) -> bool {
        let mine = self.cluster_id();
        !mine.is_empty() && !same_secret(mine.as_bytes(), theirs.as_bytes())
    }

    /// Checks the cluster id of a snapshot received from the leader, before
    /// it is installed, adopting it if this node has none yet. The leader's
    /// message already passed the peer gate with this cluster's id; a file
    /// that carries no id (written by a node from before ids were recorded in
    /// snapshot files) is taken on that ground.
    pub fn admit(&self, theirs: &str) -> Result<(), AdoptError> {
        if theirs.is_empty() {
            return Ok(());
        }
        self.adopt_or_check(theirs)
    }

    /// The node id recorded in the data dir, if any.
    pub fn node_id(&self) -> io::Result<Option<NodeId>> {
        let path = self.dir.join(NODE_ID_FILE_NAME);
        match read_small(&path)? {
            None => Ok(None),
            Some(text) => text.parse::<NodeId>().map(Some).map_err(|e| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{} holds {text:?}, not a node id: {e}", path.display()),
                )
            }),
        }
    }

    /// Records the node id (durably).
    pub fn record_node_id(&self, id: NodeId) -> io::Result<()> {
        crate::durable::write_atomically(
            &self.dir.join(NODE_ID_FILE_NAME),
            format!("{id}\n").as_bytes(),
        )
    }

    /// The file the node id is recorded in.
    pub fn node_id_path(&self) -> PathBuf {
        self.dir.join(NODE_ID_FILE_NAME)
    }
}

/// Refuses a data dir recorded for another node id.
pub fn check_node_id(data_dir: &Path, recorded: NodeId, configured: NodeId) -> Result<(), String> {
    if recorded == configured {
        return Ok(());
    }
    Err(format!(
        "data dir {dir} belongs to node {recorded} ({file} says so), but this node is \
         configured as node {configured}: start node {recorded} on it (--node-id {recorded}), \
         or give node {configured} its own data dir",
        dir = data_dir.display(),
        file = data_dir.join(NODE_ID_FILE_NAME).display(),
    ))
}

/// Settles the node id of a data dir that records none (one written before node ids were
/// recorded), from the membership it stores: the member whose peer address is this node's
/// must be this node. Refuses a dir whose membership gives this node's peer address to
/// another id; otherwise records the configured id.
pub fn settle_node_id<'a>(
    identity: &ClusterIdentity,
    data_dir: &Path,
    configured: NodeId,
    peer_address: &str,
    members: impl IntoIterator<Item = (&'a NodeId, &'a NodeInfo)>,
) -> Result<(), String> {
    let owner = members
        .into_iter()
        .find(|(_, node)| node.peer_address == peer_address)
        .map(|(id, _)| *id);
    if let Some(owner) = owner.filter(|owner| *owner != configured) {
        return Err(format!(
            "data dir {dir} records no node id, but the membership stored in it gives this \
             node's peer address {peer_address} to node {owner}, and this node is configured \
             as node {configured}: start node {owner} on it (--node-id {owner}), or give node \
             {configured} its own data dir",
            dir = data_dir.display(),
        ));
    }
    identity.record_node_id(configured).map_err(|e| {
        format!(
            "cannot record the node id in {}: {e}",
            identity.node_id_path().display()
        )
    })?;
    tracing::info!(
        node_id = configured,
        "recorded the node id of a data dir written before node ids were recorded"
    );
    Ok(())
}

/// Compares two secrets in time independent of where they differ.
pub(crate) fn same_secret(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(peer: &str) -> NodeInfo {
        NodeInfo {
            peer_address: peer.into(),
            client_address: String::new(),
        }
    }

    #[test]
    fn a_peer_s_cluster_id_is_adopted_once_and_then_only_checked() {
        // Of several ids offered at once to a node with none, exactly one is adopted (and
        // recorded); every other is refused, and so is any other id later.
        let dir = tempfile::tempdir().unwrap();
        let identity = std::sync::Arc::new(ClusterIdentity::open(dir.path()).unwrap());
        let barrier = std::sync::Arc::new(std::sync::Barrier::new(8));
        let offers: Vec<_> = (0..8)
            .map(|i| {
                let (identity, barrier) = (identity.clone(), barrier.clone());
                std::thread::spawn(move || {
                    barrier.wait();
                    identity.adopt_or_check(&format!("cluster-{i}")).is_ok()
                })
            })
            .collect();
        let adopted = offers
            .into_iter()
            .map(|t| t.join().unwrap())
            .filter(|ok| *ok)
            .count();
        assert_eq!(adopted, 1);
        let id = identity.cluster_id();
        assert_eq!(ClusterIdentity::open(dir.path()).unwrap().cluster_id(), id);
        identity.adopt_or_check(&id).expect("the same id");
        assert!(matches!(
            identity.adopt_or_check("another"),
            Err(AdoptError::OtherCluster)
        ));
        assert!(identity.is_other_cluster("another"));
        assert!(!identity.is_other_cluster(&id));
        identity
            .admit("")
            .expect("a snapshot without an id is taken");
    }

    #[test]
    fn a_recorded_node_id_refuses_another_id_naming_both() {
        let dir = tempfile::tempdir().unwrap();
        let identity = ClusterIdentity::open(dir.path()).unwrap();
        assert_eq!(identity.node_id().unwrap(), None);
        identity.record_node_id(2).unwrap();
        let identity = ClusterIdentity::open(dir.path()).unwrap();
        assert_eq!(identity.node_id().unwrap(), Some(2));
        check_node_id(dir.path(), 2, 2).expect("same id");
        let refusal = check_node_id(dir.path(), 2, 3).unwrap_err();
        assert!(
            refusal.contains("node 2") && refusal.contains("node 3"),
            "{refusal}"
        );
    }

    #[test]
    fn an_old_dir_settles_its_node_id_from_the_stored_membership() {
        // The member with this node's peer address is this node: recorded. Another member
        // holding it: refused, naming both ids. No member holding it: the configured id.
        let members = std::collections::BTreeMap::from([(1, node("a:1")), (2, node("a:2"))]);
        let dir = tempfile::tempdir().unwrap();
        let identity = ClusterIdentity::open(dir.path()).unwrap();
        let refusal = settle_node_id(&identity, dir.path(), 1, "a:2", &members).unwrap_err();
        assert!(
            refusal.contains("node 2") && refusal.contains("node 1"),
            "{refusal}"
        );
        assert_eq!(identity.node_id().unwrap(), None, "nothing recorded");
        settle_node_id(&identity, dir.path(), 2, "a:2", &members).unwrap();
        assert_eq!(identity.node_id().unwrap(), Some(2));
        let dir = tempfile::tempdir().unwrap();
        let identity = ClusterIdentity::open(dir.path()).unwrap();
        settle_node_id(&identity, dir.path(), 7, "a:7", &members).unwrap();
        assert_eq!(identity.node_id().unwrap(), Some(7));
    }
}
