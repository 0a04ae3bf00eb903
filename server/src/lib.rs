//! # cairn-server — the Cairn node runtime
//!
//! **Purpose.** A Cairn node as a library: wires `cairn-fsm` (state), `cairn-raft-log`
//! (durable log), `cairn-forwarding` and openraft into a node serving gRPC on its client and
//! peer ports, with its configuration, authentication, limits, probes and metrics. The
//! `cairn agent` command (crate `cairn-cli`) and any program that embeds a node ([`embed`]:
//! a configuration in, an `EmbeddedNode` out, with an in-process client implementing
//! `cairn_client::ResourceApi`) start it the same way, through [`embed`].
//!
//! **What it must not do.**
//! - Hold anything of the command line: no argument parsing, no output for a person, no
//!   progress bars, no certificate generation, no load generator. Its normal dependencies
//!   hold none of clap, indicatif, hdrhistogram or rcgen (`tests/dependencies.rs`; clap
//!   reaches it only through openraft 0.9, whose `Config` derives `clap::Parser`).
//! - Hold a contract rule: those are `cairn-fsm`'s.
//! - Let an openraft type escape the [`raft`] module.
//! - Let a module import one above it. The modules stand in rows (`docs/architecture.md`):
//!   the node ([`embed`], [`agent`]); its servers ([`ops`], [`console`], [`admin`], [`service`],
//!   [`reload`], [`grpc_metrics`]); what they go through ([`forward`], [`restore`], [`seed`],
//!   [`auth`], [`backup`]); Raft and the ports' layers ([`raft`], [`limits`], [`tls`],
//!   [`connections`], [`fatal`], [`snapshot_file`]); the leaves ([`config`], [`bounds`],
//!   [`recorder`], [`logging`], [`durable`], [`rate_limit`], [`tasks`]). A module that
//!   needs something from above takes it as a parameter or a trait. Configuration is a
//!   leaf: it imports nothing from Raft, auth or the servers.
//!
//! ## Tasks and channels
//! See [`agent`]: the Raft core and its log/state-machine tasks; the peer server
//! (Raft RPCs, forwarding); the client server (resources, admin, health,
//! reflection); the health task; the signal task; the reload task
//! ([`reload`]: grants and certificates without a restart); the scheduled backups' task
//! ([`backup`]: on the leader only, never on two members at once). Both
//! servers take their connections from [`connections`] (limits, handshake
//! deadline, minimum receive rate, idle close with GOAWAY) and, with TLS on, from [`tls`]'s configurations. Servers reach Raft only
//! through [`raft::RaftHandle`]; watch streams drain the fsm's bounded buffers.
//!
//! ## Invariants
//! - Log indices: purged <= snapshot <= applied <= committed (asserted by
//!   openraft and by the state machine adapter, which also asserts that the
//!   fsm's applied index equals Raft's after every apply).
//! - Versions strictly increase: a version is the index of the entry that
//!   carried the write, and the fsm asserts each applied index is greater than
//!   the last, also across a restore.
//! - Only validated commands enter the log: every request is validated before
//!   it is proposed.
//! - A strong read never degrades to a local read: it follows a successful
//!   `confirm_read` on the leader, or fails.
//! - A node initializes a cluster at most once (only with an empty log).
//! - A node never runs on a data dir recorded for another node id or another
//!   cluster (when a member answers), nor as a voter with a wiped dir.
//! - A node whose Raft core stopped unasked is never left running: [`fatal`]
//!   classifies why, health goes NOT_SERVING, and the process exits non-zero
//!   within `shutdown_timeout_ms`; damaged data marks the dir and refuses restarts.
//! - Nothing from the peer port reaches openraft or the executor before the
//!   peer gate (`raft::peer_gate`) admitted it: this cluster's id, a sender in
//!   the current membership, every term and index at most 2^62. A node never
//!   starts on a stored vote or log term above 2^63.
//! - Every client request is counted against its connection's budget
//!   ([`limits`]) before any work; a refusal is ResourceExhausted naming the
//!   limit.
//! - With grants configured, every client-port request is authenticated
//!   (before anything else, validation included) and authorized on the node
//!   that received it before any work is done, and
//!   list, ListByOwner and watch answers carry only resources inside the
//!   caller's read scope (see [`auth`]).

pub mod admin;
pub mod agent;
pub mod auth;
pub mod backup;
pub mod bounds;
pub mod config;
pub mod connections;
pub mod console;
pub mod durable;
pub mod embed;
pub mod fairness;
pub mod fatal;
pub mod forward;
pub mod grpc_metrics;
pub mod lease_service;
pub mod limits;
pub mod logging;
pub mod memory;
pub mod ops;
pub mod raft;
pub mod rate_limit;
pub mod recorder;
pub mod reload;
pub mod restore;
pub mod seed;
pub mod service;
pub mod snapshot_file;
pub mod tasks;
pub mod tls;
