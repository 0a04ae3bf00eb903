//! # cairn-client
//!
//! **Purpose.** The Rust client of a Cairn cluster: [`Client`] makes every
//! call of the storage contract (`docs/contract.md`: read, write, delete,
//! list, list by owner, watch) against any node, failing over between
//! endpoints, following "not leader" hints and applying one deadline per
//! call; it returns typed errors ([`ClientError`], the contract's kinds) that
//! say whether the outcome is known ([`Outcome`]). On top of it: the helpers
//! every controller needs ([`Client::create`], [`Client::create_if_absent`],
//! [`Client::read_modify_write`], [`Client::delete_current`]); the primed
//! [`WatchCache`], with its index by owner and user [`Index`]es, status
//! callbacks carrying its revision ([`StatusUpdate`]), and a
//! [`PrimingBarrier`] for many caches; how to reach the nodes
//! ([`TlsOptions`], [`BearerToken`]). [`admin::AdminClient`] is the one way to
//! the admin service (status, membership, leader transfer, snapshots): the
//! `cairn` admin commands, the load generator and a node joining a cluster all
//! use it.
//!
//! Leases and elections ([`lease`], [`election`]): [`Client::grant_lease`] gives a
//! [`Lease`] that keeps itself alive on a task of its own and says when it must be
//! assumed lost (the send time of the last acknowledged keep-alive plus the TTL);
//! [`Election::campaign`] holds an election with it, as one resource attached to the
//! lease, and gives a [`Leadership`] whose fencing token the cluster checks at apply
//! ([`Leadership::fence`]).
//!
//! [`ResourceApi`] ([`api`]) is the contract's calls as one trait, with
//! resources shared (`Arc<Resource>`): [`Client`] implements it, and so does
//! an embedded node's in-process client (`cairn_server::embed`). A
//! [`WatchCache`] runs over either, and so does any controller written
//! against the trait.
//!
//! Lists are paged by the nodes: [`Client::list`] and
//! [`Client::list_request`] follow the pages to the end (every page reflects
//! the first page's revision, and a listing whose revision was compacted
//! between pages starts again, a bounded number of times);
//! [`Client::list_page`] asks for one page and [`Client::list_pages`] hands
//! them out one at a time.
//!
//! A library only: no command line, no argument parsing. The `cairn` data
//! commands (`cairn read`, `write`, ...) are built on it in the cli crate
//! (`cairn_cli::data`).
//!
//! **What it must not do.** Retry a write or delete after an attempt whose
//! outcome is unknown (it could then report "CAS failure" for a write that
//! applied: see [`client`]'s module docs for the rules); report success
//! without the node's acknowledgement; classify an error by its message text
//! (kinds travel in the status details, via `cairn_proto::error::ApiError`);
//! show a half-filled cache as primed; or hand a cache subscriber a
//! duplicate or an older version of a resource. It never panics on what a
//! node or a file sends it.
//!
//! **Concurrency model.** A [`Client`] is `Clone + Send + Sync`; clones share
//! one eagerly connected channel per endpoint (HTTP/2, multiplexed) and the
//! preferred endpoint, both behind a short `parking_lot` mutex never held
//! across an await. Each call is a future on the caller's Tokio runtime; the
//! client spawns nothing for them. A [`WatchCache`] spawns one task per watched
//! type; the tasks apply changes (maps, indexes and revisions together) and
//! status changes under the cache's dispatch lock then its table lock (always
//! in that order) and run subscriber and status callbacks under the dispatch
//! lock only, so readers of the table never wait for a callback. Dropping the
//! cache aborts its tasks. A [`Lease`] spawns one task (its keep-alives) and a
//! [`Leadership`] one (its watch of the election); each ends with its handle.
//! A [`PrimingBarrier`] only watches the caches' primed flags; it spawns
//! nothing.
//!
//! ## Invariants
//! - A write or delete is sent again only after an attempt that certainly
//!   did not apply (connect failure, NotLeader, Unavailable answered by a
//!   node); any other failure after sending is returned with
//!   [`Outcome::Unknown`].
//! - Every call ends by its deadline ([`ClientOptions::request_timeout`]),
//!   failovers and backoff included.
//! - A created resource always carries a uid (a new ULID when none is given).
//! - `WatchCache::wait_primed` returns only after every watched type's
//!   snapshot (up to its EndOfSnapshot) is in the cache.
//! - For each key, the versions a cache subscriber sees strictly increase
//!   between deletes, compared as numbers; a change is delivered once.
//! - A cache's revision for a type never decreases: a snapshot older than
//!   what the cache already holds is discarded, never applied.
//! - After a fresh snapshot, a type's cached keys are exactly the snapshot's
//!   (mark and sweep: a Delete for every key it lacks).
//! - A cache's indexes change in the same critical section as its maps: a
//!   reader finds in `list_by_owner` and `by_index` exactly what a scan of
//!   the table at that moment would.
//! - Status callbacks see every status change once, in order; InSync always
//!   carries a revision. Once primed, a cache stays primed.
//! - A [`Lease`] is held no later than the send time of its last acknowledged
//!   keep-alive (or grant) plus its TTL; once lost it is never held again. A
//!   [`Leadership`] is lost once its lease is, or once its election resource is
//!   no longer stored at its uid and token.

#![forbid(unsafe_code)]

pub mod admin;
pub mod api;
pub mod auth;
pub mod barrier;
pub mod client;
pub mod election;
mod error;
mod helpers;
pub mod index;
pub mod lease;
pub mod tls;
pub mod watch_cache;

pub use api::{Listing, ResourceApi, Watch};
pub use auth::{AuthenticatedChannel, BearerToken, Credentials};
pub use barrier::PrimingBarrier;
pub use client::{
    watch_resume_revision, Client, ClientOptions, ListPages, WatchProgress, WatchStream,
    LIST_RESTARTS_MAX,
};
pub use election::{Election, Holder, Leadership, LeadershipLoss, Observer};
pub use error::{ClientError, Outcome};
pub use helpers::new_uid;
pub use index::Index;
pub use lease::{Lease, LeaseLoss, LeaseRevoked, LeaseState};
pub use tls::{Access, TlsOptions};
pub use watch_cache::{
    CacheEvent, CacheStats, CacheStatus, ResourceKey, StatusUpdate, SubscriptionId, WatchCache,
    WatchCacheBuilder, WatchCacheOptions, WatchSpec,
};

/// A resource's `data`: `google.protobuf.Any`, re-exported with [`v1`].
pub use cairn_proto::google::protobuf::Any;
/// The generated protobuf types, re-exported for convenience.
pub use cairn_proto::v1;

/// `README.md`'s example, compiled with the doc-tests so that it cannot drift.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
