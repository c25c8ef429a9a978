//! The supervisor: one thread that waits, without polling on a timer, for any of the
//! keeper's workers to exit (their pidfds), for a volume to change (the keeper's eventfd),
//! or for the next retry of a failed volume to come due (the poll's timeout), and tells the
//! volume's state machine.

use super::process::poll_readable;
use super::state::{Event, WorkerHandle};
use super::{Keeper, lock};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A worker being watched: its volume, generation, and a descriptor of its pidfd.
struct Watched {
    volume: String,
    generation: u32,
    exit: OwnedFd,
}

impl Keeper {
    /// Replaces workers that die (a crash, kill -9) and retries failed replacements: the
    /// mount never notices more than the requests the dead worker had in flight.
    pub(super) fn supervise(self: Arc<Self>) {
        loop {
            // Cleared before looking, so a change made after the look wakes the poll.
            self.wake.clear();
            let (watched, next_retry) = self.watch_list();
            let mut fds = vec![self.wake.fd()];
            fds.extend(watched.iter().map(|w| w.exit.as_fd()));
            let timeout = next_retry.map(|t| t.saturating_duration_since(Instant::now()));
            let ready = match poll_readable(&fds, timeout) {
                Ok(r) => r,
                Err(e) => {
                    tracing::error!("supervisor: poll: {e}");
                    std::thread::sleep(Duration::from_millis(100));
                    continue;
                }
            };
            for (w, exited) in watched.iter().zip(&ready[1..]) {
                if *exited {
                    self.clone().on_its_own(
                        &w.volume,
                        Event::Exited {
                            generation: w.generation,
                        },
                    );
                }
            }
            let due: Vec<String> = {
                let now = Instant::now();
                let vols = self.volumes();
                vols.iter()
                    .filter(|(_, v)| v.machine.retry_at().is_some_and(|t| t <= now))
                    .map(|(name, _)| name.clone())
                    .collect()
            };
            for volume in due {
                self.clone().on_its_own(&volume, Event::RetryDue);
            }
        }
    }

    /// The workers that serve, and when the earliest retry is due.
    fn watch_list(&self) -> (Vec<Watched>, Option<Instant>) {
        let vols = self.volumes();
        let mut watched = Vec::new();
        for (name, v) in vols.iter() {
            let Some(w) = v.machine.serving() else {
                continue;
            };
            match w.exit_fd() {
                Ok(exit) => watched.push(Watched {
                    volume: name.clone(),
                    generation: w.generation(),
                    exit,
                }),
                Err(e) => tracing::error!("{name}: cannot watch worker {}: {e}", w.pid()),
            }
        }
        let next_retry = vols.values().filter_map(|v| v.machine.retry_at()).min();
        (watched, next_retry)
    }

    /// An event nobody asked for: its actions (starting a worker takes a while) run on a
    /// thread of their own, so the supervisor goes on watching.
    fn on_its_own(self: Arc<Self>, volume: &str, event: Event<super::process::Worker>) {
        let actions = match self.feed(volume, event) {
            Ok(a) if a.is_empty() => return,
            Ok(a) => a,
            Err(e) => {
                tracing::debug!("{volume}: {e:?}");
                return;
            }
        };
        let volume = volume.to_string();
        let spawned = std::thread::Builder::new()
            .name(format!("restart-{volume}"))
            .spawn(move || {
                let done = self.execute(&volume, actions);
                if let Ok(pid) = done.started() {
                    let ms = lock(&self.volumes)
                        .get(&volume)
                        .and_then(|v| v.machine.last_failover_ms());
                    tracing::info!(
                        "worker {pid} serves {volume} after {:.1} ms",
                        ms.unwrap_or_default()
                    );
                } else if let Some(at) = lock(&self.volumes)
                    .get(&volume)
                    .and_then(|v| v.machine.retry_at())
                {
                    let wait = at.saturating_duration_since(Instant::now());
                    tracing::error!(
                        "no worker for {volume}: {:#}; next attempt in {wait:?}",
                        done.started().unwrap_err()
                    );
                }
            });
        if let Err(e) = spawned {
            tracing::error!("supervisor: cannot start a thread: {e}");
        }
    }
}
