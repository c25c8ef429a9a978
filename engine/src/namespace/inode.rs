//! DFS inodes: what a directory entry says about its object, packed in a
//! fixed little-endian record (DFS keeps a similar 88-byte record per entry).

use std::time::{SystemTime, UNIX_EPOCH};

/// Object id; the root directory is 1, as in DFS (OID 1.0).
pub type Oid = u64;
pub const ROOT: Oid = 1;

pub const S_IFMT: u32 = 0o170000;
pub const S_IFDIR: u32 = 0o040000;
pub const S_IFREG: u32 = 0o100000;
pub const S_IFLNK: u32 = 0o120000;

/// A point in time, seconds and nanoseconds since the Unix epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct Time {
    pub secs: i64,
    pub nanos: u32,
}

impl Time {
    pub fn now() -> Time {
        let d = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        Time {
            secs: d.as_secs() as i64,
            nanos: d.subsec_nanos(),
        }
    }
}

/// Everything stat(2) reports about an object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inode {
    pub oid: Oid,
    /// File type and permission bits.
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    /// Bytes for files, target length for symlinks, 0 for directories.
    pub size: u64,
    pub atime: Time,
    pub mtime: Time,
    pub ctime: Time,
    /// The directory holding this object (renames keep it current).
    pub parent: Oid,
}

const RECORD: usize = 4 + 4 + 4 + 8 + 3 * 12 + 8;

impl Inode {
    pub fn is_dir(&self) -> bool {
        self.mode & S_IFMT == S_IFDIR
    }
    pub fn is_file(&self) -> bool {
        self.mode & S_IFMT == S_IFREG
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(RECORD);
        b.extend_from_slice(&self.mode.to_le_bytes());
        b.extend_from_slice(&self.uid.to_le_bytes());
        b.extend_from_slice(&self.gid.to_le_bytes());
        b.extend_from_slice(&self.size.to_le_bytes());
        for t in [self.atime, self.mtime, self.ctime] {
            b.extend_from_slice(&t.secs.to_le_bytes());
            b.extend_from_slice(&t.nanos.to_le_bytes());
        }
        b.extend_from_slice(&self.parent.to_le_bytes());
        b
    }

    /// Decodes a record; None if it is not one.
    pub fn decode(oid: Oid, b: &[u8]) -> Option<Inode> {
        if b.len() != RECORD {
            return None;
        }
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"));
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"));
        let time_at = |o: usize| Time {
            secs: u64_at(o) as i64,
            nanos: u32_at(o + 8),
        };
        Some(Inode {
            oid,
            mode: u32_at(0),
            uid: u32_at(4),
            gid: u32_at(8),
            size: u64_at(12),
            atime: time_at(20),
            mtime: time_at(32),
            ctime: time_at(44),
            parent: u64_at(56),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip() {
        let ino = Inode {
            oid: 7,
            mode: S_IFREG | 0o640,
            uid: 1000,
            gid: 100,
            size: 1 << 40,
            atime: Time { secs: 1, nanos: 2 },
            mtime: Time {
                secs: -3,
                nanos: 999_999_999,
            },
            ctime: Time::now(),
            parent: ROOT,
        };
        assert_eq!(Inode::decode(7, &ino.encode()), Some(ino));
        assert_eq!(Inode::decode(7, &[0; 3]), None);
    }
}
