//! The agent's long-lived tasks, owned.
//!
//! Every task the agent starts for the life of the node is started here, under a name,
//! and kept: none is detached. [`Tasks::stop`] ends them all on shutdown, before Raft
//! stops, and joins each one; a task still running at the deadline is aborted and named in
//! the log. Two kinds:
//! - [`Tasks::spawn`]: a loop that may be cancelled at any await point (the write batcher,
//!   the read-batch driver, the log-growth watcher, the check-quorum task, the leader
//!   watcher, the orphan-restore check, the health and core watchers, the join task, the
//!   catch-up after start, the cluster-version raise);
//! - [`Tasks::spawn_graceful`]: a server that watches [`Tasks::stopped`] itself and
//!   finishes its work (closes its connections) before it returns.
//!
//! Short tasks bounded by their own timeouts (one replication send, one vouching round, a
//! connection's handler under its server) are not listed here.
//!
//! A stream a server holds open for a caller (a watch, a lease's keep-alives, a leader's
//! AppendEntries) is not a task, but must not hold the shutdown either: each is wrapped in
//! [`end_when_stopped`], which ends it with a last error once the tasks are told to stop.
//!
//! Invariants: after [`Tasks::stop`] returns, no task started here is running; a task is
//! started at most once under its name.

use std::future::Future;
use std::time::Duration;

use futures::{Stream, StreamExt as _};
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub struct Tasks {
    stop: watch::Sender<bool>,
    running: Vec<(&'static str, JoinHandle<()>)>,
}

impl Default for Tasks {
    fn default() -> Self {
        Tasks::new()
    }
}

impl Tasks {
    pub fn new() -> Tasks {
        Tasks {
            stop: watch::channel(false).0,
            running: Vec::new(),
        }
    }

    /// Becomes `true` when the tasks are told to stop.
    pub fn stopped(&self) -> watch::Receiver<bool> {
        self.stop.subscribe()
    }

    /// Starts `task`; it is cancelled (dropped at its next await point) when the tasks stop.
    pub fn spawn(&mut self, name: &'static str, task: impl Future<Output = ()> + Send + 'static) {
        let mut stopped = self.stopped();
        self.spawn_graceful(name, async move {
            tokio::select! {
                () = task => {}
                _ = stopped.wait_for(|stop| *stop) => {}
            }
        });
    }

    /// Starts `task`, which watches [`Tasks::stopped`] itself and returns once it has
    /// finished its work.
    pub fn spawn_graceful(
        &mut self,
        name: &'static str,
        task: impl Future<Output = ()> + Send + 'static,
    ) {
        self.adopt(name, tokio::spawn(task));
    }

    /// Keeps a task started elsewhere (a server that watches [`Tasks::stopped`]).
    pub fn adopt(&mut self, name: &'static str, task: JoinHandle<()>) {
        assert!(
            self.running.iter().all(|(n, _)| *n != name),
            "task {name} started twice"
        );
        self.running.push((name, task));
    }

    /// The names of the tasks started, in order.
    pub fn names(&self) -> Vec<&'static str> {
        self.running.iter().map(|(name, _)| *name).collect()
    }

    /// Tells every task to stop and waits for each, for at most `timeout` in all; one still
    /// running then is aborted, and named in the log.
    pub async fn stop(self, timeout: Duration) {
        let _ = self.stop.send(true);
        let deadline = tokio::time::Instant::now() + timeout;
        for (name, mut task) in self.running {
            match tokio::time::timeout_at(deadline, &mut task).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) if e.is_panic() => {
                    tracing::error!(task = name, error = %e, "a task panicked")
                }
                Ok(Err(_)) => {}
                Err(_) => {
                    tracing::warn!(
                        task = name,
                        timeout_ms = timeout.as_millis() as u64,
                        "a task did not stop in time: aborted"
                    );
                    task.abort();
                    let _ = task.await;
                }
            }
        }
    }
}

/// A stream held open for a caller.
pub type HeldStream<T, E> = std::pin::Pin<Box<dyn Stream<Item = Result<T, E>> + Send>>;

