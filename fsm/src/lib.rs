//! # cairn-fsm — Cairn's state machine data
//!
//! **Purpose.** The replicated resource table with the semantics of
//! `docs/contract.md` sections 1–3: log commands and their encoding
//! ([`Command`]), compare-and-set writes and deletes applied in log order
//! ([`Store::apply`]), consistent reads and lists at the latest or a past
//! revision ([`View`]), owner lookups, watches (a snapshot or a history replay
//! followed by live events, [`Watch`]), paginated lists whose pages all
//! reflect their first page's revision ([`View::list_page`], [`PageToken`]),
//! snapshot / restore, leases with the resources attached to them and fenced
//! writes ([`lease`]: everything but time, which the node measures), and the
//! capacity rules ([`capacity`]).
//!
//! **What it must not do.** No I/O, no async runtime, no clock, no
//! randomness, no threads: the node feeds it committed entries and gets back
//! results and events. Every outcome is a pure function of the sequence of
//! applied entries: an entry is checked at apply against fixed hard bounds
//! ([`Limits::applied`]), never against a node's configured [`Limits`],
//! which may differ between replicas and are enforced before proposing. It never panics on malformed input (a command, a resource, a
//! snapshot record); it panics only when a caller breaks an invariant below
//! (for instance applying index 5 after index 7).
//!
//! **Concurrency model.** One writer at a time applies entries under a
//! writer mutex; `apply` is O(log n). The latest state lives in persistent
//! maps (`imbl`) and is published after each entry, or after each [`Batch`]
//! of entries, as an `Arc` behind a `RwLock` that readers hold only long
//! enough to clone the `Arc`. So [`Store::view`] is O(1), a [`View`] is a
//! consistent point in time that never blocks the writer, and a view taken
//! later is never older. (Publishing makes the next write copy the tree path
//! it touches; a batch pays that once per node for all its entries.) The
//! history is an append-only log of write-once slots, so publishing it
//! copies no change.
//!
//! Watch registration takes the view and registers the subscriber under the
//! writer mutex, so the snapshot and the live events neither overlap nor
//! leave a gap. Live events are sent after the new state is published (at
//! the end of the entry or batch), still under the writer mutex, so in commit
//! order, through a bounded per-watch buffer (`tokio::sync::mpsc::try_send`,
//! which needs no runtime); a full buffer closes that watch as lagging.
//! Subscribers are indexed by (group, kind). A watch's snapshot is read lazily
//! from its view, a few dozen resources at a time, never copied into the
//! buffer. [`Watch::next`] is `async` for the node; the crate itself never
//! awaits a runtime or spawns.
//!
//! **Revisions.** The revision of a view is the applied index it reflects;
//! a resource's version is the decimal index of the entry that wrote it.
//! One entry can carry several writes and deletes ([`Command::Batch`]): their
//! changes then share its revision, each on its own key.
//! [`Store::view_at`] rebuilds a past revision (0 = the latest) from the
//! retained history (the last [`Limits::history_changes_max`] changes) by
//! undoing newer changes: older than the retained history is
//! [`FsmError::Compacted`], beyond the applied index is
//! [`FsmError::InvalidArgument`] on field `revision`. A restore committed at
//! index `I` resets the history: `I` becomes the oldest retained revision.
//!
//! ## Invariants
//! - The applied index strictly increases with every applied entry; applying
//!   an index at or below it panics.
//! - A resource's version strictly increases over its key's history, also
//!   across a restore: after a restore committed at `I`, later entries must
//!   have an index above `I` and above every version issued before (asserted).
//! - Every stored resource passed [`validate_write`] under
//!   [`Limits::applied`]; at most one resource
//!   per storage key (group, kind, partition, namespace, name).
//! - A stored resource is its encoding ([`StoredResource`]), made once when
//!   the write is applied (or the restore committed): the bytes decode to
//!   exactly the stored resource, with its assigned version, and its id in
//!   the bytes is its storage key (checked when it is made: the key always,
//!   the full decoding in debug builds). Reads, lists, events and snapshots
//!   hand out those bytes, never a new encoding.
//! - The owner index holds exactly the stored resources that have an owner,
//!   in the same persistent snapshot as the table (views agree with it).
//! - `oldest_retained_revision <= applied_index`; the history holds exactly
//!   the changes after `oldest_retained_revision`, at most
//!   `history_changes_max` of them, with non-decreasing revisions (the commands
//!   of a batch share their entry's revision).
//! - A watch delivers every matching change after its start point exactly
//!   once, in commit order, or is closed with `WatchClosed` after delivering
//!   what it buffered; it is never silently skipped. Events are sent only
//!   after readers can see the state they describe.
//! - Every page of one listing is read at the listing's first revision
//!   (asserted against the token), in storage-key order, strictly after the
//!   last key the previous page served; a page holds at most its bounds'
//!   resources and, but for a lone resource, at most their bytes.
//! - The lease index holds exactly the stored resources whose `lease` is not 0,
//!   each under a lease that exists (see [`lease`] for the lease invariants).
//! - A fenced command applies only if its fence held when its entry applied.
//! - The watch registry holds exactly the open, unclosed watches: dropping a
//!   [`Watch`] removes it; a restore removes them all.
//! - The table digest is the wrapping sum of [`integrity::entry_digest`] over exactly the
//!   stored resources (kept by the one setter, for writes, restores and installs alike), so
//!   replicas that applied the same log hold the same digest at the same index; the digests
//!   kept for past indexes are in index order and are dropped by a restore.

