//! The small-file tree: a deterministic synthetic tree shaped like a source tree, written once
//! to local disk (with a tar of it) and copied to every target.

use anyhow::Context;
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The seed every tree grows from: the same tree in every run, on every machine.
const SEED: u64 = 0x5eed_d9f5_2024_0024;
/// Files per directory on average (a few hundred directories for a few thousand files).
const FILES_PER_DIR: usize = 10;
/// Files per symlink.
const FILES_PER_LINK: usize = 300;
/// Of every 1000 files, this many are large (64 KiB to 1 MiB); the rest 1 to 32 KiB.
const LARGE_PER_MILLE: u64 = 12;
const EXTENSIONS: [&str; 6] = ["rs", "c", "h", "md", "txt", "json"];

/// xorshift64*: small, fast and fixed, so the tree never changes with a dependency.
#[derive(Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        // xorshift never leaves zero.
        Rng(seed.max(1))
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform below `n` (n > 0); the bias of the modulo is irrelevant at these sizes.
    fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    pub fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            let bytes = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&bytes[..chunk.len()]);
        }
    }
}

/// A tree as paths relative to its root.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Tree {
    /// Directories below the root, parents first.
    pub dirs: Vec<PathBuf>,
    /// Regular files and their sizes.
    pub files: Vec<(PathBuf, u64)>,
    /// Symlinks and their (relative) targets: files in the same directory.
    pub links: Vec<(PathBuf, PathBuf)>,
}

impl Tree {
    /// A source-like tree of `files` files: sizes log-uniform over 1–32 KiB with 1.2 % large
    /// files of 64 KiB–1 MiB (≈47 MB for 3,300 files), one directory per ten files at random
    /// depths, one symlink per 300 files.
    pub fn source_like(files: usize) -> Tree {
        let mut rng = Rng::new(SEED);
        let dirs = random_dirs(&mut rng, (files / FILES_PER_DIR).max(1));
        let files: Vec<(PathBuf, u64)> = (0..files)
            .map(|i| {
                let dir = &dirs[rng.below(dirs.len() as u64) as usize];
                let ext = EXTENSIONS[rng.below(EXTENSIONS.len() as u64) as usize];
                (dir.join(format!("file{i:04}.{ext}")), file_size(&mut rng))
            })
            .collect();
        let links = (0..(files.len() / FILES_PER_LINK).max(1).min(files.len()))
            .map(|k| {
                let (file, _) = &files[rng.below(files.len() as u64) as usize];
                let name = file.file_name().map(PathBuf::from).unwrap_or_default();
                (file.with_file_name(format!("link{k}")), name)
            })
            .collect();
        Tree {
            // The root is the empty path; it is made with the tree, not listed.
            dirs: dirs.into_iter().skip(1).collect(),
            files,
            links,
        }
    }

    pub fn bytes(&self) -> u64 {
        self.files.iter().map(|(_, size)| size).sum()
    }

    /// Writes the tree at `root`, which must not exist yet.
    pub fn write(&self, root: &Path) -> anyhow::Result<()> {
        std::fs::create_dir(root).with_context(|| format!("create {}", root.display()))?;
        for d in &self.dirs {
            let path = root.join(d);
            std::fs::create_dir(&path).with_context(|| format!("create {}", path.display()))?;
        }
        let mut rng = Rng::new(SEED);
        let mut buf = Vec::new();
        for (f, size) in &self.files {
            // Incompressible contents: a target that compresses gains nothing here.
            buf.resize(*size as usize, 0);
            rng.fill(&mut buf);
            let path = root.join(f);
            std::fs::write(&path, &buf).with_context(|| format!("write {}", path.display()))?;
        }
        for (link, to) in &self.links {
            let path = root.join(link);
            std::os::unix::fs::symlink(to, &path)
                .with_context(|| format!("symlink {}", path.display()))?;
        }
        Ok(())
    }
}

/// `count` directories including the root (the empty path, first): each below a random
/// earlier one, which gives the uneven depths of a real tree.
fn random_dirs(rng: &mut Rng, count: usize) -> Vec<PathBuf> {
    let mut dirs = vec![PathBuf::new()];
    for i in 1..count {
        let parent = dirs[rng.below(i as u64) as usize].join(format!("dir{i:03}"));
        dirs.push(parent);
    }
    dirs
}

/// 1–32 KiB, or 64 KiB–1 MiB for the large few: a power of two picked evenly, then a
/// uniform size up to twice that (log-uniform, in integers so every platform agrees).
fn file_size(rng: &mut Rng) -> u64 {
    let (first, last) = if rng.below(1000) < LARGE_PER_MILLE {
        (16, 19) // 64 KiB ..< 1 MiB
    } else {
        (10, 14) // 1 KiB ..< 32 KiB
    };
    let base = 1u64 << (first + rng.below(last - first + 1));
    base + rng.below(base)
}

