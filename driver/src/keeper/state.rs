//! One volume's state machine (docs/keeper.md §Volume states). Every change of a volume —
//! a request, a worker that starts, fails, exits or drains, a retry that is due — is an
//! [`Event`] given to [`Machine::on`], which moves the volume to its next [`State`] and says
//! what to do about it ([`Action`]s: start, reap or drain a worker, unmount). Nothing else
//! changes a volume, and nothing here does I/O: the keeper runs the actions and feeds their
//! outcomes back as events.
//!
//! Each state holds exactly the workers that exist in it, so two of them can never serve by
//! mistake: a `serve` is refused unless the volume is [`State::Mounted`] or
//! [`State::Failed`], and only [`State::Serving`] can be upgraded. Modelled on the FUSE
//! daemon state machine of Nydus (`nydusd`: Init, Ready, Running, Upgrading, Interrupted,
//! Die, with one event function).

use dpufs_node_api::handover::SessionRecord;
use dpufs_node_api::transport::{Attachment, Transport};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The wait before the second attempt to replace a dead worker; it doubles per attempt.
pub const FIRST_BACKOFF: Duration = Duration::from_millis(250);
/// The longest wait between attempts.
pub const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// How long to wait after failed attempt `attempt` (1, 2, …): 250 ms, 500 ms, 1 s, … 30 s.
pub fn backoff(attempt: u32) -> Duration {
    let doublings = attempt.saturating_sub(1).min(16);
    (FIRST_BACKOFF * (1u32 << doublings)).min(MAX_BACKOFF)
}

/// What the machine needs to know of a worker process.
pub trait WorkerHandle {
    fn pid(&self) -> u32;
    /// Names the worker's state directory (`worker-<generation>`); unique per volume.
    fn generation(&self) -> u32;
}

/// Where a volume is.
#[derive(Debug)]
pub enum State<W> {
    /// Mounted (or exported), no worker: none was asked for yet, or the one asked for failed
    /// to start.
    Mounted,
    /// Worker `generation` is starting; it becomes `Serving` once it answers `health`.
    Starting { generation: u32, cause: Cause },
    /// A worker serves.
    Serving { worker: W },
    /// Worker `generation` (of `binary`) is starting next to `previous`, which serves until
    /// the new one does and then drains. `previous` is `None` if it died meanwhile (at
    /// `lost_at`).
    Upgrading {
        previous: Option<W>,
        generation: u32,
        binary: PathBuf,
        lost_at: Option<Instant>,
    },
    /// A worker died and `attempts` replacements failed to start; the next one starts at
    /// `next_retry`. `since`: when the volume lost its worker.
    Failed {
        attempts: u32,
        next_retry: Instant,
        since: Instant,
    },
    /// Being unmounted: the worker (if any) drains, then the mount (or the export's socket)
    /// goes.
    Draining,
    /// Unmounted (or unexported) and forgotten.
    Gone,
}

/// Why a worker is starting, which decides what a failure leads to.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Cause {
    /// A `serve` request: a failure is the requester's to see; the volume goes back to
    /// `Mounted`.
    Serve,
    /// Replacing a worker that died at `since`; this is attempt `attempt`. A failure leads
    /// to `Failed` and another attempt after a backoff.
    Replace { since: Instant, attempt: u32 },
}

impl<W> State<W> {
    /// The state's name, for logs and docs.
    pub fn name(&self) -> &'static str {
        match self {
            State::Mounted => "mounted",
            State::Starting { .. } => "starting",
            State::Serving { .. } => "serving",
            State::Upgrading { .. } => "upgrading",
            State::Failed { .. } => "failed",
            State::Draining => "draining",
            State::Gone => "gone",
        }
    }
}

