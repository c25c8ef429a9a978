//! The write verifier every DFS reply carries (`DfsReply.verifier`, docs/dfs.md,
//! "Durability"). A client that sees an object's fsync answered under another verifier than
//! one of its changes fails that fsync with EIO: the engine that took the change is gone, and
//! so may be the change.
//!
//! A crash must change the verifier; an orderly stop need not, since it makes every change
//! durable first. So a stop leaves its verifier in the data directory, and the next start takes
//! it, removing the record durably before it answers anything: a crash after that start draws a
//! new one. Without the record (a crash, or the first start) the verifier is new. A rolling
//! restart of the engine then costs applications no error.

use crate::layout::Layout;
use std::io::{self, Write};
use std::path::Path;

/// The verifier a previous orderly stop left (the record removed durably), else a new one.
pub(crate) fn take(layout: &Layout) -> u64 {
    let record = layout.verifier();
    match std::fs::read_to_string(&record) {
        Ok(text) => match (parse(&text), remove_durably(&record)) {
            (Some(v), Ok(())) => {
                tracing::info!(
                    verifier = format_args!("{v:#018x}"),
                    "kept the write verifier of an orderly stop"
                );
                v
            }
            (_, removed) => {
                if let Err(e) = removed {
                    tracing::warn!(
                        "removing {}: {e}; drawing a new write verifier",
                        record.display()
                    );
                }
                new()
            }
        },
        Err(e) if e.kind() == io::ErrorKind::NotFound => new(),
        Err(e) => {
            // Unreadable now, it must not be found by a later start either.
            tracing::warn!(
                "reading {}: {e}; drawing a new write verifier",
                record.display()
            );
            if let Err(e) = remove_durably(&record) {
                tracing::warn!("removing {}: {e}", record.display());
            }
            new()
        }
    }
}

/// Leaves `verifier` for the next start; the caller made every change durable first.
pub(crate) fn leave(layout: &Layout, verifier: u64) -> io::Result<()> {
    let record = layout.verifier();
    let partial = record.with_extension("partial");
    let mut f = std::fs::File::create(&partial)?;
    writeln!(f, "{verifier:016x}")?;
    f.sync_all()?;
    std::fs::rename(&partial, &record)?;
    sync_parent(&record)
}

fn parse(text: &str) -> Option<u64> {
    u64::from_str_radix(text.trim(), 16)
        .ok()
        .filter(|&v| v != 0)
}

fn remove_durably(record: &Path) -> io::Result<()> {
    std::fs::remove_file(record)?;
    sync_parent(record)
}

fn sync_parent(path: &Path) -> io::Result<()> {
    match path.parent() {
        Some(dir) => std::fs::File::open(dir)?.sync_all(),
        None => Ok(()),
    }
}

/// A verifier no earlier start had: random, never 0 (the value of an engine that does not
/// say).
fn new() -> u64 {
    uuid::Uuid::new_v4().as_u64_pair().0.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_orderly_stop_hands_its_verifier_to_the_next_start_only() {
        let dir = tempfile::tempdir().unwrap();
        let layout = Layout::new(dir.path().to_path_buf());
        let first = take(&layout);
        assert_ne!(first, 0);
        let crashed = take(&layout);
        assert_ne!(
            crashed, first,
            "no record: a start after a crash draws a new one"
        );
        leave(&layout, crashed).unwrap();
        assert_eq!(take(&layout), crashed, "after an orderly stop: the same");
        assert!(!layout.verifier().exists(), "taken once");
        assert_ne!(
            take(&layout),
            crashed,
            "a crash after that start: a new one"
        );
    }

    #[test]
    fn a_damaged_record_gives_a_new_verifier() {
        let dir = tempfile::tempdir().unwrap();
        let layout = Layout::new(dir.path().to_path_buf());
        for text in ["", "0\n", "not hex\n"] {
            std::fs::write(layout.verifier(), text).unwrap();
            assert_ne!(take(&layout), 0);
        }
    }
}
