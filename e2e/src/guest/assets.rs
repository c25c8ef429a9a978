//! What a guest boots from: QEMU, busybox, and Debian's kernel with its modules, fetched once
//! into a cache outside the repository (`$DPUFS_GUEST_DIR`, else `~/.cache/dpufs-guest`).
//!
//! The kernel is the package Debian's `linux-image-amd64` depends on in the machine's apt
//! sources (`linux-image-6.1.0-56-amd64` on bookworm when this was written), fetched with
//! `apt-get download`, unpacked with `dpkg-deb -x` and indexed with `depmod`: nothing is
//! installed on the machine. `.ci/run` fetches the package ahead of the tests; without it the
//! first test fetches it (70 MB) and unpacks it (400 MB, a few seconds).

use anyhow::{Context, bail};
use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// Set to `1` where the guest tests must run (CI installs QEMU and the kernel): a missing piece
/// then fails the test instead of skipping it.
pub const REQUIRE_ENV: &str = "DPUFS_REQUIRE_GUEST";

/// The package whose dependency names the kernel to boot.
const KERNEL_METAPACKAGE: &str = "linux-image-amd64";

/// Everything a guest boots from, found on this machine.
#[derive(Debug, Clone)]
pub struct GuestAssets {
    pub qemu: PathBuf,
    pub busybox: PathBuf,
    pub kernel: Kernel,
    /// The cache directory; also holds the lock that runs one guest at a time.
    pub dir: PathBuf,
}

/// An unpacked kernel package.
#[derive(Debug, Clone)]
pub struct Kernel {
    /// `uname -r` of the kernel, e.g. `6.1.0-56-amd64`.
    pub release: String,
    pub vmlinuz: PathBuf,
    /// `lib/modules/<release>`, with the `modules.dep` that `depmod` wrote.
    pub modules: PathBuf,
}

impl GuestAssets {
    /// The assets, fetched and unpacked on first use (once per test process); `None` after a
    /// loud SKIPPED line when QEMU, busybox or the kernel cannot be had, or a panic instead
    /// when `DPUFS_REQUIRE_GUEST=1`.
    pub fn get(test: &str) -> Option<GuestAssets> {
        static ASSETS: OnceLock<Result<GuestAssets, String>> = OnceLock::new();
        match ASSETS.get_or_init(|| find().map_err(|e| format!("{e:#}"))) {
            Ok(assets) => Some(assets.clone()),
            Err(why) => {
                skip(test, why);
                None
            }
        }
    }
}

/// Says loudly that `test` did not run and why, or fails it when `DPUFS_REQUIRE_GUEST=1`.
pub fn skip(test: &str, why: &str) {
    let why = format!("no QEMU guest can boot here: {why} (docs/testing.md, \"Guest tests\")");
    crate::skip::skip(REQUIRE_ENV, test, &why);
}

/// The cache directory of the guest assets.
fn cache_dir() -> PathBuf {
    std::env::var_os("DPUFS_GUEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let home = std::env::var_os("HOME").unwrap_or_else(|| "/root".into());
            PathBuf::from(home).join(".cache/dpufs-guest")
        })
}

fn find() -> anyhow::Result<GuestAssets> {
    let qemu = in_path("qemu-system-x86_64")
        .context("no qemu-system-x86_64 (Debian package qemu-system-x86)")?;
    let busybox = in_path("busybox").context("no busybox (Debian package busybox-static)")?;
    in_path("depmod").context("no depmod (Debian package kmod)")?;
    let dir = cache_dir();
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    // Test processes of other packages may prepare the same cache at the same time.
    let _lock = FileLock::exclusive(&dir.join("prepare.lock"))?;
    let kernel = unpacked_kernel(&dir)?;
    Ok(GuestAssets {
        qemu,
        busybox,
        kernel,
        dir,
    })
}

