//! A writer of the "newc" cpio format, which the Linux kernel unpacks as an initramfs
//! (Documentation/driver-api/early-userspace/buffer-format.rst). Entries are streamed to the
//! output; parents are added before their children, as the kernel needs them to exist.
//!
//! The archive is left uncompressed on purpose: the kernel unpacks plain newc as well as
//! gzip, and under TCG emulation decompressing tens of MiB (a debug build of `dpufs-csi`) costs
//! more guest time than QEMU takes to load the larger file.

use std::collections::BTreeSet;
use std::io::{self, Read, Write};

/// `S_IFDIR`, `S_IFREG`, `S_IFLNK` of the entries' `c_mode`.
const S_IFDIR: u32 = 0o040000;
const S_IFREG: u32 = 0o100000;
const S_IFLNK: u32 = 0o120000;

/// A newc archive being written to `out`.
#[derive(Debug)]
pub struct CpioWriter<W: Write> {
    out: W,
    /// Bytes written so far (entries are aligned to 4 bytes from the archive's start).
    offset: u64,
    next_ino: u32,
    /// Every path already in the archive, without its leading `/`.
    paths: BTreeSet<String>,
}

impl<W: Write> CpioWriter<W> {
    pub fn new(out: W) -> CpioWriter<W> {
        CpioWriter {
            out,
            offset: 0,
            next_ino: 1,
            paths: BTreeSet::new(),
        }
    }

    /// Adds directory `path` (and its missing parents) with mode 0755; a directory that is
    /// already there is left as it is.
    pub fn dir(&mut self, path: &str) -> io::Result<()> {
        let path = relative(path)?;
        if path.is_empty() || self.paths.contains(path) {
            return Ok(());
        }
        self.parents(path)?;
        self.header(path, S_IFDIR | 0o755, 2, 0)?;
        self.pad()
    }

    /// Adds a regular file of `len` bytes read from `data`, with permission bits `perm`.
    pub fn file(&mut self, path: &str, perm: u32, len: u64, data: impl Read) -> io::Result<()> {
        let path = relative(path)?;
        self.parents(path)?;
        self.header(path, S_IFREG | (perm & 0o7777), 1, len)?;
        let copied = io::copy(&mut data.take(len), &mut self.out)?;
        if copied != len {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("{path}: {copied} of {len} bytes"),
            ));
        }
        self.offset += len;
        self.pad()
    }

    /// Adds a symbolic link at `path` pointing to `target`.
    pub fn symlink(&mut self, path: &str, target: &str) -> io::Result<()> {
        let path = relative(path)?;
        self.parents(path)?;
        self.header(path, S_IFLNK | 0o777, 1, target.len() as u64)?;
        self.out.write_all(target.as_bytes())?;
        self.offset += target.len() as u64;
        self.pad()
    }

    /// Whether `path` is in the archive already.
    pub fn contains(&self, path: &str) -> bool {
        relative(path).is_ok_and(|p| self.paths.contains(p))
    }

    /// Writes the trailer and returns the output.
    pub fn finish(mut self) -> io::Result<W> {
        self.header_raw("TRAILER!!!", 0, 0, 1, 0)?;
        self.pad()?;
        self.out.flush()?;
        Ok(self.out)
    }

    fn parents(&mut self, path: &str) -> io::Result<()> {
        match path.rsplit_once('/') {
            Some((parent, _)) => self.dir(parent),
            None => Ok(()),
        }
    }

    fn header(&mut self, path: &str, mode: u32, nlink: u32, size: u64) -> io::Result<()> {
        if !self.paths.insert(path.to_string()) {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("{path} is in the initramfs twice"),
            ));
        }
        let ino = self.next_ino;
        self.next_ino += 1;
        self.header_raw(path, ino, mode, nlink, size)
    }

    fn header_raw(
        &mut self,
        name: &str,
        ino: u32,
        mode: u32,
        nlink: u32,
        size: u64,
    ) -> io::Result<()> {
        let size = u32::try_from(size).map_err(|_| {
            io::Error::new(io::ErrorKind::InvalidInput, format!("{name}: over 4 GiB"))
        })?;
        // magic, then ino mode uid gid nlink mtime filesize devmajor devminor rdevmajor
        // rdevminor namesize check, each 8 hex digits.
        let fields = [
            ino,
            mode,
            0,
            0,
            nlink,
            0,
            size,
            0,
            0,
            0,
            0,
            name.len() as u32 + 1,
            0,
        ];
        let mut header = String::from("070701");
        for field in fields {
            header.push_str(&format!("{field:08x}"));
        }
        self.out.write_all(header.as_bytes())?;
        self.out.write_all(name.as_bytes())?;
        self.out.write_all(&[0])?;
        self.offset += header.len() as u64 + name.len() as u64 + 1;
        self.pad()
    }

    /// Pads to the next multiple of 4 bytes (after each header and each file's data).
    fn pad(&mut self) -> io::Result<()> {
        let pad = (4 - self.offset % 4) % 4;
        self.out.write_all(&[0; 3][..pad as usize])?;
        self.offset += pad;
        Ok(())
    }
}

/// `path` without its leading `/`; refuses `..` and empty components.
fn relative(path: &str) -> io::Result<&str> {
    let rel = path.trim_start_matches('/').trim_end_matches('/');
    if rel.split('/').any(|c| c == ".." || c == ".") || rel.contains("//") {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{path}: not a plain path"),
        ));
    }
    Ok(rel)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Command, Stdio};

    /// GNU cpio (when installed) reads back what the writer wrote: names, types, contents.
    #[test]
    fn gnu_cpio_lists_and_extracts_the_archive() {
        let mut w = CpioWriter::new(Vec::new());
        w.file("/usr/bin/hello", 0o755, 5, &b"hello"[..]).unwrap();
        w.symlink("/bin/sh", "/usr/bin/hello").unwrap();
        w.dir("/usr").unwrap();
        w.file("/empty", 0o644, 0, io::empty()).unwrap();
        assert!(w.contains("/usr/bin"));
        assert!(
            w.file("usr/bin/hello", 0o644, 0, io::empty()).is_err(),
            "a path twice"
        );
        let archive = w.finish().unwrap();
        assert_eq!(archive.len() % 4, 0);

        let Ok(mut cpio) = Command::new("cpio")
            .args(["-t", "-v", "--quiet"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
        else {
            // The checks above ran; the format check needs the binary (CI installs it).
            crate::guest::assets::skip("gnu_cpio_lists_and_extracts_the_archive", "no cpio");
            return;
        };
        cpio.stdin.take().unwrap().write_all(&archive).unwrap();
        let out = cpio.wait_with_output().unwrap();
        assert!(out.status.success());
        let listing: Vec<String> = String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                format!("{} {} {}", f[0], f[4], f[8..].join(" "))
            })
            .collect();
        assert_eq!(
            listing,
            [
                "drwxr-xr-x 0 usr",
                "drwxr-xr-x 0 usr/bin",
                "-rwxr-xr-x 5 usr/bin/hello",
                "drwxr-xr-x 0 bin",
                "lrwxrwxrwx 14 bin/sh -> /usr/bin/hello",
                "-rw-r--r-- 0 empty",
            ]
        );
    }
}
