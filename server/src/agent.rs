//! `cairn agent`: one node. Tasks (all on one tokio runtime; every long-lived
//! one is started through `crate::tasks::Tasks`, owned by the [`Agent`], and
//! stopped and joined in [`Agent::shutdown`] before Raft stops):
//!
//! - openraft's core, log writer and state-machine tasks (inside `raft`);
//! - the peer gRPC server (Raft RPCs, forwarding) and the client gRPC server
//!   (resources, admin, health, reflection);
//! - the write batcher, the read-batch driver, the log-growth watcher and the
//!   check-quorum task (`RaftHandle::start`);
//! - the leader watcher (`forward::start`): calls the forwarding channel's
//!   leader-change hook on every leader change seen in Raft's metrics;
//! - the orphan-restore check (`restore`): aborts restores whose driver is gone;
//! - the bootstrap or join task (once, at start);
//! - the health task: gRPC health is SERVING while the readiness checks of
//!   `ops::Probes` pass (no storage fault, a known leader, a linearizable read,
//!   applied close to the leader's commit index, a member), NOT_SERVING
//!   otherwise (both ways, as often as that changes);
//! - the ops listener (`ops`, with `metrics_address`): /metrics, /livez, /readyz;
//! - the scheduled backups (`backup`, with `backup_target`): idle but on the leader, which
//!   takes one every `backup_interval_ms` (never two members at once);
//! - the core watcher: when openraft's core stops without being asked to, it
//!   sets health NOT_SERVING at once, classifies why (`crate::fatal`), logs the
//!   one line (and marks a damaged data dir), and hands the cause to the
//!   process, which shuts down within `shutdown_timeout_ms` and exits non-zero;
//! - the signal task (the `cairn agent` command's, in the `cairn-cli` crate): SIGTERM/SIGINT → hand leadership off (if
//!   leader) → stop, within `shutdown_timeout_ms` (`fatal::Watchdog`);
//! - the reload task (`reload`): SIGHUP → the configuration read again, new
//!   grants and new certificates; changed certificate files → new
//!   certificates for new connections;
//! - per port, one task accepting connections and, per connection, one task
//!   (`connections::serve`): its handshake, then a gRPC server of its own.
//!
//! Channels: the servers reach Raft only through `RaftHandle`; watch streams
//! read from the fsm's bounded per-watch buffers; a fatal cause travels from
//! the core watcher to the process in a `watch` channel.
//!
//! Before Raft starts, the data dir is checked: a damaged-data marker refuses
//! the start; the node id recorded in the dir must be this node's (recorded now
//! for a new dir); the running cluster, when one answers, must be the dir's
//! cluster, and must not still count this node as a voter when the dir is empty.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use cairn_proto::error::ApiError;
use cairn_proto::v1::admin_service_server::AdminServiceServer;
use cairn_proto::v1::lease_service_server::LeaseServiceServer;
use cairn_proto::v1::shared::resource_service_server::ResourceServiceServer;
use cairn_proto::v1::{self as pb};
use tokio::sync::watch;

use crate::admin::Admin;
use crate::config::{Config, ConfigSource};
use crate::connections::{ActivityLayer, PortLimits};
use crate::fatal::{FatalCause, NodeContext, ShutdownProgress};
use crate::grpc_metrics;
use crate::raft::{ClusterIdentity, NodeInfo, RaftHandle, RaftSettings};
use crate::service::{ResourceApi, ResourceGrpc};
use crate::tls::NodeTls;
use cairn_client::admin::{AdminClient, Operation};

pub fn limits(config: &Config) -> cairn_fsm::Limits {
    cairn_fsm::Limits {
        resource_bytes_max: config.resource_bytes_max,
        name_bytes_max: config.name_bytes_max,
        history_changes_max: config.history_changes_max,
        history_bytes_max: usize::try_from(config.capacity().1).unwrap_or(usize::MAX),
        watch_buffer_events: config.watch_buffer_events,
        metadata_entries_max: config.metadata_entries_max,
        list_results_max: config.list_results_max,
        list_page_size_max: config.list_page_size_max,
        status_conditions_max: config.status_conditions_max,
        watch_buffer_bytes_max: config.watch_buffer_bytes_max,
        watch_buffers_bytes_max: config.watch_buffers_bytes_max,
        lease_ttl_min_ms: config.lease_ttl_min_ms,
        lease_ttl_max_ms: config.lease_ttl_max_ms,
        leases_max: config.leases_max,
    }
}

/// A running node; dropped or shut down by [`Agent::shutdown`].
pub struct Agent {
    pub raft: RaftHandle,
    /// What the client port runs once a caller is admitted; also the in-process
    /// client's way in ([`crate::embed`]).
    api: Arc<ResourceApi>,
    /// The admin service (also used to hand leadership off on shutdown).
    admin: Admin,
    /// Every long-lived task of the node (servers, batchers, watchers), stopped and joined
    /// in [`Agent::shutdown`] before Raft stops.
    tasks: crate::tasks::Tasks,
    health: Arc<Health>,
    /// Set before a requested shutdown: the core stopping then is no fatal condition.
    stopping: Arc<AtomicBool>,
    /// The cause the core watcher found, once it found one.
    fatal: watch::Receiver<Option<FatalCause>>,
    _lock: cairn_raft_log::DirLock,
}

