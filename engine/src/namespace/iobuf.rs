//! Buffers for chunk-file transfers (requests, queued writes, read-ahead): aligned for
//! direct I/O, and reused, since allocating and zeroing up to 1 MiB per request would cost
//! more than the copy into it.

use super::disk::DIRECT_IO_ALIGN;
use std::sync::{Mutex, OnceLock};

/// Buffers kept for reuse (each up to the largest transfer plus alignment).
const SPARE_BUFFERS: usize = 32;

/// An owned buffer of a fixed length that starts on a direct-I/O boundary, so whole-block
/// transfers between it and a chunk file bypass the page cache; its memory is reused.
pub struct IoBuf {
    raw: Vec<u8>,
    start: usize,
    len: usize,
}

fn spare_buffers() -> &'static Mutex<Vec<Vec<u8>>> {
    static SPARE: OnceLock<Mutex<Vec<Vec<u8>>>> = OnceLock::new();
    SPARE.get_or_init(Mutex::default)
}

impl IoBuf {
    /// A buffer of `len` bytes (contents unspecified).
    pub fn new(len: usize) -> IoBuf {
        let want = len + DIRECT_IO_ALIGN;
        let reused = {
            let mut spare = spare_buffers().lock().expect("spare buffers");
            let at = spare.iter().position(|b| b.len() >= want);
            at.map(|i| spare.swap_remove(i))
        };
        // Never grown afterwards: the aligned start stays where it is.
        let raw = reused.unwrap_or_else(|| vec![0; want]);
        let start = raw.as_ptr().align_offset(DIRECT_IO_ALIGN);
        IoBuf { raw, start, len }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn as_slice(&self) -> &[u8] {
        &self.raw[self.start..self.start + self.len]
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.raw[self.start..self.start + self.len]
    }
}

impl std::fmt::Debug for IoBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "IoBuf({} bytes)", self.len)
    }
}

impl Drop for IoBuf {
    fn drop(&mut self) {
        let mut spare = spare_buffers().lock().expect("spare buffers");
        if spare.len() < SPARE_BUFFERS {
            spare.push(std::mem::take(&mut self.raw));
        }
    }
}