/// What happens to a volume.
#[derive(Debug)]
pub enum Event<W> {
    /// A `mount` or `export` request for a volume that exists (attached the same way: nothing
    /// to do).
    Attach { attachment: Attachment },
    /// A `serve` request.
    Serve {
        args: Vec<String>,
        binary: Option<PathBuf>,
    },
    /// An `upgrade` request.
    Upgrade { binary: Option<PathBuf> },
    /// An `unmount` request.
    Unmount,
    /// A worker's record of what INIT negotiated, found in its state directory.
    Session(SessionRecord),
    /// Worker `generation` serves.
    Started {
        generation: u32,
        worker: W,
        session: Option<SessionRecord>,
    },
    /// Worker `generation` did not come to serve (it exited, or timed out and was killed).
    StartFailed { generation: u32 },
    /// Worker `generation` exited (its pidfd said so).
    Exited { generation: u32 },
    /// The clock passed a `Failed` volume's `next_retry`.
    RetryDue,
    /// The unmount action ended; `ok: false` leaves the volume mounted.
    Unmounted { ok: bool },
}

impl<W> Event<W> {
    fn name(&self) -> &'static str {
        match self {
            Event::Attach { .. } => "attach",
            Event::Serve { .. } => "serve",
            Event::Upgrade { .. } => "upgrade",
            Event::Unmount => "unmount",
            Event::Session(_) => "session",
            Event::Started { .. } => "started",
            Event::StartFailed { .. } => "start failed",
            Event::Exited { .. } => "exited",
            Event::RetryDue => "retry due",
            Event::Unmounted { .. } => "unmounted",
        }
    }
}

/// What the keeper must do after an event, in order.
#[derive(Debug)]
pub enum Action<W> {
    /// Start a worker and wait until it serves; then feed `Started` or `StartFailed`.
    Start(StartSpec),
    /// Collect a worker that exited (and its session record, fed as `Session`).
    Reap(W),
    /// Stop a worker that serves a handed descriptor and wait until it exits.
    Drain(W),
    /// Unmount the volume (or close and unlink its socket) and remove its state; then feed
    /// `Unmounted`.
    Unmount,
}

/// The worker to start.
#[derive(Debug, Clone, PartialEq)]
pub struct StartSpec {
    pub generation: u32,
    pub binary: PathBuf,
    pub args: Vec<String>,
    /// When no session is on record yet: the generation of the live worker whose
    /// `session.json` to read first (it may have answered INIT since it started).
    pub session_from: Option<u32>,
}

/// Why an event was not taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// Not now: a worker is starting or draining. Ask again once the state changes.
    Busy(String),
    /// Not at all (the answer to the request).
    No(String),
}

/// One volume: its state and what every state shares.
#[derive(Debug)]
pub struct Machine<W> {
    volume: String,
    attachment: Attachment,
    state: State<W>,
    /// The worker's own arguments (backend, caching) and binary.
    args: Vec<String>,
    binary: PathBuf,
    /// Workers started so far (each attempt counts).
    generation: u32,
    /// Dead workers replaced by one that serves.
    restarts: u32,
    last_failover_ms: Option<f64>,
    /// What INIT negotiated on the connection, once a worker recorded it.
    session: Option<SessionRecord>,
}

impl<W: WorkerHandle> Machine<W> {
    /// A volume just attached (mounted or exported), whose workers are `binary` unless a
    /// request says otherwise.
    pub fn new(volume: &str, attachment: Attachment, binary: PathBuf) -> Machine<W> {
        Machine {
            volume: volume.to_string(),
            attachment,
            state: State::Mounted,
            args: Vec::new(),
            binary,
            generation: 0,
            restarts: 0,
            last_failover_ms: None,
            session: None,
        }
    }

    pub fn state(&self) -> &State<W> {
        &self.state
    }
    pub fn attachment(&self) -> &Attachment {
        &self.attachment
    }
    pub fn args(&self) -> &[String] {
        &self.args
    }
    pub fn binary(&self) -> &Path {
        &self.binary
    }
    pub fn generation(&self) -> u32 {
        self.generation
    }
    pub fn restarts(&self) -> u32 {
        self.restarts
    }
    pub fn last_failover_ms(&self) -> Option<f64> {
        self.last_failover_ms
    }
    pub fn session(&self) -> Option<&SessionRecord> {
        self.session.as_ref()
    }

    /// The worker that serves the volume now, if one does (during an upgrade, the previous
    /// one until the next serves). The supervisor watches it for its exit.
    pub fn serving(&self) -> Option<&W> {
        match &self.state {
            State::Serving { worker } => Some(worker),
            State::Upgrading { previous, .. } => previous.as_ref(),
            _ => None,
        }
    }