/// The newest kernel package in `dir` (fetched when there is none), unpacked and indexed once.
fn unpacked_kernel(dir: &Path) -> anyhow::Result<Kernel> {
    let deb = match newest_kernel_deb(dir)? {
        Some(deb) => deb,
        None => {
            download_kernel(dir)?;
            newest_kernel_deb(dir)?.context("apt-get download left no linux-image .deb")?
        }
    };
    let stem = deb.file_stem().expect(".deb name").to_string_lossy();
    let root = dir.join(&*stem);
    if !root.join(".unpacked").exists() {
        unpack(&deb, &root)?;
    }
    let modules_root = root.join("lib/modules");
    let release = std::fs::read_dir(&modules_root)
        .with_context(|| format!("reading {}", modules_root.display()))?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .next()
        .with_context(|| format!("no kernel release in {}", modules_root.display()))?;
    let vmlinuz = root.join("boot").join(format!("vmlinuz-{release}"));
    anyhow::ensure!(vmlinuz.is_file(), "no {}", vmlinuz.display());
    Ok(Kernel {
        modules: modules_root.join(&release),
        release,
        vmlinuz,
    })
}

fn newest_kernel_deb(dir: &Path) -> anyhow::Result<Option<PathBuf>> {
    let mut debs = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with("linux-image-") && name.ends_with(".deb") {
            debs.push((entry.metadata()?.modified()?, entry.path()));
        }
    }
    Ok(debs.into_iter().max().map(|(_, path)| path))
}

