//! The mdtest-like phases: every job (a thread) applies one operation to its own files, in
//! one shared directory or in a subtree of its own.

use super::super::cpu;
use super::phase::{Layout, MdOp};
use anyhow::{Context, bail};
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::fd::IntoRawFd;
use std::path::{Path, PathBuf};

/// Directories per job in the tree layout.
pub const TREE_DIRS: usize = 10;

/// The files of a phase under `root`, job by job: `files` in all, spread evenly over `jobs`.
pub fn job_files(root: &Path, layout: Layout, jobs: u32, files: u64) -> Vec<Vec<PathBuf>> {
    let jobs = u64::from(jobs);
    (0..jobs)
        .map(|j| {
            let mine = files / jobs + u64::from(j < files % jobs);
            (0..mine)
                .map(|i| match layout {
                    Layout::SharedDir => root.join(format!("f{j}.{i}")),
                    Layout::Tree => {
                        job_dir(root, j, (i % TREE_DIRS as u64) as usize).join(format!("f{i}"))
                    }
                })
                .collect()
        })
        .collect()
}

/// The directories the tree layout needs before its files, parents first.
pub fn dirs(root: &Path, layout: Layout, jobs: u32) -> Vec<PathBuf> {
    match layout {
        Layout::SharedDir => Vec::new(),
        Layout::Tree => (0..u64::from(jobs))
            .flat_map(|j| {
                let top = root.join(format!("j{j}"));
                std::iter::once(top).chain((0..TREE_DIRS).map(move |d| job_dir(root, j, d)))
            })
            .collect(),
    }
}

fn job_dir(root: &Path, job: u64, dir: usize) -> PathBuf {
    root.join(format!("j{job}")).join(format!("d{dir}"))
}

/// Applies `op` to every file, one thread per job; returns the threads' CPU seconds.
pub fn run(op: MdOp, jobs: &[Vec<PathBuf>], data: &[u8]) -> anyhow::Result<f64> {
    std::thread::scope(|s| {
        let threads: Vec<_> = jobs
            .iter()
            .map(|files| s.spawn(move || job(op, files, data)))
            .collect();
        let mut cpu_s = 0.0;
        for t in threads {
            // A panic in a job is a bug here, not a measurement: pass it on.
            cpu_s += t.join().unwrap_or_else(|p| std::panic::resume_unwind(p))?;
        }
        Ok(cpu_s)
    })
}

/// One job: `op` on each of its files; returns its CPU seconds.
fn job(op: MdOp, files: &[PathBuf], data: &[u8]) -> anyhow::Result<f64> {
    let start = cpu::thread_s();
    // One byte more than a file holds, so one read sees it all and a longer file shows.
    let mut buf = vec![0u8; data.len() + 1];
    for path in files {
        one(op, path, data, &mut buf).with_context(|| format!("{op:?} {}", path.display()))?;
    }
    Ok(cpu::thread_s() - start)
}

fn one(op: MdOp, path: &Path, data: &[u8], buf: &mut [u8]) -> anyhow::Result<()> {
    match op {
        MdOp::Create => {
            let mut f = OpenOptions::new().write(true).create_new(true).open(path)?;
            f.write_all(data)?;
            close(f)?;
        }
        MdOp::Stat => {
            std::fs::metadata(path)?;
        }
        MdOp::Read => {
            let mut f = File::open(path)?;
            let n = read_all(&mut f, buf)?;
            close(f)?;
            if n > data.len() {
                bail!("longer than the {} bytes written", data.len());
            }
            if n < data.len() {
                bail!("read {n} of the {} bytes written", data.len());
            }
        }
        MdOp::Unlink => std::fs::remove_file(path)?,
    }
    Ok(())
}

/// Reads until end of file or `buf` is full; the bytes read.
fn read_all(f: &mut File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..])? {
            0 => break,
            got => n += got,
        }
    }
    Ok(n)
}

/// Closes `file` and says what close(2) says: network and FUSE file systems report
/// write-back errors there, which dropping a File would ignore.
fn close(file: File) -> std::io::Result<()> {
    let fd = file.into_raw_fd();
    // SAFETY: fd came from into_raw_fd, so it is open and owned here, and is not used after.
    if unsafe { libc::close(fd) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn files_spread_evenly_over_jobs_and_tree_dirs() {
        let root = Path::new("/t");
        let jobs = job_files(root, Layout::Tree, 4, 2002);
        let counts: Vec<usize> = jobs.iter().map(Vec::len).collect();
        assert_eq!(counts, [501, 501, 500, 500]);
        let all: HashSet<&PathBuf> = jobs.iter().flatten().collect();
        assert_eq!(all.len(), 2002);
        // Each job stays in its own subtree of TREE_DIRS directories, all made beforehand.
        let made: HashSet<PathBuf> = dirs(root, Layout::Tree, 4).into_iter().collect();
        assert_eq!(made.len(), 4 * (TREE_DIRS + 1));
        for (j, files) in jobs.iter().enumerate() {
            let parents: HashSet<&Path> = files.iter().filter_map(|f| f.parent()).collect();
            assert_eq!(parents.len(), TREE_DIRS);
            assert!(parents.iter().all(|p| made.contains(*p)));
            assert!(
                files
                    .iter()
                    .all(|f| f.starts_with(root.join(format!("j{j}"))))
            );
        }
    }

    #[test]
    fn the_shared_layout_puts_every_file_in_the_root() {
        let root = Path::new("/t");
        let jobs = job_files(root, Layout::SharedDir, 3, 10);
        assert_eq!(jobs.iter().map(Vec::len).sum::<usize>(), 10);
        assert!(jobs.iter().flatten().all(|f| f.parent() == Some(root)));
        assert!(dirs(root, Layout::SharedDir, 3).is_empty());
    }

    #[test]
    fn every_operation_runs_on_every_file_and_reads_check_the_size() {
        let dir = tempfile::tempdir().unwrap();
        let jobs = job_files(dir.path(), Layout::SharedDir, 2, 7);
        let data = vec![7u8; 100];
        run(MdOp::Create, &jobs, &data).unwrap();
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 7);
        run(MdOp::Stat, &jobs, &data).unwrap();
        run(MdOp::Read, &jobs, &data).unwrap();
        let e = run(MdOp::Read, &jobs, &data[..50]).unwrap_err();
        assert!(
            format!("{e:#}").contains("longer than the 50 bytes"),
            "{e:#}"
        );
        let e = run(MdOp::Read, &jobs, &[7u8; 150]).unwrap_err();
        assert!(
            format!("{e:#}").contains("read 100 of the 150 bytes"),
            "{e:#}"
        );
        run(MdOp::Unlink, &jobs, &data).unwrap();
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
        // Creating is exclusive: a file left behind is an error, not a silent overwrite.
        run(MdOp::Create, &jobs, &data).unwrap();
        assert!(run(MdOp::Create, &jobs, &data).is_err());
    }
}
