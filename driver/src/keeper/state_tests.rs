//! The transition table of [`super::Machine`], with fake workers and a fake clock.

use super::*;

#[derive(Debug, PartialEq)]
struct W {
    pid: u32,
    generation: u32,
}

impl WorkerHandle for W {
    fn pid(&self) -> u32 {
        self.pid
    }
    fn generation(&self) -> u32 {
        self.generation
    }
}

fn machine() -> Machine<W> {
    Machine::new(
        "v",
        Attachment::Mount("/mnt/v".into()),
        "/bin/worker".into(),
    )
}

fn serve() -> Event<W> {
    Event::Serve {
        args: vec!["--backend".into(), "local:/d".into()],
        binary: None,
    }
}

/// The generation of the one Start action in `actions`.
fn started(actions: &[Action<W>]) -> u32 {
    let starts: Vec<u32> = actions
        .iter()
        .filter_map(|a| match a {
            Action::Start(s) => Some(s.generation),
            _ => None,
        })
        .collect();
    assert_eq!(starts.len(), 1, "{actions:?}");
    starts[0]
}

fn worker(generation: u32) -> W {
    W {
        pid: 100 + generation,
        generation,
    }
}

/// A machine serving worker generation 1.
fn serving(t: Instant) -> Machine<W> {
    let mut m = machine();
    let g = started(&m.on(serve(), t).unwrap());
    m.on(
        Event::Started {
            generation: g,
            worker: worker(g),
            session: None,
        },
        t,
    )
    .unwrap();
    assert_eq!(m.state().name(), "serving");
    m
}

#[test]
fn a_served_volume_has_one_worker_and_a_second_serve_is_refused() {
    let t = Instant::now();
    let mut m = machine();
    let actions = m.on(serve(), t).unwrap();
    assert_eq!(started(&actions), 1);
    assert_eq!(m.args(), ["--backend", "local:/d"]);
    // While the first one starts, and once it serves: refused, nothing started.
    let e = m.on(serve(), t).unwrap_err();
    assert_eq!(
        e,
        Refused::No("volume v already has a worker (starting)".into())
    );
    m.on(
        Event::Started {
            generation: 1,
            worker: worker(1),
            session: None,
        },
        t,
    )
    .unwrap();
    assert_eq!(m.serving(), Some(&worker(1)));
    assert!(m.on(serve(), t).is_err());
    assert_eq!(m.generation(), 1);
    assert_eq!(m.restarts(), 0);
}

#[test]
fn a_serve_that_fails_leaves_the_volume_mounted() {
    let t = Instant::now();
    let mut m = machine();
    m.on(serve(), t).unwrap();
    let actions = m.on(Event::StartFailed { generation: 1 }, t).unwrap();
    assert!(actions.is_empty());
    assert_eq!(m.state().name(), "mounted");
    assert_eq!(m.retry_at(), None, "a refused serve is not retried");
    assert_eq!(started(&m.on(serve(), t).unwrap()), 2);
}

#[test]
fn an_upgrade_starts_the_next_worker_and_drains_the_previous_once_it_serves() {
    let t = Instant::now();
    let mut m = serving(t);
    let actions = m
        .on(
            Event::Upgrade {
                binary: Some("/bin/new".into()),
            },
            t,
        )
        .unwrap();
    let [Action::Start(spec)] = actions.as_slice() else {
        panic!("{actions:?}")
    };
    assert_eq!(spec.generation, 2);
    assert_eq!(spec.binary, PathBuf::from("/bin/new"));
    assert_eq!(spec.session_from, Some(1), "no session on record yet");
    // The previous worker still serves; serve, upgrade and unmount wait or are refused.
    assert_eq!(m.serving(), Some(&worker(1)));
    assert_eq!(
        m.on(serve(), t).unwrap_err(),
        Refused::No("volume v already has a worker (upgrading)".into())
    );
    assert!(matches!(
        m.on(Event::Upgrade { binary: None }, t),
        Err(Refused::No(_))
    ));
    assert!(matches!(m.on(Event::Unmount, t), Err(Refused::Busy(_))));
    assert_eq!(m.binary(), Path::new("/bin/worker"), "not until it serves");
    let actions = m
        .on(
            Event::Started {
                generation: 2,
                worker: worker(2),
                session: None,
            },
            t,
        )
        .unwrap();
    assert!(matches!(actions.as_slice(), [Action::Drain(w)] if *w == worker(1)));
    assert_eq!(m.serving(), Some(&worker(2)));
    assert_eq!(m.binary(), Path::new("/bin/new"));
    assert_eq!(m.restarts(), 0);
}

