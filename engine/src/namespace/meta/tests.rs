//! The metadata store on its own: listings resume after their cookie however the directory
//! changed, and the cookie hash is pinned.

use super::{MetaStore, name_hash};
use crate::namespace::error::DfsResult;
use crate::namespace::inode::ROOT;
use crate::namespace::sim_disk::SimDisk;
use std::path::Path;
use std::sync::Arc;

fn store() -> MetaStore {
    let meta = MetaStore::open(
        Arc::new(SimDisk::default()),
        Path::new("/r0/c/meta.redb"),
        false,
    )
    .unwrap();
    meta.init(1 << 16).unwrap();
    meta
}

/// Removes a file entry; files here have no data to free.
fn unlink(meta: &MetaStore, name: &str) -> DfsResult<()> {
    meta.remove_entry(ROOT, name, false, |_| Ok(0)).map(drop)
}

#[test]
fn listings_resume_after_their_cookie_whatever_was_removed() {
    let ns = store();
    for i in 0..100 {
        ns.create(ROOT, &format!("f{i}"), 0o644, 0, 0).unwrap();
    }
    let first = ns.readdir(ROOT, 0, 10).unwrap();
    let last = first.entries.last().unwrap().clone();
    // Remove the entry the cookie belongs to and one not listed yet.
    unlink(&ns, &last.name).unwrap();
    let later = ns.readdir(ROOT, last.cookie, 1).unwrap().entries[0].clone();
    unlink(&ns, &later.name).unwrap();
    let mut seen: Vec<String> = first.entries.iter().map(|e| e.name.clone()).collect();
    let mut cookie = last.cookie;
    loop {
        let page = ns.readdir(ROOT, cookie, 7).unwrap();
        seen.extend(page.entries.iter().map(|e| e.name.clone()));
        cookie = page.entries.last().map_or(cookie, |e| e.cookie);
        if page.end {
            break;
        }
    }
    assert_eq!(
        seen.len(),
        99,
        "each survivor once, plus the one removed after it was seen"
    );
    assert!(!seen.contains(&later.name));
    seen.sort();
    seen.dedup();
    assert_eq!(seen.len(), 99);
    // A cookie is the entry's own: listing again gives it the same one.
    let again = ns.readdir(ROOT, 0, 200).unwrap();
    let e = again
        .entries
        .iter()
        .find(|e| e.name == first.entries[0].name)
        .unwrap();
    assert_eq!(e.cookie, first.entries[0].cookie);
    assert_eq!(e.cookie, name_hash(&e.name));
}

#[test]
fn name_hash_is_pinned() {
    // Stored in every entry key: changing the function orphans existing entries.
    assert_eq!(name_hash("a"), 0x4151_54ac_54df_672d);
}
