//! Where Cairn's scheduled backups go, and how they come back.
//!
//! A backup is a snapshot file (Cairn's own format). This crate stores such files in a
//! *target* — a local directory or a bucket of S3 or an S3-compatible server, both through
//! [`object_store`] with one code path — and lists, fetches, deletes and prunes them:
//!
//! - [`TargetSpec`] parses where the backups go (`/abs/dir`, `file:///abs/dir`,
//!   `s3://bucket/prefix` with [`S3Options`]); [`BackupTarget::open`] opens it.
//! - [`BackupName`] is a backup's object name, which tells a listing the cluster, the log
//!   index and the creation time without downloading anything
//!   (`cairn-<cluster_id>-<created_unix_ms:020>-<index:020>.snap`).
//! - [`BackupTarget::put_verified`] uploads a file, reads it back, has the caller verify
//!   the copy, and only then publishes it under its name.
//! - [`BackupTarget::list`], [`BackupTarget::fetch`], [`BackupTarget::delete`];
//!   [`decide_retention`] (pure) and [`BackupTarget::apply_retention`] prune.
//! - [`read_credentials_file`] reads S3 credentials from a file in the AWS shared
//!   credentials format (so that a configuration names a file, never a secret);
//!   [`S3Options::with_credentials`] puts them in the options.
//! - [`BackupError`] sorts every failure so a caller can act on it ([`BackupError::kind`]:
//!   refused, full, missing target, not found, verify, ...).
//!
//! What it must not do: depend on the server (`cairn-server` depends on this crate: the
//! snapshot check, `cairn_server::snapshot_file::verify`, comes in as the verify callback);
//! create buckets or directories (an absent mount point must not be filled on the disk
//! under it); hold a whole backup in memory; touch an object that is not one of its own
//! names; show a credential in a message.
//!
//! The names hold the cluster id: whoever can list the target learns it (whoever can read a
//! backup reads it in the snapshot's header anyway). A target is as private as its backups.
//!
//! # Invariants
//!
//! 1. **A final-named object was read back and verified before it got its name**: it was
//!    uploaded as `<name>.part`, downloaded whole into a local copy whose size and crc32c
//!    equal what was sent, and that copy passed the caller's verify, which named the
//!    cluster and index the name says. Only then is `.part` copied to the name
//!    ([`BackupTarget::put_verified`], in that order, each step returning early on failure).
//! 2. A failed upload, read-back or verify leaves no object under the final name, and
//!    removes `<name>.part` (best effort; a leftover `.part` is pruned after
//!    [`Retention::leftover_grace`]). A published object whose size then differs from what
//!    was verified is removed.
//! 3. **Prune never removes the newest verified backup** of its cluster:
//!    [`decide_retention`] keeps rank 0 (asserted there), and
//!    [`BackupTarget::apply_retention`] skips it again before deleting.
//! 4. Retention never removes another cluster's backups, nor foreign objects: only names
//!    that parse as this cluster's ([`ObjectName`]).
//! 5. Everything is bounded: a listing reads at most [`Limits::list_objects_max`] objects;
//!    an upload holds at most `part_bytes × (parts_in_flight + 1)` bytes of the file; a
//!    download streams to a local file and stops past the size expected.
//! 6. A fetch never overwrites a file and never leaves a partial one at its destination.

mod credentials;
mod error;
mod listing;
mod name;
mod retention;
mod spec;
mod target;

pub use credentials::{
    parse_credentials, read_credentials_file, CredentialsError, ParseError, S3Credentials,
    CREDENTIALS_FILE_BYTES_MAX,
};
pub use error::BackupError;
pub use listing::{Leftover, Listing, StoredBackup};
pub use name::{
    BackupName, NameError, ObjectName, CLUSTER_ID_BYTES_MAX, NAME_PREFIX, NAME_SUFFIX, PART_SUFFIX,
};
pub use retention::{decide_retention, Retention, RetentionDecision, LEFTOVER_GRACE_DEFAULT};
pub use spec::{S3Options, SpecError, TargetSpec};
pub use target::{BackupTarget, Limits, Phase, Progress, Verified};

/// The object store crate this one is built on (for [`BackupTarget::with_store`]).
pub use object_store;