#[test]
fn an_upgrade_whose_worker_fails_keeps_the_previous_one() {
    let t = Instant::now();
    let mut m = serving(t);
    m.on(
        Event::Upgrade {
            binary: Some("/bin/broken".into()),
        },
        t,
    )
    .unwrap();
    let actions = m.on(Event::StartFailed { generation: 2 }, t).unwrap();
    assert!(actions.is_empty(), "the previous worker is not drained");
    assert_eq!(m.serving(), Some(&worker(1)));
    assert_eq!(m.binary(), Path::new("/bin/worker"));
}

#[test]
fn a_dead_worker_is_replaced_and_failed_replacements_are_retried_with_backoff() {
    let t0 = Instant::now();
    let mut m = serving(t0);
    // The worker dies: reaped, and a replacement starts at once.
    let actions = m.on(Event::Exited { generation: 1 }, t0).unwrap();
    assert!(matches!(actions[0], Action::Reap(ref w) if *w == worker(1)));
    assert_eq!(started(&actions), 2);
    assert_eq!(m.serving(), None);
    // Each failed attempt waits twice as long as the one before.
    let mut t = t0;
    for (attempt, wait_ms) in [(1, 250), (2, 500), (3, 1000)] {
        let g = m.generation();
        assert!(
            m.on(Event::StartFailed { generation: g }, t)
                .unwrap()
                .is_empty()
        );
        let due = t + Duration::from_millis(wait_ms);
        assert_eq!(m.retry_at(), Some(due), "after attempt {attempt}");
        let State::Failed { attempts, .. } = m.state() else {
            panic!("{:?}", m.state())
        };
        assert_eq!(*attempts, attempt);
        // Not before it is due; then the next generation.
        assert!(
            m.on(Event::RetryDue, due - Duration::from_millis(1))
                .unwrap()
                .is_empty()
        );
        t = due;
        assert_eq!(started(&m.on(Event::RetryDue, t).unwrap()), g + 1);
    }
    let g = m.generation();
    assert_eq!(g, 5);
    t += Duration::from_millis(40);
    m.on(
        Event::Started {
            generation: g,
            worker: worker(g),
            session: None,
        },
        t,
    )
    .unwrap();
    assert_eq!(m.serving(), Some(&worker(5)));
    assert_eq!(m.restarts(), 1);
    let failover = m.last_failover_ms().unwrap();
    assert!((failover - 1790.0).abs() < 1e-6, "{failover}");
}

#[test]
fn backoff_doubles_up_to_its_ceiling() {
    assert_eq!(backoff(1), Duration::from_millis(250));
    assert_eq!(backoff(2), Duration::from_millis(500));
    assert_eq!(backoff(7), Duration::from_secs(16));
    assert_eq!(backoff(8), MAX_BACKOFF);
    assert_eq!(backoff(u32::MAX), MAX_BACKOFF);
}