/// The tree written once on local disk, and a tar of it, as the sources every target copies.
#[derive(Debug)]
pub struct Source {
    /// The tree's root; its last component is what `cp -a` and `tar x` create on a target.
    pub tree: PathBuf,
    pub tar: PathBuf,
}

impl Source {
    /// Writes `tree` and its tar into the directory `scratch`.
    pub fn write(tree: &Tree, scratch: &Path) -> anyhow::Result<Source> {
        let source = Source {
            tree: scratch.join(TREE_NAME),
            tar: scratch.join("tree.tar"),
        };
        tree.write(&source.tree)?;
        let mut tar = Command::new("tar");
        tar.arg("-c")
            .arg("-f")
            .arg(&source.tar)
            .arg("-C")
            .arg(scratch)
            .arg(TREE_NAME);
        super::tools::checked(tar)?;
        Ok(source)
    }

    /// Reads the tree and the tar, untimed, so a copy from them reads the page cache rather
    /// than the local disk (which an earlier cold phase emptied).
    pub fn warm(&self) -> anyhow::Result<()> {
        read_tree(&self.tree).with_context(|| format!("read {}", self.tree.display()))?;
        read_file(&self.tar).with_context(|| format!("read {}", self.tar.display()))
    }
}

fn read_tree(dir: &Path) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let kind = entry.file_type()?;
        if kind.is_dir() {
            read_tree(&entry.path())?;
        } else if kind.is_file() {
            read_file(&entry.path())?;
        }
    }
    Ok(())
}

fn read_file(path: &Path) -> std::io::Result<()> {
    std::io::copy(&mut std::fs::File::open(path)?, &mut std::io::sink()).map(drop)
}

/// The name of the tree's root, on the local disk and on the targets.
pub const TREE_NAME: &str = "tree";

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn the_tree_is_the_same_every_time() {
        assert_eq!(Tree::source_like(500), Tree::source_like(500));
        let (mut a, mut b) = (Rng::new(1), Rng::new(1));
        let (mut x, mut y) = ([0u8; 13], [0u8; 13]);
        a.fill(&mut x);
        b.fill(&mut y);
        assert_eq!(x, y);
        assert_ne!(x, [0u8; 13]);
    }

    #[test]
    fn the_default_tree_looks_like_a_source_tree() {
        let t = Tree::source_like(3300);
        assert_eq!(t.files.len(), 3300);
        assert_eq!(t.dirs.len(), 329);
        assert_eq!(t.links.len(), 11);
        let mb = t.bytes() as f64 / 1e6;
        assert!((45.0..=50.0).contains(&mb), "{mb} MB");
        let small = t.files.iter().filter(|(_, s)| *s < 32 << 10).count();
        assert!(small > 3200, "{small} of 3300 under 32 KiB");
        assert!(t.files.iter().all(|(_, s)| (1 << 10..1 << 20).contains(s)));
        assert!(t.files.iter().any(|(_, s)| *s > 512 << 10));
        let depth = t.dirs.iter().map(|d| d.components().count()).max();
        assert!(depth >= Some(4), "{depth:?}");
    }

    #[test]
    fn every_entry_has_its_parent_and_links_point_at_files() {
        let t = Tree::source_like(1000);
        let dirs: HashSet<&Path> = t.dirs.iter().map(PathBuf::as_path).collect();
        let is_dir = |p: &Path| p.as_os_str().is_empty() || dirs.contains(p);
        for (i, d) in t.dirs.iter().enumerate() {
            let parent = d.parent().unwrap();
            assert!(is_dir(parent) && !t.dirs[i..].iter().any(|x| x == parent));
        }
        let files: HashSet<&Path> = t.files.iter().map(|(f, _)| f.as_path()).collect();
        assert!(t.files.iter().all(|(f, _)| is_dir(f.parent().unwrap())));
        for (link, to) in &t.links {
            assert!(
                files.contains(link.with_file_name(to).as_path()),
                "{link:?}"
            );
        }
    }

    #[test]
    fn the_source_holds_the_tree_and_its_tar() {
        let scratch = tempfile::tempdir().unwrap();
        let tree = Tree::source_like(40);
        let source = Source::write(&tree, scratch.path()).unwrap();
        for (f, size) in &tree.files {
            assert_eq!(std::fs::metadata(source.tree.join(f)).unwrap().len(), *size);
        }
        for (link, to) in &tree.links {
            assert_eq!(&std::fs::read_link(source.tree.join(link)).unwrap(), to);
        }
        assert!(std::fs::metadata(&source.tar).unwrap().len() > tree.bytes());
        source.warm().unwrap();
    }
}
