//! The failover measurement: kill -9 the leader's process, then probe with a
//! create every `--probe-interval-ms` through a surviving node until one
//! succeeds. A NotLeader answer that names a surviving leader moves the probe
//! there (until follower forwarding exists, that is how a client reaches the
//! new leader); meanwhile a poller asks the survivors' `AdminService.Status`
//! for the moment a new leader is known.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use cairn_proto::error::ApiError;
use cairn_proto::v1::{self as pb, admin_service_client::AdminServiceClient};
use tokio::sync::Mutex;

use super::report::{FailoverFigures, Format, Report};
use super::{
    bench_resource, connect, discover, procfs, resource_client, run_id, BenchError, Cluster,
    FailoverArgs,
};

/// Runs the failover measurement and prints its report in `format` (also when no write
/// succeeded, which is then the error).
pub async fn run(cluster: &Cluster, args: FailoverArgs, format: Format) -> Result<(), BenchError> {
    let access = cluster.access()?;
    let view = discover(&cluster.endpoints, &access).await?;
    let old_term = view.statuses.iter().map(|(_, s)| s.term).max().unwrap_or(0);
    let pid = match args.kill_pid {
        Some(p) => p,
        None => procfs::pid_listening_on(&view.leader_address).ok_or_else(|| {
            BenchError::Setup(format!(
                "no local process listens on the leader's address {}; pass --kill-pid",
                view.leader_address
            ))
        })?,
    };
    let survivors: Vec<String> = cluster
        .endpoints
        .iter()
        .filter(|e| **e != view.leader_address)
        .cloned()
        .collect();
    if survivors.is_empty() {
        return Err(BenchError::Setup(
            "no endpoint other than the leader's to probe through".into(),
        ));
    }
    let mut clients = BTreeMap::new();
    let mut admins = Vec::new();
    for s in &survivors {
        let channel = connect(&access, s).await?;
        clients.insert(s.clone(), resource_client(channel.clone()));
        admins.push(AdminServiceClient::new(channel));
    }
    let run = run_id();
    let value = Bytes::from(vec![b'v'; 256]);

    // SAFETY: kill has no memory effects; the pid was checked above.
    let rc = unsafe { libc::kill(pid, libc::SIGKILL) };
    if rc != 0 {
        return Err(BenchError::Setup(format!(
            "cannot kill pid {pid}: {}",
            std::io::Error::last_os_error()
        )));
    }
    let killed_at = Instant::now();
    let give_up = killed_at + Duration::from_secs_f64(args.max_wait_s.clamp(0.1, 600.0));

    // The poller: the first moment a survivor names a leader other than the killed one.
    let leader_known: Arc<Mutex<Option<(Duration, u64)>>> = Arc::new(Mutex::new(None));
    let poller = {
        let leader_known = leader_known.clone();
        let killed = view.leader_id;
        tokio::spawn(async move {
            while Instant::now() < give_up {
                for admin in admins.iter_mut() {
                    let mut request = tonic::Request::new(pb::StatusRequest {});
                    request.set_timeout(Duration::from_millis(500));
                    if let Ok(s) = admin.status(request).await {
                        let s = s.into_inner();
                        if s.leader_id != 0 && s.leader_id != killed {
                            *leader_known.lock().await = Some((killed_at.elapsed(), s.leader_id));
                            return;
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };

    let mut target = survivors[0].clone();
    let mut probes = 0u64;
    let mut errors: BTreeMap<String, u64> = BTreeMap::new();
    let mut first_write = None;
    let mut hinted_leader = None;
    while Instant::now() < give_up {
        probes += 1;
        let client = clients
            .get_mut(&target)
            .expect("the probe target is always a survivor with a client");
        let resource = bench_resource(
            &args.namespace,
            format!("f{run}-{probes}"),
            String::new(),
            value.clone(),
        );
        let outcome = tokio::time::timeout(
            Duration::from_millis(args.probe_timeout_ms.max(1)),
            client.write(pb::WriteRequest {
                fence: None,
                resource: Some(resource),
            }),
        )
        .await;
        match outcome {
            Ok(Ok(_)) => {
                first_write = Some(killed_at.elapsed());
                break;
            }
            Ok(Err(status)) => {
                let e = ApiError::from_status(&status);
                *errors.entry(format!("{:?}", e.kind())).or_insert(0) += 1;
                if let ApiError::NotLeader { hint } = &e {
                    if hint.leader_id.is_some_and(|id| id != view.leader_id) {
                        hinted_leader = hint.leader_id;
                    }
                    if let Some(address) = &hint.client_address {
                        if clients.contains_key(address) {
                            target = address.clone();
                        }
                    }
                }
            }
            Err(_) => *errors.entry("ClientTimeout".into()).or_insert(0) += 1,
        }
        tokio::time::sleep(Duration::from_millis(args.probe_interval_ms)).await;
    }
    // The poller ends on its own by `give_up`; a known leader ends it sooner.
    let poll_until = Instant::now() + Duration::from_secs(2);
    while !poller.is_finished()
        && Instant::now() < poll_until
        && leader_known.lock().await.is_none()
    {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    poller.abort();
    let known = *leader_known.lock().await;

    let mut report = Report::new("failover");
    report.label = args.label;
    report.targets = survivors;
    report.errors = errors;
    report.failover = Some(FailoverFigures {
        killed_node_id: view.leader_id,
        killed_pid: pid,
        old_term,
        new_leader_id: known.map(|k| k.1).or(hinted_leader),
        leader_known_ms: known.map(|k| k.0.as_secs_f64() * 1e3),
        first_write_ms: first_write.map(|d| d.as_secs_f64() * 1e3),
        written_through: first_write.map(|_| target),
        probes,
    });
    report.print(format);
    if first_write.is_none() {
        return Err(BenchError::Api(ApiError::Unavailable(format!(
            "no write succeeded within {} s of the kill",
            args.max_wait_s
        ))));
    }
    Ok(())
}
