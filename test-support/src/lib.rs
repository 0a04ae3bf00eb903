//! # cairn-test-support: what the test suites of several crates share
//!
//! A dev-dependency only (never a dependency of a shipped crate). It holds
//! the pieces that more than one crate's tests would otherwise each define:
//!
//! - [`fuzz`]: the fuzz harnesses' byte mutations and their case count
//!   (`fsm/tests/fuzz_command.rs`, `fsm/tests/resource_head.rs`,
//!   `proto/tests/wire_identity.rs`, `raft-log/tests/fuzz_wal.rs`,
//!   `server/tests/fuzz_decoders.rs`).
//! - [`fixtures`]: the compatibility fixtures under `tests/compat/` (reading them, writing
//!   the missing ones once, and the RPCs and commands a `.proto` file declares), for
//!   `fsm/tests/compat_commands.rs`, `proto/tests/compat_wire.rs` and
//!   `server/tests/compat_wire.rs`.
//! - [`moto`]: a real S3-compatible server (moto in server mode) on a free port, for the
//!   backup targets' tests (`backup/tests/targets/s3.rs`) and the scheduled backups' system
//!   tests (`cli/tests/system/backup.rs`).

pub mod fixtures;
pub mod fuzz;
pub mod moto;