/// gRPC health of the client port: the overall status ("") and ResourceService's, set
/// together, only when they change.
struct Health {
    reporter: tonic_health::server::HealthReporter,
    serving: tokio::sync::Mutex<Option<bool>>,
}

impl Health {
    async fn set(&self, serving: bool) {
        self.set_unless(serving, None).await
    }

    /// [`Health::set`], unless `stopping` is set: checked under the lock, so that the
    /// NOT_SERVING a stop sets after setting `stopping` is never overwritten.
    async fn set_unless(&self, serving: bool, stopping: Option<&AtomicBool>) {
        let mut current = self.serving.lock().await;
        if stopping.is_some_and(|s| s.load(Ordering::SeqCst)) {
            return;
        }
        if *current == Some(serving) {
            return;
        }
        let status = if serving {
            tonic_health::ServingStatus::Serving
        } else {
            tonic_health::ServingStatus::NotServing
        };
        self.reporter.set_service_status("", status).await;
        self.reporter
            .set_service_status(
                <ResourceServiceServer<ResourceGrpc> as tonic::server::NamedService>::NAME,
                status,
            )
            .await;
        if current.is_some() || serving {
            tracing::info!(serving, "health changed");
        }
        *current = Some(serving);
    }
}

/// The address a listener is bound to (the configured one if the socket cannot say).
fn bound(listener: &tokio::net::TcpListener, configured: &str) -> String {
    listener
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_else(|_| configured.to_string())
}

/// Listens on `address` (the setting `field`): an IP, or a host name resolved now (the
/// first of its addresses that binds; the start-up line of each listener shows it).
async fn bind(field: &str, address: &str) -> anyhow::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(address)
        .await
        .with_context(|| format!("cannot listen on {field} {address}"))
}

