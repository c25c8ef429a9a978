//! What a single-writer worker keeps of the names, attributes and listing ends it handed the
//! kernel, so that the kernel dropping its own caches (memory pressure, `drop_caches`) does
//! not send those lookups, stats and end-of-listing reads to the backend again
//! (docs/worker.md, "Entries the kernel dropped").
//!
//! On a single-writer volume every change reaches the container through this worker, so what
//! it keeps stays true but for the changes it sends itself, and it drops what each of those
//! touches. It keeps nothing longer than the kernel may trust it (the entry and attribute
//! timeouts from when the backend answered): an answer from here is one the kernel would
//! still have held had it kept its own cache, with the same time left. Three rules keep it
//! exact:
//! - an object is dropped *after* every change of it (write, setattr, extended attributes,
//!   allocation) and of its directory's entries, whatever the change's outcome;
//! - a backend answer is kept only if no change at all was dropped since it was asked for
//!   (the [`Ticket`] taken before the request): an answer read before a change cannot be kept
//!   after it;
//! - memory: at most [`MAX_ENTRIES`] objects and ends; past that the oldest go first.

use dpufs_daos::dfs::{Attr, Oid};
use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Objects (and listing ends) kept at most: some 200 bytes each.
pub const MAX_ENTRIES: usize = 1 << 18;

/// Taken before asking the backend; an answer is kept only if nothing changed since.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ticket(u64);

/// See the module.
#[derive(Debug)]
pub struct EntryCache {
    /// How long anything is kept after the backend answered: the shorter of the timeouts.
    keep: Duration,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// directory → name → object.
    names: HashMap<Oid, HashMap<Box<str>, Oid>>,
    objects: HashMap<Oid, Cached>,
    /// directory → the cookie after which its listing is known to hold nothing.
    ends: HashMap<Oid, (u64, Instant)>,
    /// When each object or end was kept, oldest first (replaced ones stay until they pass).
    kept: VecDeque<(Instant, Kept)>,
    /// Changes dropped so far (what a [`Ticket`] counts).
    changes: u64,
}

#[derive(Debug)]
struct Cached {
    parent: Oid,
    name: Box<str>,
    attr: Attr,
    at: Instant,
}

#[derive(Clone, Copy, Debug)]
enum Kept {
    Object(Oid),
    End(Oid),
}

impl EntryCache {
    /// Keeps what the backend answers for `keep` (the shorter of the entry and attribute
    /// timeouts).
    pub fn new(keep: Duration) -> EntryCache {
        EntryCache {
            keep,
            inner: Mutex::new(Inner::default()),
        }
    }

    /// Take before asking the backend something whose answer may be kept.
    pub fn ticket(&self) -> Ticket {
        Ticket(self.lock().changes)
    }

    /// `name` in `parent` is `attr`, as the backend answered after `ticket` was taken.
    pub fn keep(&self, ticket: Ticket, parent: Oid, name: &str, attr: &Attr) {
        let now = Instant::now();
        let mut inner = self.lock();
        if inner.changes != ticket.0 {
            return;
        }
        inner.expire(now, self.keep);
        inner.drop_object(attr.oid);
        if let Some(old) = inner.names.get(&parent).and_then(|n| n.get(name)).copied() {
            inner.drop_object(old);
        }
        inner.make_room();
        inner
            .names
            .entry(parent)
            .or_default()
            .insert(name.into(), attr.oid);
        inner.objects.insert(
            attr.oid,
            Cached {
                parent,
                name: name.into(),
                attr: attr.clone(),
                at: now,
            },
        );
        inner.kept.push_back((now, Kept::Object(attr.oid)));
    }

    /// The object `name` names in `parent` and how long ago the backend said so.
    pub fn lookup(&self, parent: Oid, name: &str) -> Option<(Attr, Duration)> {
        let now = Instant::now();
        let mut inner = self.lock();
        inner.expire(now, self.keep);
        let oid = *inner.names.get(&parent)?.get(name)?;
        let c = &inner.objects[&oid];
        Some((c.attr.clone(), now.duration_since(c.at)))
    }

