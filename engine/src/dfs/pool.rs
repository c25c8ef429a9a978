//! Threads that move data between chunk files and memory for requests already answered
//! (queued writes, `behind.rs`) or not made yet (read-ahead, `ahead.rs`). Shared by every
//! namespace: their number is how many such transfers the disk sees at once.

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