/// `stream`, ended with `last` (its caller learns why, and goes elsewhere) once `stopped`
/// turns true, even while an item is being made (that item is dropped). A stream that ends
/// first ends as it would have, without `last`. Without `stopped` (a service run outside an
/// agent), `stream` as it is.
pub fn end_when_stopped<S, T, E>(
    stream: S,
    stopped: Option<watch::Receiver<bool>>,
    last: E,
) -> HeldStream<T, E>
where
    S: Stream<Item = Result<T, E>> + Send + 'static,
    T: Send + 'static,
    E: Send + 'static,
{
    let Some(mut stopped) = stopped else {
        return Box::pin(stream);
    };
    // One wait for the stop per stream, not one per item. A dropped sender means the tasks
    // are gone: stopped as well.
    let stop: std::pin::Pin<Box<dyn Future<Output = ()> + Send>> = Box::pin(async move {
        let _ = stopped.wait_for(|stop| *stop).await;
    });
    Box::pin(futures::stream::unfold(
        (Box::pin(stream), stop, Some(last)),
        |(mut stream, mut stop, last)| async move {
            let last = last?;
            let next = tokio::select! {
                biased;
                () = &mut stop => None,
                item = stream.next() => Some(item),
            };
            match next {
                None => Some((Err(last), (stream, stop, None))),
                Some(item) => item.map(|item| (item, (stream, stop, Some(last)))),
            }
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    #[tokio::test]
    async fn stop_ends_a_loop_a_graceful_server_and_a_task_that_ignores_it() {
        let mut tasks = Tasks::new();
        tasks.spawn("loop", std::future::pending());
        let finished = Arc::new(AtomicBool::new(false));
        let (f, mut stopped) = (finished.clone(), tasks.stopped());
        tasks.spawn_graceful("server", async move {
            let _ = stopped.wait_for(|s| *s).await;
            f.store(true, Ordering::SeqCst);
        });
        tasks.adopt("stubborn", tokio::spawn(std::future::pending()));
        assert_eq!(tasks.names(), ["loop", "server", "stubborn"]);
        // The stubborn task is aborted at the deadline: `stop` returns.
        tokio::time::timeout(
            Duration::from_secs(30),
            tasks.stop(Duration::from_millis(200)),
        )
        .await
        .expect("stop returns once the stubborn task is aborted");
        assert!(
            finished.load(Ordering::SeqCst),
            "the server finished its work"
        );
    }

    #[tokio::test]
    async fn a_held_stream_ends_with_its_last_item_when_told_and_not_before() {
        let tasks = Tasks::new();
        // Items before the stop pass through; a stream still open (pending) at the stop
        // ends with `last`, once.
        let open =
            futures::stream::iter([Ok::<u32, &str>(1), Ok(2)]).chain(futures::stream::pending());
        let mut held = end_when_stopped(open, Some(tasks.stopped()), "stopping");
        assert_eq!(held.next().await, Some(Ok(1)));
        assert_eq!(held.next().await, Some(Ok(2)));
        let stopping = tokio::spawn(tasks.stop(Duration::from_secs(1)));
        assert_eq!(held.next().await, Some(Err("stopping")));
        assert_eq!(held.next().await, None);
        stopping.await.unwrap();
        // A stream that ends by itself ends without `last`.
        let tasks = Tasks::new();
        let done = futures::stream::iter([Ok::<u32, &str>(7)]);
        let ended: Vec<_> = end_when_stopped(done, Some(tasks.stopped()), "stopping")
            .collect()
            .await;
        assert_eq!(ended, [Ok(7)]);
        // Without a stop, the stream as it is.
        let mut unstopped =
            end_when_stopped(futures::stream::pending::<Result<u32, &str>>(), None, "x");
        assert!(futures::poll!(unstopped.next()).is_pending());
    }

    #[test]
    #[should_panic(expected = "task loop started twice")]
    fn a_name_is_started_once() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(async {
            let mut tasks = Tasks::new();
            tasks.spawn("loop", async {});
            tasks.spawn("loop", async {});
        });
    }
}