#[test]
fn a_serve_on_a_failed_volume_retries_now_with_its_arguments() {
    let t = Instant::now();
    let mut m = serving(t);
    m.on(Event::Exited { generation: 1 }, t).unwrap();
    m.on(Event::StartFailed { generation: 2 }, t).unwrap();
    let actions = m
        .on(
            Event::Serve {
                args: vec!["--backend".into(), "local:/elsewhere".into()],
                binary: None,
            },
            t,
        )
        .unwrap();
    let [Action::Start(spec)] = actions.as_slice() else {
        panic!("{actions:?}")
    };
    assert_eq!(spec.args, ["--backend", "local:/elsewhere"]);
    // It replaces the dead worker: a failure goes on with the backoff (attempt 2) ...
    m.on(Event::StartFailed { generation: 3 }, t).unwrap();
    assert!(matches!(m.state(), State::Failed { attempts: 2, .. }));
    // ... and a success is a restart.
    let due = m.retry_at().unwrap();
    m.on(Event::RetryDue, due).unwrap();
    m.on(
        Event::Started {
            generation: 4,
            worker: worker(4),
            session: None,
        },
        due,
    )
    .unwrap();
    assert_eq!(m.restarts(), 1);
}

#[test]
fn exits_of_other_generations_change_nothing() {
    let t = Instant::now();
    let mut m = serving(t);
    assert!(m.on(Event::Exited { generation: 7 }, t).unwrap().is_empty());
    assert_eq!(m.serving(), Some(&worker(1)));
}

#[test]
fn a_previous_worker_that_dies_during_an_upgrade_is_reaped_and_the_next_one_takes_over() {
    let t = Instant::now();
    let mut m = serving(t);
    m.on(Event::Upgrade { binary: None }, t).unwrap();
    let actions = m.on(Event::Exited { generation: 1 }, t).unwrap();
    assert!(matches!(actions.as_slice(), [Action::Reap(w)] if *w == worker(1)));
    assert_eq!(m.serving(), None);
    let actions = m
        .on(
            Event::Started {
                generation: 2,
                worker: worker(2),
                session: None,
            },
            t,
        )
        .unwrap();
    assert!(actions.is_empty(), "nothing left to drain");
    assert_eq!(m.serving(), Some(&worker(2)));

    // The same, but the next one fails too: the volume has no worker and retries.
    let mut m = serving(t);
    m.on(Event::Upgrade { binary: None }, t).unwrap();
    m.on(Event::Exited { generation: 1 }, t).unwrap();
    m.on(Event::StartFailed { generation: 2 }, t).unwrap();
    assert_eq!(m.retry_at(), Some(t + FIRST_BACKOFF));
}

#[test]
fn unmount_drains_the_worker_and_waits_while_one_starts() {
    let t = Instant::now();
    let mut m = machine();
    m.on(serve(), t).unwrap();
    assert!(matches!(m.on(Event::Unmount, t), Err(Refused::Busy(_))));
    m.on(
        Event::Started {
            generation: 1,
            worker: worker(1),
            session: None,
        },
        t,
    )
    .unwrap();
    let actions = m.on(Event::Unmount, t).unwrap();
    assert!(matches!(
        actions.as_slice(),
        [Action::Drain(w), Action::Unmount] if *w == worker(1)
    ));
    assert_eq!(m.state().name(), "draining");
    assert!(matches!(m.on(serve(), t), Err(Refused::No(_))));
    assert!(matches!(m.on(Event::Unmount, t), Err(Refused::Busy(_))));
    m.on(Event::Unmounted { ok: true }, t).unwrap();
    assert_eq!(m.state().name(), "gone");
}

#[test]
fn a_failed_volume_unmounts_without_a_drain_and_a_failed_unmount_stays_mounted() {
    let t = Instant::now();
    let mut m = serving(t);
    m.on(Event::Exited { generation: 1 }, t).unwrap();
    m.on(Event::StartFailed { generation: 2 }, t).unwrap();
    let actions = m.on(Event::Unmount, t).unwrap();
    assert!(matches!(actions.as_slice(), [Action::Unmount]));
    m.on(Event::Unmounted { ok: false }, t).unwrap();
    assert_eq!(m.state().name(), "mounted");
    assert_eq!(m.retry_at(), None);
}

