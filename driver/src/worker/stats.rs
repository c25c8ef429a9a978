//! Counters the control socket reports: operations per FUSE opcode with latency histograms,
//! bytes moved, and errors by errno. Lock-free (relaxed atomics): a snapshot is consistent
//! per counter, not across counters.

use dpufs_daos::dfs::Errno;
use dpufs_node_api::control::{OpStats as OpReport, WorkerStats};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

macro_rules! ops {
    ($($name:ident => $text:literal),+ $(,)?) => {
        /// A FUSE operation, as counted.
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        #[repr(usize)]
        pub enum Op { $($name),+ }

        impl Op {
            /// Every operation, in declaration order.
            pub const ALL: &'static [Op] = &[$(Op::$name),+];

            /// The name the stats report (FUSE's opcode name, lower case).
            pub fn name(self) -> &'static str {
                match self { $(Op::$name => $text),+ }
            }
        }
    };
}

ops! {
    Init => "init", Destroy => "destroy", Lookup => "lookup", Forget => "forget",
    Getattr => "getattr", Setattr => "setattr", Readlink => "readlink", Symlink => "symlink",
    Mknod => "mknod", Mkdir => "mkdir", Unlink => "unlink", Rmdir => "rmdir",
    Rename => "rename", Link => "link", Open => "open", Create => "create", Read => "read",
    Write => "write", Flush => "flush", Fsync => "fsync", Fallocate => "fallocate",
    Release => "release", Statfs => "statfs", Setxattr => "setxattr", Getxattr => "getxattr",
    Listxattr => "listxattr", Removexattr => "removexattr", Opendir => "opendir",
    Readdir => "readdir", Readdirplus => "readdirplus", Fsyncdir => "fsyncdir",
    Releasedir => "releasedir",
}

/// Latency buckets: bucket 0 holds < 1 µs, bucket i holds [2^(i-1), 2^i) µs; the last one
/// holds everything from 2^(BUCKETS-2) µs (about 36 minutes) up.
const BUCKETS: usize = 33;
/// Errno values counted one by one; larger ones share the last slot.
const ERRNOS: usize = 160;

#[derive(Debug)]
struct OpStats {
    count: AtomicU64,
    errors: AtomicU64,
    sum_ns: AtomicU64,
    max_ns: AtomicU64,
    buckets: [AtomicU64; BUCKETS],
}