impl Agent {
    /// Starts a node on `config`, which `source` loaded (and loads again
    /// on SIGHUP, for what can change without a restart).
    pub async fn start(config: Config, source: ConfigSource) -> anyhow::Result<Agent> {
        crate::config::warn_ignored_environment();
        // `DirLock::acquire` creates the data dir and makes its name durable (an fsync of
        // its parent): a data dir created here first would never have its name synced, and
        // a power cut soon after could lose the whole node's state.
        let lock = lock_data_dir(
            &config.data_dir,
            Duration::from_millis(config.shutdown_timeout_ms),
        )
        .await?;
        crate::fatal::check_marker(&config.data_dir)?;
        // A backup interrupted by a crash left its spool file behind.
        crate::backup::remove_spool_leftovers(&config.data_dir)
            .context("cannot remove the backup spool's leftovers")?;
        let fresh = !crate::raft::holds_node_state(&config.data_dir);
        let identity = Arc::new(ClusterIdentity::open(&config.data_dir)?);
        let recorded_node_id = identity.node_id()?;
        if let Some(recorded) = recorded_node_id {
            crate::raft::check_node_id(&config.data_dir, recorded, config.node_id)
                .map_err(|reason| FatalCause::DataDirRefused { reason })?;
        }
        let auth = Arc::new(crate::auth::Authenticator::from_config(&config.auth)?);
        let node_token = crate::auth::load_node_token(&config.auth)?;
        crate::auth::log_auth_mode(&auth.current(), node_token.as_ref());
        let (client_limits, peer_limits) = port_limits(&config);
        let tls = NodeTls::load(&config).context("TLS")?;
        // How this node calls other nodes' client ports: over TLS when it
        // serves TLS, presenting its own token when auth is on.
        let access = cairn_client::Access {
            tls: tls.as_ref().map(|t| t.outgoing.clone()),
            credentials: Default::default(),
        }
        .with_token(node_token.as_ref());
        let join_status = check_against_cluster(&config, &access, &identity, fresh).await?;
        if recorded_node_id.is_none() && fresh {
            // A new data dir records whose it is. One written before node ids were recorded
            // settles its id from its stored membership when Raft opens it.
            identity.record_node_id(config.node_id)?;
        }
        let settings = RaftSettings {
            election_timeout_ms: config.election_timeout_ms,
            heartbeat_interval_ms: config.heartbeat_interval_ms,
            snapshot_log_entries: config.snapshot_log_entries,
            snapshot_log_bytes: config.snapshot_log_bytes,
            snapshot_chunk_bytes: config.snapshot_chunk_bytes,
            write_stage_timing: config.write_stage_timing,
            write_in_flight: crate::raft::write_batch::InFlight {
                proposals_max: config.write_proposals_in_flight_max,
                bytes_max: config.write_proposal_bytes_in_flight_max,
            },
            log_engine: config.log_engine,
            peer_message_bytes_max: config.peer_message_bytes_max,
            replication_batch_bytes_max: config.replication_batch_bytes_max,
            bootstrap_members: config.members.iter().map(|m| m.id).collect(),
            tls: access.tls.clone(),
            own_peer_address: config.peer_address.clone(),
            unsafe_skip_fsync: config.unsafe_modes.unsafe_skip_fsync,
            unsafe_lease_wall_clock: config.unsafe_modes.unsafe_lease_wall_clock,
            data_bytes_max: config.capacity().0,
        };
        for mode in config.unsafe_modes.enabled() {
            tracing::warn!("{mode}: DANGEROUS test-only mode on; this node breaks its contract");
        }
        let limits = Arc::new(limits(&config));
        // Every long-lived task of the node, owned here and stopped in `shutdown`.
        let mut tasks = crate::tasks::Tasks::new();
        let raft = RaftHandle::start(
            config.node_id,
            &config.data_dir,
            &settings,
            (*limits).clone(),
            identity.clone(),
            &mut tasks,
        )
        .await?;
        if let Some(status) = &join_status {
            // The peer port admits only this cluster's members: learn who they are (and the
            // cluster id) before asking to be added, so that the leader's first message is
            // admitted.
            raft.gate
                .joining(
                    &status.cluster_id,
                    status.members.iter().map(|m| m.id).collect(),
                )
                .context("cannot persist the cluster id")?;
        }

        let peer_listener = bind("peer_address", &config.peer_address).await?;
        let client_listener = bind("client_address", &config.client_address).await?;
        let ops_listener = match &config.metrics_address {
            Some(address) => Some(bind("metrics_address", address).await?),
            None => None,
        };
        let stopped = tasks.stopped();
        match &tls {
            Some(_) => tracing::info!(
                client = %config.client_address,
                peer = %config.peer_address,
                client_certificates = ?config.tls_client_auth,
                "serving TLS on the client port and mutual TLS on the peer port"
            ),
            None => tracing::warn!(
                client = %config.client_address,
                peer = %config.peer_address,
                "serving PLAINTEXT on the client and peer ports: anyone who can reach them \
                 can read and change the cluster (set tls_cert_file, tls_key_file and tls_ca_file)"
            ),
        }
        tasks.adopt(
            "reload",
            crate::reload::spawn(
                crate::reload::Reloader {
                    source,
                    started: config.clone(),
                    tls: tls.clone(),
                    auth: auth.clone(),
                    node_credentials: access.credentials.clone(),
                },
                (config.tls_reload_interval_ms > 0)
                    .then(|| Duration::from_millis(config.tls_reload_interval_ms)),
                stopped.clone(),
            )?,
        );

        // Forwarding: the client port's forwarder, the peer port's service,
        // and the task feeding leader changes to the cached leader channel.
        let request_timeout = Duration::from_millis(config.request_timeout_ms);
        let forwarding = crate::forward::start(&raft, &config, access.tls.clone(), &mut tasks);

        // Peer port.
        tracing::info!(
            address = %bound(&peer_listener, &config.peer_address),
            tls = tls.is_some(),
            "serving peers on the peer port (Raft, forwarded requests)"
        );
        let peer_router = server_builder(&config)
            .add_service(raft.rpc_service(stopped.clone()))
            .add_service(forwarding.service);
        tasks.spawn_graceful(
            "peer server",
            crate::connections::serve(
                peer_listener,
                tls.as_ref().map(|t| t.peer_port.clone()),
                peer_limits,
                peer_router,
                stopped.clone(),
            ),
        );

        // Client port.
        let connection_limits =
            crate::limits::ConnectionLimits::new(crate::limits::ConnectionBudget {
                requests_per_connection_max: config.requests_per_connection_max,
                watches_per_connection_max: config.watches_per_connection_max,
                watches_max: config.watches_max,
            });
        let api = Arc::new(
            ResourceApi::new(forwarding.forwarder, auth.clone(), request_timeout)
                .with_stop(stopped.clone())
                .with_connection_limits(connection_limits.clone())
                .with_unsafe_modes(config.unsafe_modes.clone())
                .with_fairness(
                    Arc::new(crate::fairness::Fairness::new(
                        Duration::from_millis(config.client_rate_wait_ms_max),
                        config.writes_in_flight_max,
                    )),
                    crate::fairness::Rates {
                        requests_per_second: config.client_requests_per_second_max,
                        bytes_per_second: config.client_bytes_per_second_max,
                    },
                ),
        );
        // Eventual reads are served once a read index confirmed since this start is applied
        // here; confirm one now rather than on the first read, so that a follower cut off
        // from the leader later still serves what it holds.
        tasks.spawn("catch up after start", {
            let api = api.clone();
            let round = Duration::from_millis(config.election_timeout_ms * 4);
            async move { api.forwarder().catch_up_after_start(round).await }
        });
        let (health_reporter, health_service) = tonic_health::server::health_reporter();
        let health = Arc::new(Health {
            reporter: health_reporter,
            serving: tokio::sync::Mutex::new(None),
        });
        health.set(false).await;
        let reflection = tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(cairn_proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            .build_v1()?;
        let restorer = crate::restore::Restorer::new(
            raft.clone(),
            &config.data_dir,
            config.restore_upload_bytes_max,
        );
        tasks.spawn(
            "orphan-restore check",
            restorer
                .clone()
                .abort_orphans(Duration::from_millis(config.election_timeout_ms)),
        );
        let admin = Admin {
            raft: raft.clone(),
            election_timeout: Duration::from_millis(config.election_timeout_ms),
            restorer: restorer.clone(),
            auth: auth.clone(),
            access: access.clone(),
            data_dir: config.data_dir.clone(),
            started: Instant::now(),
        };
        // Keep-alives arriving together share one log entry.
        let (keep_alives, gathering) = crate::lease_service::KeepAliveBatcher::start(api.clone());
        tasks.spawn("lease keep-alives", gathering);
        // Every client service counts against `requests_per_connection_max`.
        let limited = crate::limits::RequestLimitLayer::new(
            connection_limits,
            config.client_message_bytes_max,
        );
        let client_router = server_builder(&config)
            .add_service(grpc_metrics::wrap(
                limited.wrap(
                    ResourceServiceServer::new(ResourceGrpc(api.clone()))
                        .max_decoding_message_size(config.client_message_bytes_max)
                        .max_encoding_message_size(config.client_message_bytes_max),
                ),
            ))
            .add_service(grpc_metrics::wrap(
                limited.wrap(
                    AdminServiceServer::new(admin.clone())
                        .max_decoding_message_size(config.client_message_bytes_max)
                        .max_encoding_message_size(config.client_message_bytes_max),
                ),
            ))
            .add_service(grpc_metrics::wrap(
                limited.wrap(
                    LeaseServiceServer::new(crate::lease_service::LeaseGrpc::new(
                        api.clone(),
                        keep_alives,
                        raft.store.clone(),
                        raft.leases.clone(),
                    ))
                    .max_decoding_message_size(config.client_message_bytes_max)
                    .max_encoding_message_size(config.client_message_bytes_max),
                ),
            ))
            .add_service(grpc_metrics::wrap(limited.wrap(health_service)))
            .add_service(grpc_metrics::wrap(limited.wrap(reflection)));
        tracing::info!(
            address = %bound(&client_listener, &config.client_address),
            tls = tls.is_some(),
            "serving clients on the client port (resources, admin, health)"
        );
        tasks.spawn_graceful(
            "client server",
            crate::connections::serve(
                client_listener,
                tls.as_ref().map(|t| t.client_port.clone()),
                client_limits,
                client_router,
                stopped.clone(),
            ),
        );

        let self_info = NodeInfo {
            peer_address: config.peer_address.clone(),
            client_address: config.client_address.clone(),
        };
        if let Some(join) = config.join.clone() {
            let raft = raft.clone();
            let access = access.clone();
            let added_by_hand = join_status
                .as_ref()
                .is_some_and(|s| s.members.iter().any(|m| m.id == config.node_id && !m.voter));
            tasks.spawn("join", async move {
                if let Err(e) = join_cluster(&raft, &join, &access, self_info, added_by_hand).await
                {
                    tracing::error!(error = %e, "joining the cluster failed");
                    eprintln!("cairn: joining the cluster through {join} failed: {e}");
                }
            });
        } else {
            bootstrap(&raft, &config).await?;
        }

        let stopping = Arc::new(AtomicBool::new(false));
        // The leader raises the cluster version once every member supports a higher one.
        tasks.spawn(
            "cluster version",
            crate::raft::cluster_version::raise_when_supported(raft.clone()),
        );
        // The leader sets the cluster's space quota to the lowest its members ask for.
        tasks.spawn(
            "space quota",
            crate::raft::capacity::keep_quota(raft.clone()),
        );
        tasks.spawn(
            "lease expiry",
            crate::raft::leases::expire_leases(raft.clone()),
        );
        tasks.spawn(
            "owner collection",
            crate::raft::collector::collect_dependents(raft.clone()),
        );
        // Replicas that check each other: the leader's periodic check (a leader the CORRUPT
        // alarm names hands leadership off through the admin service's transfer), and this
        // member's own check against the leader once it has caught up after its start.
        let hand_off: crate::raft::integrity::HandOff = {
            let admin = admin.clone();
            Arc::new(move || {
                let admin = admin.clone();
                Box::pin(async move { admin.transfer_leader(0).await.map(|_| ()) })
            })
        };
        tasks.spawn(
            "consistency check",
            crate::raft::integrity::run(
                raft.clone(),
                Duration::from_millis(config.consistency_check_interval_ms),
                hand_off,
            ),
        );
        tasks.spawn(
            "consistency check at start",
            crate::raft::integrity::check_at_start(raft.clone(), Duration::from_secs(120)),
        );
        // Scheduled backups: on the leader only (`crate::backup`, invariant 1).
        if let Some(schedule) = crate::backup::Schedule::of(&config) {
            tasks.spawn(
                "scheduled backups",
                crate::backup::run(raft.clone(), schedule),
            );
        }
        if config.unsafe_modes.unsafe_alter_applied_state {
            tasks.spawn(
                "unsafe: alter the applied state",
                crate::raft::integrity::unsafe_alter_applied_state(raft.clone()),
            );
        }
        let (fatal_sender, fatal) = watch::channel(None);
        tasks.spawn(
            "core watcher",
            watch_core(
                raft.clone(),
                health.clone(),
                stopping.clone(),
                fatal_sender,
                NodeContext::of(&config),
            ),
        );
        let probes = crate::ops::Probes {
            raft: raft.clone(),
            api: api.clone(),
            fatal: fatal.clone(),
            data_dir: config.data_dir.clone(),
            apply_lag_entries_max: config.ready_apply_lag_entries_max,
            timeout: Duration::from_millis(config.election_timeout_ms * 2),
        };
        if let Some(listener) = ops_listener {
            let address = bound(
                &listener,
                config.metrics_address.as_deref().unwrap_or_default(),
            );
            let console = match config.web_console {
                crate::config::WebConsole::On => {
                    tracing::info!(
                        %address,
                        "serving /metrics, /livez, /readyz and the console (/ui) on the ops port (plain HTTP)"
                    );
                    Some(crate::console::Console::new(
                        admin.clone(),
                        api.clone(),
                        auth.clone(),
                        tls.is_some()
                            && config.tls_client_auth == crate::config::ClientAuthMode::Required,
                    ))
                }
                crate::config::WebConsole::Off => {
                    tracing::info!(
                        %address,
                        "serving /metrics, /livez and /readyz on the ops port (plain HTTP); the console is off (web_console = \"off\")"
                    );
                    None
                }
            };
            tasks.adopt(
                "ops server",
                crate::ops::spawn(listener, probes.clone(), console, stopped.clone()),
            );
        }
        tasks.spawn(
            "health",
            run_health(probes, health.clone(), fatal.clone(), stopping.clone()),
        );
        tracing::debug!(tasks = ?tasks.names(), "started");

        Ok(Agent {
            raft,
            api,
            admin,
            tasks,
            health,
            stopping,
            fatal,
            _lock: lock,
        })
    }

    /// The node's request layer as the client port runs it for an admitted caller.
    pub fn resource_api(&self) -> &Arc<ResourceApi> {
        &self.api
    }

    /// Waits until the node cannot go on (openraft's core stopped unasked), and says why.
    /// The cause's line is logged (and a damaged data dir marked) by then.
    pub async fn fatal(&mut self) -> FatalCause {
        loop {
            if let Some(cause) = self.fatal.borrow_and_update().clone() {
                return cause;
            }
            if self.fatal.changed().await.is_err() {
                // The watcher is gone without a cause: nothing will ever come.
                std::future::pending::<()>().await;
            }
        }
    }

    /// Graceful stop: health goes NOT_SERVING, a leader hands off first, then servers and
    /// Raft stop, each step bounded within `deadline` (the caller's `fatal::Watchdog` ends the
    /// process if a step still does not return). `progress` names the step under way.
    /// Membership never changes on shutdown.
    pub async fn shutdown(
        self,
        election_timeout: Duration,
        deadline: Duration,
        progress: &ShutdownProgress,
    ) {
        let started = Instant::now();
        let left = || deadline.saturating_sub(started.elapsed());
        self.stopping.store(true, Ordering::SeqCst);
        self.health.set(false).await;
        if self.raft.is_leader() && self.raft.status().voters.len() > 1 {
            progress.set("the leadership hand-off");
            let admin = Admin {
                election_timeout,
                ..self.admin.clone()
            };
            // At most half the deadline: the rest is for stopping.
            let bound = (election_timeout * 5).min(deadline / 2);
            match tokio::time::timeout(bound, admin.transfer_leader(0)).await {
                Ok(Ok(_)) => tracing::info!("handed leadership off before stopping"),
                Ok(Err(e)) => tracing::warn!(error = %e, "could not hand leadership off"),
                Err(_) => tracing::warn!("leadership hand-off timed out"),
            }
        }
        progress.set("stopping the node's tasks (servers, batchers, watchers)");
        self.tasks
            .stop(Duration::from_secs(2).min(left() / 2))
            .await;
        progress.set("stopping Raft (the openraft core, the state machine and the Raft log)");
        self.raft.shutdown().await;
        progress.set("closing the Raft log");
    }
}

/// The limits of the client and peer ports, fitted under the process's
/// file-descriptor limit (raised to its hard value first).
fn port_limits(config: &Config) -> (PortLimits, PortLimits) {
    let (client_max, peer_max) = match crate::connections::raise_fd_limit() {
        Ok(fd_limit) => {
            let (client, peer, reserve) = crate::connections::connection_budget(
                fd_limit,
                config.client_connections_max,
                config.peer_connections_max,
            );
            if (client, peer) != (config.client_connections_max, config.peer_connections_max) {
                tracing::warn!(
                    fd_limit,
                    reserve,
                    client_connections_max = client,
                    peer_connections_max = peer,
                    "connection limits lowered to fit under the file-descriptor limit"
                );
            }
            (client, peer)
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the file-descriptor limit");
            (config.client_connections_max, config.peer_connections_max)
        }
    };
    let handshake_timeout = Duration::from_millis(config.handshake_timeout_ms);
    let idle_timeout = (config.connection_idle_timeout_ms > 0)
        .then(|| Duration::from_millis(config.connection_idle_timeout_ms));
    let receive_rate =
        (config.receive_bytes_per_second_min > 0).then(|| crate::connections::ReceiveRate {
            bytes_per_second_min: config.receive_bytes_per_second_min,
            stall_timeout: Duration::from_millis(config.receive_stall_timeout_ms),
        });
    (
        PortLimits {
            port: "client",
            connections_max: client_max,
            handshake_timeout,
            idle_timeout,
            receive_rate,
        },
        PortLimits {
            port: "peer",
            connections_max: peer_max,
            handshake_timeout,
            idle_timeout,
            receive_rate,
        },
    )
}

/// A gRPC server with the node's HTTP/2 settings, counting requests in
/// flight per connection (for the idle timeout).
fn server_builder(
    config: &Config,
) -> tonic::transport::Server<tower_layer::Stack<ActivityLayer, tower_layer::Identity>> {
    tonic::transport::Server::builder()
        .tcp_nodelay(true)
        .http2_keepalive_interval(Some(Duration::from_millis(config.keepalive_interval_ms)))
        .http2_keepalive_timeout(Some(Duration::from_millis(config.keepalive_timeout_ms)))
        .layer(ActivityLayer)
}

/// Takes the data dir's lock. A node restarted at once (a rolling restart by hand: `kill`,
/// then start) finds it held by its predecessor, which may still be handing leadership off;
/// that one exits within its `shutdown_timeout_ms`, so the lock is waited for that long
/// (saying so once), and only then refused, naming the holder.
async fn lock_data_dir(dir: &Path, wait: Duration) -> anyhow::Result<cairn_raft_log::DirLock> {
    let deadline = tokio::time::Instant::now() + wait;
    let mut said = false;
    loop {
        match cairn_raft_log::DirLock::acquire(dir) {
            Ok(lock) => return Ok(lock),
            Err(cairn_raft_log::LogError::Locked { holder_pid, .. })
                if tokio::time::Instant::now() < deadline =>
            {
                if !said {
                    said = true;
                    tracing::warn!(
                        data_dir = %dir.display(),
                        holder_pid,
                        wait_ms = wait.as_millis() as u64,
                        "the data dir is locked by another process (a node still stopping?); \
                         waiting for it to exit"
                    );
                }
                tokio::time::sleep(DATA_DIR_LOCK_POLL).await;
            }
            Err(e @ cairn_raft_log::LogError::Locked { .. }) => anyhow::bail!(
                "data dir {}: {e}, still after {} ms (shutdown_timeout_ms): another node runs \
                 on this data dir; stop it first",
                dir.display(),
                wait.as_millis()
            ),
            Err(e) => return Err(e).with_context(|| format!("data dir {}", dir.display())),
        }
    }
}

/// How often a locked data dir is tried again.
const DATA_DIR_LOCK_POLL: Duration = Duration::from_millis(100);

/// How long one member gets to answer the start-up check (one that does not is skipped).
/// The check keeps a voter that lost its data from voting again, so a member slow under load
/// must not be skipped lightly; a member that is down refuses the connection at once, so
/// the bound costs only when a member hangs. (At 1 s, a loaded test machine once let a wiped
/// node start.)
const MEMBER_STATUS_TIMEOUT: Duration = Duration::from_secs(3);
/// How long a new node tries to reach the node it joins through (which must answer).
const JOIN_STATUS_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a joining node tries to reach the leader for each membership change.
const JOIN_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a joining node waits to catch up before it asks to be promoted.
const JOIN_CATCH_UP_TIMEOUT: Duration = Duration::from_secs(120);

/// Before Raft starts, asks the running cluster about this node and its data dir:
/// - a dir of another cluster is refused, naming both cluster ids (checked against any member
///   that answers; nothing is refused when none does);
/// - with `--members`, an empty dir while the leader reports it has matched this node's log
///   means the node lost its data: letting it vote again could elect a leader without the
///   acknowledged writes. It is refused; the operator re-adds it explicitly. A member that
///   merely starts late, after the others formed the cluster, was never matched and starts.
///   (The leader's match is the evidence: a node that lost its data while another leader
///   ruled is not recognised, which is why the runbook removes a wiped node first);
/// - with `--join`, an empty dir while this node's id is still a voter is refused the same
///   way (adding it "as a learner" would be a no-op and leave a voter with an empty log).
///   The node it joins through must answer: its status (members and cluster id) is returned,
///   for the peer gate.
///
/// Who is asked: the other members (`--members`) or the node joined through (a restart with
/// `--join`), each once within [`MEMBER_STATUS_TIMEOUT`], concurrently; a new node with
/// `--join` asks its node until it answers with a cluster id, within [`JOIN_STATUS_TIMEOUT`]
/// (all through [`AdminClient`]). The answers then go through one set of checks.
///
/// A member that cannot be reached is skipped, but one that answers with an authentication
/// or permission error refuses the start ([`refused_status`]): the check needs the admin role
/// (`auth.node_token_file`), and a node that cannot make it must not start as if the cluster
/// had said nothing.
async fn check_against_cluster(
    config: &Config,
    access: &cairn_client::Access,
    identity: &ClusterIdentity,
    fresh: bool,
) -> anyhow::Result<Option<pb::StatusResponse>> {
    let refuse = |reason: String| -> anyhow::Error { FatalCause::DataDirRefused { reason }.into() };
    let answers: Vec<(String, Result<pb::StatusResponse, ApiError>)> = match &config.join {
        Some(join) if fresh => {
            let client = AdminClient::new(vec![join.clone()], access.clone(), JOIN_STATUS_TIMEOUT);
            let known_cluster = |s: &pb::StatusResponse| {
                if s.cluster_id.is_empty() {
                    Err("it does not know its cluster id yet".to_string())
                } else {
                    Ok(())
                }
            };
            match client.first_status(known_cluster).await {
                Ok((_, status)) => vec![(join.clone(), Ok(status))],
                Err(e) if e.is_credential_refusal() => anyhow::bail!(
                    "joining the cluster through {join} failed: {}",
                    refused_status(join, &e)
                ),
                Err(e) => anyhow::bail!("joining the cluster through {join} failed: {e}"),
            }
        }
        _ => {
            let addresses: Vec<String> = match &config.join {
                Some(join) => vec![join.clone()],
                None => config
                    .members
                    .iter()
                    .filter(|m| m.id != config.node_id)
                    .map(|m| m.client_address.clone())
                    .collect(),
            };
            let client = AdminClient::new(addresses.clone(), access.clone(), MEMBER_STATUS_TIMEOUT)
                .with_attempt_timeout(MEMBER_STATUS_TIMEOUT);
            let statuses = client.statuses(&addresses).await;
            addresses.into_iter().zip(statuses).collect()
        }
    };
    let ours = identity.cluster_id();
    let dir = config.data_dir.display();
    let id = config.node_id;
    let mut join_status = None;
    for (address, answer) in answers {
        let status = match answer {
            Ok(status) => status,
            Err(e) if e.is_credential_refusal() => {
                return Err(refuse(refused_status(&address, &e)))
            }
            Err(_) => continue,
        };
        let theirs = &status.cluster_id;
        if !ours.is_empty() && !theirs.is_empty() && *theirs != ours {
            return Err(refuse(format!(
                "data dir {dir} belongs to cluster {ours} (see {dir}/cluster_id), but node {node} \
                 at {address} is a member of cluster {theirs}: this is another cluster's data \
                 dir. Start this node on its own data dir; to move it into cluster {theirs}, \
                 empty the data dir and start it with `--join {address}`",
                node = status.node_id,
            )));
        }
        if fresh && config.join.is_some() {
            // A build that cannot run at the cluster's version must not join it: it would
            // stop (or, a build of 0.1.0, skip commands) once it applied the log.
            let version = cairn_fsm::ClusterVersion::reported(&status.cluster_version)
                .map_err(|e| refuse(format!("node {} at {address} reports {e}", status.node_id)))?;
            if !version.is_supported_here() {
                return Err(refuse(format!(
                    "cluster {theirs} runs cluster version {version} (node {node} at {address} \
                     says so), and this build ({release}) supports cluster versions {min} to \
                     {max}: join it with a build that supports {version} (docs/upgrading.md)",
                    node = status.node_id,
                    release = env!("CARGO_PKG_VERSION"),
                    min = cairn_fsm::ClusterVersion::SUPPORTED_MIN,
                    max = cairn_fsm::ClusterVersion::SUPPORTED_MAX,
                )));
            }
        }
        let listed = status.members.iter().find(|m| m.id == id);
        if fresh && config.join.is_some() && listed.is_some_and(|m| m.voter) {
            return Err(refuse(format!(
                "data dir {dir} is empty, but node {id} is still a voter of cluster {theirs} \
                 (node {node} at {address} says so): a voter that lost its data must not vote \
                 again. Remove it first: `cairn member remove {id}` against the cluster, then \
                 start this node again with `--join {address}`",
                node = status.node_id,
            )));
        }
        // Evidence that this node held a log: the leader has matched it. A bootstrap member
        // that starts late, after the others formed the cluster and took writes, has never
        // been matched, and starts as it should.
        let matched_by_leader =
            listed.filter(|m| m.matched_known && status.leader_id == status.node_id);
        if fresh && config.join.is_none() && !theirs.is_empty() {
            if let Some(member) = matched_by_leader {
                return Err(refuse(format!(
                    "data dir {dir} is empty, but node {id} is already a member of running \
                     cluster {theirs}: its leader, node {node}, replicated its log to this node \
                     up to index {matched}. If this node lost its data, re-add it explicitly: \
                     `cairn member remove {id}` against the cluster, then start this node with \
                     `--join {address}`",
                    node = status.node_id,
                    matched = member.matched_index,
                )));
            }
        }
        if config.join.is_some() && !theirs.is_empty() {
            join_status = Some(status);
        }
    }
    Ok(join_status)
}

/// Why a node whose status call a member refused does not start.
fn refused_status(address: &str, e: &ApiError) -> String {
    format!(
        "the member at {address} refused this node's status call ({e}): without it this node \
         cannot check that its data dir belongs to the cluster, or that it did not lose data \
         the cluster counts on. Set auth.node_token_file to a token whose grant has \
         admin = true on every node"
    )
}

/// Waits for openraft's core to stop. Unless a shutdown was requested, that is a fatal
/// condition: health goes NOT_SERVING at once, the cause is classified, logged (and a
/// damaged data dir marked), and handed to the process.
async fn watch_core(
    raft: RaftHandle,
    health: Arc<Health>,
    stopping: Arc<AtomicBool>,
    fatal: watch::Sender<Option<FatalCause>>,
    node: NodeContext,
) {
    let core_error = raft.core_stopped().await;
    if stopping.load(Ordering::SeqCst) {
        return;
    }
    health.set(false).await;
    let cause = raft.fatal_cause(&core_error);
    crate::fatal::announce(&cause, &node);
    let _ = fatal.send(Some(cause));
}

/// Keeps gRPC health current: SERVING while the readiness checks of `ops::Probes` pass,
/// NOT_SERVING while they fail (both ways, as often as that changes), and for good once a
/// fatal cause is found.
/// Ends when a fatal cause is found or the node starts stopping (`stopping`): a stopping
/// node stays NOT_SERVING, and probing it would only time out against peers already gone.
async fn run_health(
    probes: crate::ops::Probes,
    health: Arc<Health>,
    mut fatal: watch::Receiver<Option<FatalCause>>,
    stopping: Arc<AtomicBool>,
) {
    loop {
        if fatal.borrow_and_update().is_some() {
            health.set(false).await;
            return;
        }
        if stopping.load(Ordering::SeqCst) {
            return;
        }
        let verdict = probes.readiness().await;
        if !verdict.passed() {
            tracing::debug!(failures = %verdict.failures(), "not ready");
        }
        // A fatal cause found while the checks ran wins; a stop begun meanwhile too.
        if fatal.borrow().is_none() {
            health.set_unless(verdict.passed(), Some(&stopping)).await;
        }
        // A node that is not ready is checked often, so that it serves as soon as it can; a
        // ready one less often, since each check is a linearizable read.
        let interval = if verdict.passed() {
            HEALTH_INTERVAL_READY
        } else {
            HEALTH_INTERVAL_NOT_READY
        };
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            changed = fatal.changed() => if changed.is_err() { return },
        }
    }
}