    /// When the next attempt to replace a dead worker is due.
    pub fn retry_at(&self) -> Option<Instant> {
        match self.state {
            State::Failed { next_retry, .. } => Some(next_retry),
            _ => None,
        }
    }

    /// Takes `event` at time `now`: the volume's next state, and what to do.
    pub fn on(&mut self, event: Event<W>, now: Instant) -> Result<Vec<Action<W>>, Refused> {
        let before = self.state.name();
        let what = event.name();
        let state = std::mem::replace(&mut self.state, State::Gone);
        let (next, result) = self.transition(state, event, now);
        self.state = next;
        if self.state.name() != before {
            tracing::info!(
                "volume {}: {before} -> {} ({what})",
                self.volume,
                self.state.name()
            );
        }
        result
    }

    /// The transition table (docs/keeper.md §Volume states).
    fn transition(
        &mut self,
        state: State<W>,
        event: Event<W>,
        now: Instant,
    ) -> (State<W>, Result<Vec<Action<W>>, Refused>) {
        use State::*;
        let v = self.volume.clone();
        let none = || Ok(Vec::new());
        match (state, event) {
            // Requests.
            (Gone, Event::Serve { .. } | Event::Upgrade { .. } | Event::Unmount) => {
                (Gone, Err(Refused::No(format!("no volume {v}"))))
            }
            (Draining, Event::Attach { .. } | Event::Serve { .. } | Event::Upgrade { .. }) => (
                Draining,
                Err(Refused::No(format!("volume {v} is being unmounted"))),
            ),
            (s, Event::Attach { attachment }) => {
                if attachment == self.attachment {
                    (s, none())
                } else {
                    let e = format!("volume {v} is {}", self.attachment);
                    (s, Err(Refused::No(e)))
                }
            }
            (Mounted, Event::Serve { args, binary }) => {
                self.configure(args, binary);
                self.start(Cause::Serve)
            }
            (
                Failed {
                    attempts, since, ..
                },
                Event::Serve { args, binary },
            ) => {
                self.configure(args, binary);
                self.start(Cause::Replace {
                    since,
                    attempt: attempts + 1,
                })
            }
            (s @ (Starting { .. } | Serving { .. } | Upgrading { .. }), Event::Serve { .. }) => {
                let e = format!("volume {v} already has a worker ({})", s.name());
                (s, Err(Refused::No(e)))
            }
            (s @ Serving { .. }, Event::Upgrade { .. })
                if self.attachment.transport() == Transport::VhostUserFs =>
            {
                // docs/worker.md, "Failover": the frontend does not set up a replaced backend.
                let e = format!(
                    "volume {v} is exported over vhost-user-fs: its frontend would not set up \
                     the next worker, and the guest's requests would stay unanswered"
                );
                (s, Err(Refused::No(e)))
            }
            (Serving { worker }, Event::Upgrade { binary }) => {
                self.generation += 1;
                let binary = binary.unwrap_or_else(|| self.binary.clone());
                let start = StartSpec {
                    generation: self.generation,
                    binary: binary.clone(),
                    args: self.args.clone(),
                    session_from: self.session.is_none().then(|| worker.generation()),
                };
                let next = Upgrading {
                    previous: Some(worker),
                    generation: self.generation,
                    binary,
                    lost_at: None,
                };
                (next, Ok(vec![Action::Start(start)]))
            }
            (s @ (Mounted | Failed { .. }), Event::Upgrade { .. }) => {
                (s, Err(Refused::No(format!("volume {v} has no worker"))))
            }
            (s @ (Starting { .. } | Upgrading { .. }), Event::Upgrade { .. }) => {
                let e = format!("a worker of volume {v} is starting: upgrade once it serves");
                (s, Err(Refused::No(e)))
            }
            (Mounted | Failed { .. }, Event::Unmount) => (Draining, Ok(vec![Action::Unmount])),
            (Serving { worker }, Event::Unmount) => {
                (Draining, Ok(vec![Action::Drain(worker), Action::Unmount]))
            }
            (s @ (Starting { .. } | Upgrading { .. } | Draining), Event::Unmount) => {
                let e = format!("volume {v} is {}", s.name());
                (s, Err(Refused::Busy(e)))
            }

            // Outcomes of actions.
            (s, Event::Session(record)) => {
                self.session.get_or_insert(record);
                (s, none())
            }
            (
                Starting { generation, cause },
                Event::Started {
                    generation: g,
                    worker,
                    session,
                },
            ) if g == generation => {
                self.note_session(session);
                if let Cause::Replace { since, .. } = cause {
                    self.restarts += 1;
                    self.last_failover_ms = Some(ms(now.saturating_duration_since(since)));
                }
                (Serving { worker }, none())
            }
            (
                Upgrading {
                    previous,
                    generation,
                    binary,
                    ..
                },
                Event::Started {
                    generation: g,
                    worker,
                    session,
                },
            ) if g == generation => {
                self.note_session(session);
                self.binary = binary;
                (
                    Serving { worker },
                    Ok(previous.map(Action::Drain).into_iter().collect()),
                )
            }
            // A worker nobody waits for any more.
            (s, Event::Started { worker, .. }) => (s, Ok(vec![Action::Drain(worker)])),
            (Starting { generation, cause }, Event::StartFailed { generation: g })
                if g == generation =>
            {
                match cause {
                    Cause::Serve => (Mounted, none()),
                    Cause::Replace { since, attempt } => (
                        Failed {
                            attempts: attempt,
                            next_retry: now + backoff(attempt),
                            since,
                        },
                        none(),
                    ),
                }
            }
            (
                Upgrading {
                    previous,
                    generation,
                    lost_at,
                    ..
                },
                Event::StartFailed { generation: g },
            ) if g == generation => match previous {
                Some(worker) => (Serving { worker }, none()),
                None => (
                    Failed {
                        attempts: 1,
                        next_retry: now + backoff(1),
                        since: lost_at.unwrap_or(now),
                    },
                    none(),
                ),
            },
            (s, Event::StartFailed { .. }) => (s, none()),
            (Serving { worker }, Event::Exited { generation })
                if worker.generation() == generation =>
            {
                let cause = Cause::Replace {
                    since: now,
                    attempt: 1,
                };
                let (next, actions) = self.start(cause);
                let mut all = vec![Action::Reap(worker)];
                all.extend(actions.unwrap_or_default());
                (next, Ok(all))
            }
            (
                Upgrading {
                    previous: Some(worker),
                    generation,
                    binary,
                    ..
                },
                Event::Exited { generation: g },
            ) if worker.generation() == g => (
                Upgrading {
                    previous: None,
                    generation,
                    binary,
                    lost_at: Some(now),
                },
                Ok(vec![Action::Reap(worker)]),
            ),
            (s, Event::Exited { .. }) => (s, none()),
            (
                Failed {
                    attempts,
                    next_retry,
                    since,
                },
                Event::RetryDue,
            ) if next_retry <= now => self.start(Cause::Replace {
                since,
                attempt: attempts + 1,
            }),
            (s, Event::RetryDue) => (s, none()),
            (Draining, Event::Unmounted { ok: true }) => (Gone, none()),
            (Draining, Event::Unmounted { ok: false }) => (Mounted, none()),
            (s, Event::Unmounted { .. }) => (s, none()),
        }
    }

    fn configure(&mut self, args: Vec<String>, binary: Option<PathBuf>) {
        self.args = args;
        if let Some(b) = binary {
            self.binary = b;
        }
    }

    /// The next generation starts.
    fn start(&mut self, cause: Cause) -> (State<W>, Result<Vec<Action<W>>, Refused>) {
        self.generation += 1;
        let start = StartSpec {
            generation: self.generation,
            binary: self.binary.clone(),
            args: self.args.clone(),
            session_from: None,
        };
        let next = State::Starting {
            generation: self.generation,
            cause,
        };
        (next, Ok(vec![Action::Start(start)]))
    }

    fn note_session(&mut self, session: Option<SessionRecord>) {
        if self.session.is_none() {
            self.session = session;
        }
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

#[cfg(test)]
#[path = "state_tests.rs"]
mod tests;
