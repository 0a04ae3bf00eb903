//! The cli crate's tests against real `cairn` processes, real sockets and real disks,
//! in one test binary: one link of the server instead of one per file. Each module is
//! what was one test file; `cargo test -p cairn-cli --test system MODULE::` runs one.

mod api_contract;
mod client_support;
mod support;

mod admin_cli;
mod auth;
mod backup;
mod bench;
mod capacity;
mod capacity_memcg;
mod check;
mod client_cli;
mod client_cluster;
mod cluster;
mod cluster_version;
mod compat;
mod config;
mod connections;
mod console;
mod contract;
mod controller_cache;
mod data_dir;
mod deploy;
mod drills;
mod fairness;
mod fatal;
mod follower_reads;
mod forwarding;
mod grpc_error_model;
mod hostile_peer;
mod in_process;
mod integrity;
mod lease_service;
mod leases;
mod lifecycle;
mod limits;
mod logs;
mod online_restore;
mod ops;
mod pages;
mod reload;
mod replication;
mod snapshot;
mod tls;
mod write_stages;