/// How often gRPC health runs the readiness checks, while the node is ready and while not.
const HEALTH_INTERVAL_READY: Duration = Duration::from_secs(1);
const HEALTH_INTERVAL_NOT_READY: Duration = Duration::from_millis(100);

/// Static bootstrap: the member with the lowest id initializes the cluster,
/// once. A node whose log already holds a membership never initializes again.
async fn bootstrap(raft: &RaftHandle, config: &Config) -> anyhow::Result<()> {
    let initializer = config.members.iter().map(|m| m.id).min();
    if initializer != Some(config.node_id) || raft.is_initialized().await {
        return Ok(());
    }
    if raft.identity.cluster_id().is_empty() {
        raft.identity
            .set(&format!("{:032x}", rand::random::<u128>()))?;
    }
    let members = crate::raft::membership_nodes(&config.members);
    if raft.initialize(members).await? {
        tracing::info!(cluster_id = %raft.identity.cluster_id(), "initialized a new cluster");
    }
    Ok(())
}

/// Joins the cluster through `address` as a learner, waits until the leader counts it caught
/// up, then promotes itself; all through [`AdminClient`] (leader found and followed, each
/// step bounded). A node an operator already added as a learner (`cairn member
/// add-learner`; `added_by_hand`) only catches up: the operator promotes it.
async fn join_cluster(
    raft: &RaftHandle,
    address: &str,
    access: &cairn_client::Access,
    me: NodeInfo,
    added_by_hand: bool,
) -> Result<(), ApiError> {
    if raft.is_initialized().await {
        return Ok(()); // already a member: a restart of a joined node
    }
    let id = raft.node_id;
    if added_by_hand {
        tracing::info!(
            id,
            "this node is already a learner of the cluster (added by hand): it catches up, \
             and becomes a voter when an operator runs `cairn member promote {id}`"
        );
        return Ok(());
    }
    let cluster = AdminClient::new(vec![address.to_string()], access.clone(), JOIN_TIMEOUT);
    cluster
        .at_leader(Operation::Mutation, |mut c| {
            let request = pb::AddLearnerRequest {
                id,
                peer_address: me.peer_address.clone(),
                client_address: me.client_address.clone(),
            };
            async move { c.add_learner(request).await }
        })
        .await?;
    tracing::info!(id, "joined the cluster as a learner; catching up");
    // A busy leader can move ahead between the catch-up and the promotion: catch up again.
    let mut attempts = 0;
    loop {
        attempts += 1;
        cluster
            .wait_caught_up(id, JOIN_CATCH_UP_TIMEOUT, |_, _| {})
            .await?;
        match cluster
            .at_leader(Operation::Mutation, |mut c| async move {
                c.promote(pb::PromoteRequest { id }).await
            })
            .await
        {
            Ok(_) => break,
            Err(ApiError::Inconsistent(why)) if attempts < 5 => {
                tracing::info!(id, %why, "promotion refused; catching up again");
            }
            Err(e) => return Err(e),
        }
    }
    tracing::info!(id, "joined the cluster as a voter");
    Ok(())
}
