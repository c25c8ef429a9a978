//! Between the wire messages (`dpufs/engine/v1/dfs.proto`) and the namespace's types.

use crate::namespace::{DfsError, DirEntry, Inode, SetAttr, Time};
use dpufs_proto::engine::v1 as proto;

/// Longest failure detail sent back (the reply must stay small).
const MAX_DETAIL: usize = 1024;

pub fn time(t: Time) -> proto::DfsTime {
    proto::DfsTime {
        secs: t.secs,
        nanos: t.nanos,
    }
}

fn from_wire_time(t: &proto::DfsTime) -> Time {
    Time {
        secs: t.secs,
        nanos: t.nanos.min(999_999_999),
    }
}

/// What stat reports. DFS has no hard links: nlink is 1. Blocks follow the size, as DFS's
/// (statfs and blocks are approximate on DFS).
pub fn attr(ino: &Inode) -> proto::DfsAttr {
    proto::DfsAttr {
        oid: ino.oid,
        mode: ino.mode,
        uid: ino.uid,
        gid: ino.gid,
        size: ino.size,
        blocks: if ino.is_file() {
            ino.size.div_ceil(512)
        } else {
            0
        },
        nlink: 1,
        atime: Some(time(ino.atime)),
        mtime: Some(time(ino.mtime)),
        ctime: Some(time(ino.ctime)),
    }
}

/// A listing's entry on the wire; with its attributes if `plus`.
pub fn entry(e: DirEntry, plus: bool) -> proto::DfsDirEntry {
    proto::DfsDirEntry {
        attr: plus.then(|| attr(&e.inode)),
        oid: e.inode.oid,
        kind: e.kind(),
        name: e.name,
        cookie: e.cookie,
    }
}

/// A SetAttr request as the namespace takes it; `*_now` means the engine's clock.
pub fn set_attr(req: &proto::SetAttr) -> SetAttr {
    let now = Time::now();
    let pick = |at: &Option<proto::DfsTime>, now_flag: bool| match (now_flag, at) {
        (true, _) => Some(now),
        (false, Some(t)) => Some(from_wire_time(t)),
        (false, None) => None,
    };
    SetAttr {
        mode: req.mode,
        uid: req.uid,
        gid: req.gid,
        size: req.size,
        atime: pick(&req.atime, req.atime_now),
        mtime: pick(&req.mtime, req.mtime_now),
    }
}

/// The reply to a failed request.
pub fn failure(id: u64, e: DfsError) -> proto::DfsReply {
    let mut detail = e.detail;
    if detail.len() > MAX_DETAIL {
        let mut cut = MAX_DETAIL;
        while !detail.is_char_boundary(cut) {
            cut -= 1;
        }
        detail.truncate(cut);
    }
    proto::DfsReply {
        id,
        errno: e.errno.0,
        detail,
        result: None,
        dirs: Vec::new(),
        verifier: 0,
    }
}
