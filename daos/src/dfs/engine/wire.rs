//! Between [`Dfs`](super::super::Dfs) types and the data service's messages, and the one
//! place engine failures become [`DfsError`]s.

use super::super::{Attr, DfsError, DirEntry, Errno, SetAttr, StatFs, TimeSet, Timespec};
use dpufs_proto::engine::v1 as wire;

/// An errno reply as the caller sees it.
pub fn reply_error(errno: i32, detail: String) -> DfsError {
    DfsError::new(Errno(errno), detail)
}

/// A reply that does not fit the request.
pub fn protocol_error(what: impl Into<String>) -> DfsError {
    DfsError::new(Errno::IO, format!("protocol: {}", what.into()))
}

fn time(t: Option<wire::DfsTime>) -> Timespec {
    t.map_or_else(Timespec::default, |t| Timespec {
        secs: t.secs,
        nanos: t.nanos,
    })
}

fn to_wire_time(t: Timespec) -> wire::DfsTime {
    wire::DfsTime {
        secs: t.secs,
        nanos: t.nanos,
    }
}

pub fn attr(a: wire::DfsAttr) -> Attr {
    Attr {
        oid: a.oid,
        mode: a.mode,
        uid: a.uid,
        gid: a.gid,
        size: a.size,
        blocks: a.blocks,
        nlink: a.nlink,
        atime: time(a.atime),
        mtime: time(a.mtime),
        ctime: time(a.ctime),
    }
}

pub fn entry(e: wire::DfsDirEntry) -> DirEntry {
    DirEntry {
        attr: e.attr.map(attr),
        name: e.name,
        oid: e.oid,
        kind: e.kind,
        cookie: e.cookie,
    }
}

pub fn set_attr(oid: u64, set: &SetAttr) -> wire::SetAttr {
    let split = |t: Option<TimeSet>| match t {
        None => (None, false),
        Some(TimeSet::Now) => (None, true),
        Some(TimeSet::At(t)) => (Some(to_wire_time(t)), false),
    };
    let (atime, atime_now) = split(set.atime);
    let (mtime, mtime_now) = split(set.mtime);
    wire::SetAttr {
        oid,
        mode: set.mode,
        uid: set.uid,
        gid: set.gid,
        size: set.size,
        atime,
        mtime,
        atime_now,
        mtime_now,
    }
}

pub fn statfs(s: wire::DfsStatFs) -> StatFs {
    StatFs {
        total_bytes: s.total_bytes,
        free_bytes: s.free_bytes,
        files: s.files,
    }
}
