//! Directories this worker made, whose every name it knows. On a single-writer volume nothing
//! but this worker changes the container, so a lookup of a name such a directory does not
//! hold is answered "absent" here, without the backend's round trip. That is the lookup the
//! kernel sends before every create, mkdir and symlink of a new name: one round trip of each
//! file `cp -a` or `tar x` writes (docs/worker.md, "Names a new directory does not hold").
//!
//! The names kept are a superset of the directory's: a name is added before the change that
//! may make it (create, mkdir, symlink, rename onto it) is sent, and taken out only after a
//! change that removed it succeeded, so a change that failed, or whose outcome is unknown,
//! leaves a name that is merely looked up again. Two things bound what is kept:
//! - time: a directory is known for as long as the kernel may trust an absent name
//!   (the mount's negative TTL) from when it was made. An engine crash can take back
//!   unsynced removals; a name it brings back is then hidden no longer than the kernel's
//!   own negative entries would hide it;
//! - memory: at most [`MAX_NAMES`] names and directories in all; past that a directory is
//!   not taken on, and one that would grow past it is dropped (its lookups go to the
//!   backend again).

use dpufs_daos::dfs::Oid;
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Names and directories kept at most (some 64 bytes each).
pub const MAX_NAMES: usize = 1 << 18;

/// See the module.
#[derive(Debug)]
pub struct KnownDirs {
    /// How long a directory is known after it was made.
    trust: Duration,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    dirs: HashMap<Oid, HashSet<Box<str>>>,
    /// When each directory was made, oldest first (dropped ones stay until they expire).
    made: VecDeque<(Instant, Oid)>,
    /// Names and directories held.
    held: usize,
}

impl KnownDirs {
    /// Directories made from now on are known for `trust`.
    pub fn new(trust: Duration) -> KnownDirs {
        KnownDirs {
            trust,
            inner: Mutex::new(Inner::default()),
        }
    }

    /// Directory `dir` was just made (empty) by this worker.
    pub fn made(&self, dir: Oid) {
        let now = Instant::now();
        let mut inner = self.lock();
        inner.expire(now, self.trust);
        if inner.held >= MAX_NAMES || inner.dirs.contains_key(&dir) {
            return;
        }
        inner.dirs.insert(dir, HashSet::new());
        inner.made.push_back((now, dir));
        inner.held += 1;
    }

    /// Whether `name` is known not to be in `dir`.
    pub fn absent(&self, dir: Oid, name: &str) -> bool {
        let now = Instant::now();
        let mut inner = self.lock();
        inner.expire(now, self.trust);
        inner
            .dirs
            .get(&dir)
            .is_some_and(|names| !names.contains(name))
    }

    /// `name` may be in `dir` from now on: called before a change that may make it.
    pub fn may_hold(&self, dir: Oid, name: &str) {
        let mut inner = self.lock();
        let full = inner.held >= MAX_NAMES;
        let Some(names) = inner.dirs.get_mut(&dir) else {
            return;
        };
        if names.contains(name) {
            return;
        }
        if full {
            inner.drop_dir(dir);
            return;
        }
        names.insert(name.into());
        inner.held += 1;
    }

    /// `name` is no longer in `dir`: called after a change that removed it succeeded.
    pub fn removed(&self, dir: Oid, name: &str) {
        let mut inner = self.lock();
        if inner
            .dirs
            .get_mut(&dir)
            .is_some_and(|names| names.remove(name))
        {
            inner.held -= 1;
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().expect("known directories")
    }
}

impl Inner {
    /// Forgets the directories made longer than `trust` before `now`.
    fn expire(&mut self, now: Instant, trust: Duration) {
        while let Some(&(at, dir)) = self.made.front() {
            if now.duration_since(at) < trust {
                break;
            }
            self.made.pop_front();
            self.drop_dir(dir);
        }
    }

    fn drop_dir(&mut self, dir: Oid) {
        if let Some(names) = self.dirs.remove(&dir) {
            self.held -= names.len() + 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR: Duration = Duration::from_secs(3600);

    #[test]
    fn only_names_of_made_directories_are_known_absent() {
        let known = KnownDirs::new(HOUR);
        assert!(!known.absent(1, "a"), "a directory it did not make");
        known.made(2);
        assert!(known.absent(2, "a"));
        known.may_hold(2, "a");
        assert!(!known.absent(2, "a"));
        assert!(known.absent(2, "b"));
        known.removed(2, "a");
        assert!(known.absent(2, "a"));
        known.may_hold(1, "x");
        assert!(
            !known.absent(1, "y"),
            "names of unknown directories are not kept"
        );
    }

    #[test]
    fn a_directory_is_known_for_the_trust_it_was_made_with() {
        let known = KnownDirs::new(Duration::from_millis(50));
        known.made(2);
        known.may_hold(2, "a");
        assert!(known.absent(2, "b"));
        std::thread::sleep(Duration::from_millis(60));
        assert!(!known.absent(2, "b"));
        assert!(known.lock().dirs.is_empty());
        assert_eq!(known.lock().held, 0);
    }

    #[test]
    fn past_the_bound_a_directory_that_grows_is_dropped() {
        let known = KnownDirs::new(HOUR);
        known.made(2);
        for i in 0..MAX_NAMES - 1 {
            known.may_hold(2, &i.to_string());
        }
        assert_eq!(known.lock().held, MAX_NAMES);
        known.made(3);
        assert!(!known.absent(3, "a"), "no directory taken on when full");
        known.may_hold(2, "0");
        assert!(known.absent(2, "new"), "a name it holds costs nothing");
        known.may_hold(2, "one more");
        assert!(!known.absent(2, "new"), "dropped rather than grown");
        assert_eq!(known.lock().held, 0);
        known.made(3);
        assert!(known.absent(3, "a"), "room again");
    }
}