#[test]
fn mount_is_idempotent_for_the_same_mountpoint_only() {
    let t = Instant::now();
    let mut m = machine();
    let same = Event::Attach {
        attachment: Attachment::Mount("/mnt/v".into()),
    };
    assert!(m.on(same, t).unwrap().is_empty());
    let other = Event::Attach {
        attachment: Attachment::Mount("/mnt/w".into()),
    };
    assert_eq!(
        m.on(other, t).unwrap_err(),
        Refused::No("volume v is mounted at /mnt/v".into())
    );
    let export = Event::Attach {
        attachment: Attachment::VhostUser {
            socket: "/run/v.sock".into(),
        },
    };
    assert_eq!(
        m.on(export, t).unwrap_err(),
        Refused::No("volume v is mounted at /mnt/v".into())
    );
}

#[test]
fn export_is_idempotent_for_the_same_socket_only() {
    let t = Instant::now();
    let socket = |p: &str| Attachment::VhostUser { socket: p.into() };
    let mut m: Machine<W> = Machine::new("v", socket("/run/v.sock"), "/bin/worker".into());
    let same = Event::Attach {
        attachment: socket("/run/v.sock"),
    };
    assert!(m.on(same, t).unwrap().is_empty());
    for other in [socket("/run/w.sock"), Attachment::Mount("/mnt/v".into())] {
        assert_eq!(
            m.on(Event::Attach { attachment: other }, t).unwrap_err(),
            Refused::No("volume v is exported on vhost-user socket /run/v.sock".into())
        );
    }
    // An export's worker is started, replaced and drained like a mount's.
    let serves = |g| Event::Started {
        generation: g,
        worker: worker(g),
        session: None,
    };
    assert_eq!(started(&m.on(serve(), t).unwrap()), 1);
    m.on(serves(1), t).unwrap();
    let dead = m.on(Event::Exited { generation: 1 }, t).unwrap();
    assert!(matches!(&dead[..], [Action::Reap(_), Action::Start(s)] if s.generation == 2));
    m.on(serves(2), t).unwrap();
    // But never upgraded: the frontend would not set the next worker up.
    let e = m.on(Event::Upgrade { binary: None }, t).unwrap_err();
    assert!(
        matches!(&e, Refused::No(e) if e.contains("vhost-user-fs")),
        "{e:?}"
    );
    assert_eq!(m.state().name(), "serving");
    let unmount = m.on(Event::Unmount, t).unwrap();
    assert!(matches!(&unmount[..], [Action::Drain(_), Action::Unmount]));
}

#[test]
fn the_first_session_on_record_is_kept() {
    let t = Instant::now();
    let record = |max_write| SessionRecord {
        version: 1,
        offered: 1,
        enabled: 1,
        offered_names: String::new(),
        enabled_names: String::new(),
        max_write,
        config: dpufs_node_api::handover::SessionConfig {
            attr_ttl_secs: 1.0,
            entry_ttl_secs: 1.0,
            negative_ttl_secs: 0.0,
            data_cache: true,
            access: Default::default(),
            writeback_cache: false,
        },
    };
    let mut m = serving(t);
    m.on(Event::Session(record(1)), t).unwrap();
    m.on(Event::Session(record(2)), t).unwrap();
    assert_eq!(m.session().unwrap().max_write, 1);
    // With a session on record, an upgrade need not look for one.
    let actions = m.on(Event::Upgrade { binary: None }, t).unwrap();
    assert!(matches!(
        actions.as_slice(),
        [Action::Start(StartSpec {
            session_from: None,
            ..
        })]
    ));
}

#[test]
fn a_worker_that_comes_up_when_nobody_waits_for_it_is_drained() {
    let t = Instant::now();
    let mut m = serving(t);
    let actions = m
        .on(
            Event::Started {
                generation: 9,
                worker: worker(9),
                session: None,
            },
            t,
        )
        .unwrap();
    assert!(matches!(actions.as_slice(), [Action::Drain(w)] if *w == worker(9)));
    assert_eq!(m.serving(), Some(&worker(1)));
}