impl OpStats {
    fn new() -> OpStats {
        OpStats {
            count: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            sum_ns: AtomicU64::new(0),
            max_ns: AtomicU64::new(0),
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

fn bucket(d: Duration) -> usize {
    let us = d.as_micros().min(u64::MAX as u128) as u64;
    if us == 0 {
        0
    } else {
        ((64 - us.leading_zeros()) as usize).min(BUCKETS - 1)
    }
}

/// Upper bound, in µs, of bucket `i` (exclusive).
fn bucket_bound_us(i: usize) -> u64 {
    1u64 << i
}

/// Every counter of one worker.
#[derive(Debug)]
pub struct Stats {
    started: Instant,
    ops: Vec<OpStats>,
    errnos: [AtomicU64; ERRNOS],
    bytes_read: AtomicU64,
    bytes_written: AtomicU64,
    in_flight: AtomicU64,
    /// Requests the transport could not decode or answer (the kernel gave up on them).
    transport_errors: AtomicU64,
    /// Getattrs answered from the attributes a change's reply carried.
    changed_dir_answers: AtomicU64,
    /// Lookups answered "absent" from the names of a directory this worker made.
    absent_answers: AtomicU64,
    /// Lookups, getattrs and listing ends answered from what the worker kept.
    cached_answers: AtomicU64,
}

impl Default for Stats {
    fn default() -> Self {
        Stats::new()
    }
}

impl Stats {
    /// Zeroed counters; uptime starts now.
    pub fn new() -> Stats {
        Stats {
            started: Instant::now(),
            ops: Op::ALL.iter().map(|_| OpStats::new()).collect(),
            errnos: std::array::from_fn(|_| AtomicU64::new(0)),
            bytes_read: AtomicU64::new(0),
            bytes_written: AtomicU64::new(0),
            in_flight: AtomicU64::new(0),
            transport_errors: AtomicU64::new(0),
            changed_dir_answers: AtomicU64::new(0),
            absent_answers: AtomicU64::new(0),
            cached_answers: AtomicU64::new(0),
        }
    }

    /// Marks the start of an operation (for the in-flight gauge).
    pub fn begin(&self) -> Instant {
        self.in_flight.fetch_add(1, Relaxed);
        Instant::now()
    }

    /// Records an operation that began at `start`; `errno` is `Some` if it failed.
    pub fn end(&self, op: Op, start: Instant, errno: Option<i32>) {
        let d = start.elapsed();
        self.in_flight.fetch_sub(1, Relaxed);
        let s = &self.ops[op as usize];
        s.count.fetch_add(1, Relaxed);
        let ns = d.as_nanos().min(u64::MAX as u128) as u64;
        s.sum_ns.fetch_add(ns, Relaxed);
        s.max_ns.fetch_max(ns, Relaxed);
        s.buckets[bucket(d)].fetch_add(1, Relaxed);
        if let Some(e) = errno {
            s.errors.fetch_add(1, Relaxed);
            let slot = (e.max(0) as usize).min(ERRNOS - 1);
            self.errnos[slot].fetch_add(1, Relaxed);
        }
    }

    /// Counts an operation that has no latency worth measuring (forget).
    pub fn count(&self, op: Op, n: u64) {
        self.ops[op as usize].count.fetch_add(n, Relaxed);
    }

    /// Bytes returned to readers.
    pub fn add_read(&self, n: u64) {
        self.bytes_read.fetch_add(n, Relaxed);
    }

    /// Bytes accepted from writers.
    pub fn add_written(&self, n: u64) {
        self.bytes_written.fetch_add(n, Relaxed);
    }

    /// A getattr answered from the attributes a change's reply carried, with no request to
    /// the backend.
    pub fn changed_dir_answer(&self) {
        self.changed_dir_answers.fetch_add(1, Relaxed);
    }

    /// A lookup answered "absent" with no request to the backend.
    pub fn absent_answer(&self) {
        self.absent_answers.fetch_add(1, Relaxed);
    }

    /// A lookup, getattr or listing end answered from what the worker kept of the backend's
    /// earlier answers (a single-writer volume), with no request to the backend.
    pub fn cached_answer(&self) {
        self.cached_answers.fetch_add(1, Relaxed);
    }

    /// A request that failed in the transport (decode error, reply refused by the kernel).
    pub fn transport_error(&self) {
        self.transport_errors.fetch_add(1, Relaxed);
    }

    /// Requests being served right now.
    pub fn in_flight(&self) -> u64 {
        self.in_flight.load(Relaxed)
    }

    /// Operations of one kind served so far.
    pub fn op_count(&self, op: Op) -> u64 {
        self.ops[op as usize].count.load(Relaxed)
    }

    /// Seconds since the counters started.
    pub fn uptime(&self) -> Duration {
        self.started.elapsed()
    }

    /// The counters as the control socket's `stats` answer reports them:
    ///
    /// ```json
    /// {"uptime_secs": 1.5, "bytes_read": 0, "bytes_written": 4096, "in_flight": 0,
    ///  "transport_errors": 0, "errors": {"ENOENT": 2},
    ///  "ops": {"write": {"count": 1, "errors": 0, "mean_us": 31.0, "max_us": 31,
    ///          "p50_us": 32, "p99_us": 32, "histogram_us": [[32, 1]]}}}
    /// ```
    /// `histogram_us` lists `[upper bound in µs (exclusive), count]` for the non-empty
    /// power-of-two buckets; percentiles are bucket upper bounds. Operations never seen are
    /// left out.
    pub fn snapshot(&self) -> WorkerStats {
        let mut ops = std::collections::BTreeMap::new();
        for &op in Op::ALL {
            let s = &self.ops[op as usize];
            let count = s.count.load(Relaxed);
            if count == 0 {
                continue;
            }
            let buckets: Vec<u64> = s.buckets.iter().map(|b| b.load(Relaxed)).collect();
            let timed: u64 = buckets.iter().sum();
            let percentile = |p: f64| -> Option<u64> {
                if timed == 0 {
                    return None;
                }
                let want = ((timed as f64) * p).ceil().max(1.0) as u64;
                let mut seen = 0;
                for (i, n) in buckets.iter().enumerate() {
                    seen += n;
                    if seen >= want {
                        return Some(bucket_bound_us(i));
                    }
                }
                None
            };
            let histogram_us = buckets
                .iter()
                .enumerate()
                .filter(|(_, n)| **n > 0)
                .map(|(i, n)| (bucket_bound_us(i), *n))
                .collect();
            let mean_us = if timed > 0 {
                s.sum_ns.load(Relaxed) as f64 / timed as f64 / 1000.0
            } else {
                0.0
            };
            ops.insert(
                op.name().to_string(),
                OpReport {
                    count,
                    errors: s.errors.load(Relaxed),
                    mean_us: (mean_us * 10.0).round() / 10.0,
                    max_us: s.max_ns.load(Relaxed) / 1000,
                    p50_us: percentile(0.50),
                    p99_us: percentile(0.99),
                    histogram_us,
                },
            );
        }
        let mut errors = std::collections::BTreeMap::new();
        for (e, n) in self.errnos.iter().enumerate() {
            let n = n.load(Relaxed);
            if n > 0 {
                let name = if e == ERRNOS - 1 {
                    "other".to_string()
                } else {
                    Errno(e as i32).name()
                };
                errors.insert(name, n);
            }
        }
        WorkerStats {
            uptime_secs: self.started.elapsed().as_secs_f64(),
            bytes_read: self.bytes_read.load(Relaxed),
            bytes_written: self.bytes_written.load(Relaxed),
            in_flight: self.in_flight(),
            transport_errors: self.transport_errors.load(Relaxed),
            changed_dir_answers: self.changed_dir_answers.load(Relaxed),
            absent_answers: self.absent_answers.load(Relaxed),
            cached_answers: self.cached_answers.load(Relaxed),
            errors,
            ops,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_powers_of_two_in_microseconds() {
        assert_eq!(bucket(Duration::from_nanos(500)), 0);
        assert_eq!(bucket(Duration::from_micros(1)), 1);
        assert_eq!(bucket(Duration::from_micros(3)), 2);
        assert_eq!(bucket(Duration::from_micros(4)), 3);
        assert_eq!(bucket(Duration::from_secs(1 << 40)), BUCKETS - 1);
        // Every value is below its bucket's bound.
        for us in [1u64, 2, 3, 7, 8, 1000, 65_535] {
            let b = bucket(Duration::from_micros(us));
            assert!(us < bucket_bound_us(b), "{us} µs in bucket {b}");
        }
    }

    #[test]
    fn snapshot_reports_counts_bytes_and_errnos() {
        let s = Stats::new();
        let t = s.begin();
        s.end(Op::Write, t, None);
        let t = s.begin();
        s.end(Op::Lookup, t, Some(libc::ENOENT));
        s.add_written(4096);
        s.count(Op::Forget, 3);
        let v = s.snapshot();
        assert_eq!(v.bytes_written, 4096);
        assert_eq!(v.ops["write"].count, 1);
        assert_eq!(v.ops["lookup"].errors, 1);
        assert_eq!(v.ops["forget"].count, 3);
        assert_eq!(v.errors["ENOENT"], 1);
        assert_eq!(v.in_flight, 0);
        assert!(!v.ops.contains_key("read"));
        assert!(v.ops["write"].p99_us.is_some());
        // Counted without timing: no percentiles.
        assert_eq!(v.ops["forget"].p50_us, None);
    }
}