#![forbid(unsafe_code)]

pub mod capacity;
mod command;
mod error;
mod history;
pub mod integrity;
mod key;
pub mod lease;
pub mod lifecycle;
mod page;
mod restore;
mod scope;
pub mod selector;
mod snapshot;
mod state;
mod store;
mod stored;
mod validate;
mod version;
mod watch;

pub use capacity::{CapacityAction, SpaceState, Usage};
pub use command::{Command, COMMAND_FORMAT_VERSION};
pub use error::FsmError;
pub use integrity::{CorruptAlarm, IntegrityAction};
pub use lease::{Lease, LeaseApplied};
pub use page::{
    ListFilter, Page, PageBounds, PageToken, LIST_PAGE_BYTES_MAX, PAGE_TOKEN_CHARS_MAX,
    PAGE_TOKEN_FORMAT_VERSION,
};
pub use restore::{PendingRestoreStatus, RESTORE_ID_BYTES_MAX};
pub use scope::{ReadScope, Scope, READ_SCOPE_PATTERNS_MAX, READ_SCOPE_SCOPES_MAX};
pub use selector::{Selector, SelectorError};
pub use snapshot::{PendingSnapshot, Restoration, Snapshot, SNAPSHOT_FORMAT_VERSION};
pub use state::View;
pub use store::{Applied, Batch, DigestAt, Store};
pub use stored::{ResourceHead, StoredResource, TenancyHead, TypeHead};
pub use validate::{
    validate_fence, validate_id, validate_list, validate_write, validate_write_status, Limits,
    METADATA_ENTRIES_HARD_MAX, NAME_BYTES_HARD_MAX, RESOURCE_BYTES_HARD_MAX,
    STATUS_CONDITIONS_HARD_MAX,
};
pub use version::{ClusterVersion, ClusterVersionState, Feature, VersionAction};
pub use watch::{Event, Watch, WatchEventKind, WatchFilter, WatchStats};

#[cfg(test)]
mod send_sync {
    use super::*;

    fn assert_send_sync<T: Send + Sync>() {}
    fn assert_send<T: Send>() {}

    #[test]
    fn public_handles_cross_threads() {
        // Store and View are shared between threads; Watch, Snapshot and Restoration move.
        assert_send_sync::<Store>();
        assert_send_sync::<View>();
        assert_send::<Watch>();
        assert_send::<Snapshot>();
        assert_send::<Restoration>();
    }
}
