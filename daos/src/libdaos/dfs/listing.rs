//! Directory listings with cookies that survive changes.
//!
//! libdfs iterates a directory with an opaque 120-byte anchor, in DAOS's key-hash order; a
//! FUSE offset is 64 bits. So a listing is read whole (names only, one RPC per 128 names),
//! ordered by [`name_hash`] (the cookie the engine uses too), and resumed after a cookie by
//! that order: an entry removed meanwhile is skipped when it is looked up, one added
//! meanwhile shows once the next listing starts, and no surviving entry is repeated or
//! skipped. The names read at a listing's start are kept for the pages after it.

use super::{LibDfs, Object, check, sys};
use crate::dfs::{DfsResult, DirEntry, DirPage, Errno, Oid};
use dpufs_proto::dfs::name_hash;
use std::collections::HashMap;
use std::ffi::CStr;
use std::sync::{Arc, Mutex};

/// Names of a directory, ordered by cookie.
type Names = Arc<Vec<(u64, String)>>;

/// The names read at the start of recent listings, by directory.
#[derive(Default)]
pub(super) struct Listings(Mutex<HashMap<Oid, Names>>);

/// Listings kept at once; more directories listed at the same time read their names again.
const KEPT: usize = 64;

/// Names per `dfs_readdir` call.
const BATCH: usize = 128;

impl Listings {
    fn get(&self, dir: Oid) -> Option<Names> {
        self.0.lock().expect("listings").get(&dir).cloned()
    }

    fn put(&self, dir: Oid, names: Names) {
        let mut kept = self.0.lock().expect("listings");
        if kept.len() >= KEPT {
            kept.clear();
        }
        kept.insert(dir, names);
    }
}

impl LibDfs {
    /// Every name in `dir`, by cookie.
    fn read_names(&self, dir: &Object) -> DfsResult<Names> {
        let mut anchor = sys::Anchor::start();
        let mut names = Vec::new();
        // SAFETY: `struct dirent` is plain integers and bytes; zero is valid (libdfs writes
        // only `d_name`, NUL-terminated).
        let mut batch: Vec<libc::dirent> =
            (0..BATCH).map(|_| unsafe { std::mem::zeroed() }).collect();
        while !anchor.at_end() {
            let mut nr = BATCH as u32;
            // SAFETY: the mount and `dir` are live; `anchor` is this iteration's own cursor;
            // `batch` has room for `nr` entries.
            let errno = unsafe {
                (self.lib.sym.dfs_readdir)(
                    self.mount,
                    dir.ptr,
                    &mut anchor,
                    &mut nr,
                    batch.as_mut_ptr(),
                )
            };
            check(errno, "readdir")?;
            for d in &batch[..(nr as usize).min(BATCH)] {
                // SAFETY: libdfs wrote a NUL-terminated name into the zeroed array.
                let name = unsafe { CStr::from_ptr(d.d_name.as_ptr()) };
                let name = name.to_string_lossy().into_owned();
                names.push((name_hash(&name), name));
            }
        }
        names.sort_unstable();
        Ok(Arc::new(names))
    }

    /// Up to `max` entries of `dir` after `cookie`; with `plus`, held and with attributes.
    pub(super) fn list(&self, dir: Oid, cookie: u64, max: usize, plus: bool) -> DfsResult<DirPage> {
        let object = self.object(dir)?;
        let names = match (cookie, self.listings.get(dir)) {
            (0, _) | (_, None) => {
                let names = self.read_names(&object)?;
                self.listings.put(dir, names.clone());
                names
            }
            (_, Some(names)) => names,
        };
        let start = names.partition_point(|(hash, _)| *hash <= cookie);
        let mut page = DirPage::default();
        for (hash, name) in &names[start..] {
            if page.entries.len() >= max.max(1) {
                return Ok(page);
            }
            match self.entry(&object, name, *hash, plus) {
                Ok(entry) => page.entries.push(entry),
                // Removed since the names were read.
                Err(e) if e.errno == Errno::NOENT => {}
                Err(e) => return Err(e),
            }
        }
        page.end = true;
        Ok(page)
    }

    fn entry(&self, dir: &Object, name: &str, cookie: u64, plus: bool) -> DfsResult<DirEntry> {
        let (object, st) = self.lookup_rel(dir, name)?;
        let kind = object.kind;
        let oid = object.oid;
        let attr = if plus {
            self.hold(object)?;
            Some(super::attr_of(oid, &st))
        } else {
            None
        };
        Ok(DirEntry {
            name: name.to_string(),
            oid,
            kind,
            cookie,
            attr,
        })
    }
}