    /// The attributes of `oid` and how long ago the backend gave them.
    pub fn attr(&self, oid: Oid) -> Option<(Attr, Duration)> {
        let now = Instant::now();
        let mut inner = self.lock();
        inner.expire(now, self.keep);
        let c = inner.objects.get(&oid)?;
        Some((c.attr.clone(), now.duration_since(c.at)))
    }

    /// The listing of `dir` holds nothing after `cookie`, as the backend answered after
    /// `ticket` was taken.
    pub fn keep_end(&self, ticket: Ticket, dir: Oid, cookie: u64) {
        let now = Instant::now();
        let mut inner = self.lock();
        if inner.changes != ticket.0 {
            return;
        }
        inner.expire(now, self.keep);
        inner.make_room();
        inner.ends.insert(dir, (cookie, now));
        inner.kept.push_back((now, Kept::End(dir)));
    }

    /// Whether the listing of `dir` is known to hold nothing after `cookie`.
    pub fn ends_at(&self, dir: Oid, cookie: u64) -> bool {
        let now = Instant::now();
        let mut inner = self.lock();
        inner.expire(now, self.keep);
        inner.ends.get(&dir).is_some_and(|&(c, _)| c == cookie)
    }

    /// `oid` has changed (or may have): call after the change, whatever its outcome.
    pub fn changed(&self, oid: Oid) {
        let mut inner = self.lock();
        inner.changes += 1;
        inner.drop_object(oid);
    }