/// `apt-get download` of the kernel package `linux-image-amd64` depends on, into `dir`.
fn download_kernel(dir: &Path) -> anyhow::Result<()> {
    let package = kernel_package()?;
    let out = Command::new("apt-get")
        .args(["download", "-q", &package])
        .current_dir(dir)
        .output()
        .context("running apt-get download")?;
    if !out.status.success() {
        bail!(
            "apt-get download {package} failed (apt-get update first?): {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// The kernel image package `linux-image-amd64` depends on in the configured apt sources.
fn kernel_package() -> anyhow::Result<String> {
    let out = Command::new("apt-cache")
        .args(["depends", KERNEL_METAPACKAGE])
        .output()
        .context("running apt-cache depends")?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.trim().strip_prefix("Depends: "))
        .find(|p| p.starts_with("linux-image-"))
        .map(str::to_string)
        .with_context(|| format!("apt-cache knows no dependency of {KERNEL_METAPACKAGE}"))
}

/// `dpkg-deb -x` into a temporary sibling of `root`, `depmod`, then the rename that makes it
/// visible (an interrupted unpack leaves no half tree behind at `root`).
fn unpack(deb: &Path, root: &Path) -> anyhow::Result<()> {
    let tmp = root.with_extension("partial");
    let _ = std::fs::remove_dir_all(&tmp);
    let _ = std::fs::remove_dir_all(root);
    run(Command::new("dpkg-deb").arg("-x").arg(deb).arg(&tmp))?;
    let release = std::fs::read_dir(tmp.join("lib/modules"))?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .next()
        .context("the package has no lib/modules/<release>")?;
    // The package ships no modules.dep: its postinst runs depmod on installation.
    run(Command::new("depmod").arg("-b").arg(&tmp).arg(&release))?;
    File::create(tmp.join(".unpacked"))?;
    std::fs::rename(&tmp, root)?;
    Ok(())
}

fn run(cmd: &mut Command) -> anyhow::Result<()> {
    let out = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

impl Kernel {
    /// The module files to load, dependencies first, for `wanted` (module names as `modprobe`
    /// takes them) from `modules.dep`; modules built into the kernel are left out.
    pub fn load_order(&self, wanted: &[&str]) -> anyhow::Result<Vec<PathBuf>> {
        let dep_file = self.modules.join("modules.dep");
        let deps = std::fs::read_to_string(&dep_file)
            .with_context(|| format!("reading {}", dep_file.display()))?;
        let builtin =
            std::fs::read_to_string(self.modules.join("modules.builtin")).unwrap_or_default();
        let graph = ModuleGraph::parse(&deps, &builtin);
        let mut order = Vec::new();
        let mut seen = BTreeSet::new();
        for name in wanted {
            graph.visit(&module_name(name), &mut seen, &mut order)?;
        }
        Ok(order
            .into_iter()
            .map(|rel| self.modules.join(rel))
            .collect())
    }
}

/// `modules.dep` as module name → (relative path, names of its dependencies).
#[derive(Debug)]
struct ModuleGraph {
    modules: BTreeMap<String, (String, Vec<String>)>,
    builtin: BTreeSet<String>,
}

impl ModuleGraph {
    fn parse(modules_dep: &str, modules_builtin: &str) -> ModuleGraph {
        let modules = modules_dep
            .lines()
            .filter_map(|line| line.split_once(':'))
            .map(|(path, deps)| {
                let deps = deps.split_whitespace().map(module_name).collect();
                (module_name(path), (path.to_string(), deps))
            })
            .collect();
        let builtin = modules_builtin.lines().map(module_name).collect();
        ModuleGraph { modules, builtin }
    }

    /// Depth first: a module goes into `order` after everything it depends on.
    fn visit(
        &self,
        name: &str,
        seen: &mut BTreeSet<String>,
        order: &mut Vec<String>,
    ) -> anyhow::Result<()> {
        if !seen.insert(name.to_string()) {
            return Ok(());
        }
        let Some((path, deps)) = self.modules.get(name) else {
            if self.builtin.contains(name) {
                return Ok(());
            }
            bail!("kernel module {name} is neither in modules.dep nor built in");
        };
        // busybox insmod reads the file as it is: compressed modules would need unpacking.
        anyhow::ensure!(
            path.ends_with(".ko"),
            "{path}: compressed kernel modules are not supported"
        );
        for dep in deps {
            self.visit(dep, seen, order)?;
        }
        order.push(path.clone());
        Ok(())
    }
}

/// `kernel/fs/fuse/virtio-fs.ko` → `virtio_fs` (the name modprobe and /proc/modules use).
fn module_name(path: &str) -> String {
    let file = path.rsplit('/').next().unwrap_or(path);
    file.split(".ko").next().unwrap_or(file).replace('-', "_")
}

/// An executable of that name in `$PATH`.
fn in_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

/// An exclusive `flock(2)` on a file, released when the descriptor closes (on drop).
#[derive(Debug)]
pub struct FileLock {
    _file: File,
}

impl FileLock {
    /// Waits for the lock on `path` (created when missing).
    pub fn exclusive(path: &Path) -> anyhow::Result<FileLock> {
        use std::os::fd::AsRawFd;
        let file = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
            .with_context(|| format!("opening {}", path.display()))?;
        // SAFETY: flock(2) on a descriptor this function owns.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(std::io::Error::last_os_error())
                .with_context(|| format!("flock {}", path.display()));
        }
        Ok(FileLock { _file: file })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEP: &str = "\
kernel/fs/fuse/fuse.ko:
kernel/fs/fuse/virtiofs.ko: kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko kernel/fs/fuse/fuse.ko
kernel/drivers/virtio/virtio.ko: kernel/drivers/virtio/virtio_ring.ko
kernel/drivers/virtio/virtio_ring.ko:
kernel/drivers/virtio/virtio_pci.ko: kernel/drivers/virtio/virtio_pci_legacy_dev.ko kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko
kernel/drivers/virtio/virtio_pci_legacy_dev.ko:
kernel/drivers/net/net-failover.ko: kernel/net/core/failover.ko.xz
kernel/net/core/failover.ko.xz:
";

    fn order(wanted: &[&str], builtin: &str) -> anyhow::Result<Vec<String>> {
        let graph = ModuleGraph::parse(DEP, builtin);
        let (mut seen, mut order) = (BTreeSet::new(), Vec::new());
        for name in wanted {
            graph.visit(&module_name(name), &mut seen, &mut order)?;
        }
        Ok(order
            .iter()
            .map(|p| module_name(p))
            .collect::<Vec<String>>())
    }

    #[test]
    fn dependencies_load_first_and_once() {
        assert_eq!(
            order(&["virtio_pci", "virtiofs"], "").unwrap(),
            [
                "virtio_pci_legacy_dev",
                "virtio_ring",
                "virtio",
                "virtio_pci",
                "fuse",
                "virtiofs"
            ]
        );
    }

    #[test]
    fn built_in_modules_are_skipped_and_unknown_ones_refused() {
        assert_eq!(
            order(
                &["virtiofs", "virtio_blk"],
                "kernel/drivers/block/virtio_blk.ko\n"
            )
            .unwrap(),
            ["virtio_ring", "virtio", "fuse", "virtiofs"]
        );
        let err = order(&["virtio_blk"], "").unwrap_err().to_string();
        assert!(err.contains("virtio_blk is neither"), "{err}");
    }

    #[test]
    fn dashes_match_underscores_and_compressed_modules_are_refused() {
        let err = order(&["net_failover"], "").unwrap_err().to_string();
        assert!(err.contains("failover.ko.xz: compressed"), "{err}");
    }
}
