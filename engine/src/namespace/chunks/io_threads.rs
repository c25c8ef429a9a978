//! The I/O threads: they move data between chunk files and memory for requests already
//! answered (queued writes, `write_behind.rs`) or not made yet (read-ahead, `read_ahead.rs`).
//! Shared by every namespace of the process: their number is how many such transfers the disk
//! sees at once.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex, OnceLock};

const THREADS: usize = 4;

pub(super) type Job = Box<dyn FnOnce() + Send>;

/// Hands `job` to an I/O thread (started on first use).
pub(super) fn submit(job: Job) {
    static QUEUE: OnceLock<Sender<Job>> = OnceLock::new();
    let queue = QUEUE.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        for i in 0..THREADS {
            let rx = rx.clone();
            std::thread::Builder::new()
                .name(format!("dfs-io-{i}"))
                .spawn(move || run(&rx))
                .expect("start a DFS I/O thread");
        }
        tx
    });
    queue
        .send(job)
        .expect("the DFS I/O threads run as long as the process");
}

fn run(jobs: &Mutex<Receiver<Job>>) {
    loop {
        let job = jobs.lock().expect("I/O queue").recv();
        match job {
            Ok(job) => job(),
            Err(_) => return,
        }
    }
}

/// Runs `transfer`, turning a panic into an error. A job must always report its end (queued
/// writes land, read-ahead becomes ready), or whoever waits for it would wait forever; a
/// panic also leaves the I/O thread running for the next job.
pub(super) fn catching<T>(transfer: impl FnOnce() -> std::io::Result<T>) -> Result<T, String> {
    match catch_unwind(AssertUnwindSafe(transfer)) {
        Ok(result) => result.map_err(|e| e.to_string()),
        Err(panic) => {
            let why = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            Err(format!("the I/O thread panicked: {why}"))
        }
    }
}