    /// The entries of `dir` have changed (or may have): `name` is dropped, and the
    /// directory's own attributes and listing end. Call after the change, whatever its
    /// outcome.
    pub fn entry_changed(&self, dir: Oid, name: &str) {
        let mut inner = self.lock();
        inner.changes += 1;
        if let Some(oid) = inner.names.get(&dir).and_then(|n| n.get(name)).copied() {
            inner.drop_object(oid);
        }
        inner.drop_object(dir);
        inner.ends.remove(&dir);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Inner {
    /// Forgets what was kept longer than `keep` before `now`.
    fn expire(&mut self, now: Instant, keep: Duration) {
        while let Some(&(at, _)) = self.kept.front() {
            if now.duration_since(at) < keep {
                break;
            }
            self.pop_oldest();
        }
    }

    /// Makes room for one more: the oldest go first.
    fn make_room(&mut self) {
        while self.objects.len() + self.ends.len() >= MAX_ENTRIES
            || self.kept.len() >= 2 * MAX_ENTRIES
        {
            self.pop_oldest();
        }
    }

    /// Drops the oldest thing kept, if it was not replaced since.
    fn pop_oldest(&mut self) {
        let Some((at, what)) = self.kept.pop_front() else {
            return;
        };
        match what {
            Kept::Object(oid) => {
                if self.objects.get(&oid).is_some_and(|c| c.at == at) {
                    self.drop_object(oid);
                }
            }
            Kept::End(dir) => {
                if self.ends.get(&dir).is_some_and(|&(_, t)| t == at) {
                    self.ends.remove(&dir);
                }
            }
        }
    }

    fn drop_object(&mut self, oid: Oid) {
        let Some(c) = self.objects.remove(&oid) else {
            return;
        };
        if let Some(names) = self.names.get_mut(&c.parent) {
            names.remove(&c.name);
            if names.is_empty() {
                self.names.remove(&c.parent);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR: Duration = Duration::from_secs(3600);

    fn attr(oid: Oid, size: u64) -> Attr {
        let t = dpufs_daos::dfs::Timespec::default();
        Attr {
            oid,
            mode: 0o100644,
            uid: 0,
            gid: 0,
            size,
            blocks: 0,
            nlink: 1,
            atime: t,
            mtime: t,
            ctime: t,
        }
    }

    #[test]
    fn what_is_kept_answers_by_name_and_by_object_until_it_changes() {
        let c = EntryCache::new(HOUR);
        assert!(c.lookup(1, "a").is_none());
        c.keep(c.ticket(), 1, "a", &attr(7, 10));
        assert_eq!(c.lookup(1, "a").unwrap().0.size, 10);
        assert_eq!(c.attr(7).unwrap().0.size, 10);
        assert!(c.lookup(1, "b").is_none());
        c.changed(7);
        assert!(c.lookup(1, "a").is_none(), "a write drops the object");
        assert!(c.attr(7).is_none());
    }

    #[test]
    fn an_answer_asked_for_before_a_change_is_not_kept() {
        let c = EntryCache::new(HOUR);
        let before = c.ticket();
        c.changed(99);
        c.keep(before, 1, "a", &attr(7, 10));
        assert!(c.lookup(1, "a").is_none());
        c.keep(c.ticket(), 1, "a", &attr(7, 10));
        assert!(c.lookup(1, "a").is_some());
    }

    #[test]
    fn a_change_of_an_entry_drops_the_name_the_directory_and_its_end() {
        let c = EntryCache::new(HOUR);
        c.keep(c.ticket(), 1, "dir", &attr(2, 0));
        c.keep(c.ticket(), 2, "a", &attr(3, 0));
        c.keep(c.ticket(), 2, "b", &attr(4, 0));
        c.keep_end(c.ticket(), 2, 55);
        assert!(c.ends_at(2, 55));
        assert!(!c.ends_at(2, 54));
        c.entry_changed(2, "a");
        assert!(c.lookup(2, "a").is_none());
        assert!(c.attr(2).is_none(), "the directory's times changed");
        assert!(!c.ends_at(2, 55), "a name may follow the end now");
        assert!(c.lookup(2, "b").is_some(), "the other names stay");
    }

    #[test]
    fn a_name_kept_again_replaces_the_object_it_named() {
        let c = EntryCache::new(HOUR);
        c.keep(c.ticket(), 1, "a", &attr(7, 1));
        c.keep(c.ticket(), 1, "a", &attr(8, 2));
        assert!(c.attr(7).is_none());
        assert_eq!(c.lookup(1, "a").unwrap().0.oid, 8);
        c.keep(c.ticket(), 1, "b", &attr(8, 3));
        assert!(
            c.lookup(1, "a").is_none(),
            "an object has one name (no hard links)"
        );
        assert_eq!(c.lookup(1, "b").unwrap().0.size, 3);
    }

    #[test]
    fn nothing_is_kept_longer_than_the_timeouts() {
        let c = EntryCache::new(Duration::from_millis(50));
        c.keep(c.ticket(), 1, "a", &attr(7, 1));
        c.keep_end(c.ticket(), 1, 9);
        let (_, age) = c.lookup(1, "a").unwrap();
        assert!(age < Duration::from_millis(50));
        std::thread::sleep(Duration::from_millis(60));
        assert!(c.lookup(1, "a").is_none());
        assert!(!c.ends_at(1, 9));
        let inner = c.lock();
        assert!(inner.objects.is_empty() && inner.names.is_empty() && inner.kept.is_empty());
    }

    #[test]
    fn past_the_bound_the_oldest_go_first() {
        let c = EntryCache::new(HOUR);
        for oid in 0..MAX_ENTRIES as u64 + 10 {
            c.keep(c.ticket(), 1, &oid.to_string(), &attr(oid + 100, 0));
        }
        let inner = c.lock();
        assert_eq!(inner.objects.len(), MAX_ENTRIES);
        drop(inner);
        assert!(c.lookup(1, "0").is_none(), "the oldest went");
        assert!(c.lookup(1, &(MAX_ENTRIES as u64 + 9).to_string()).is_some());
    }
}
