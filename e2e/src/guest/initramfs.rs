//! The guest's root file system, built per guest as an uncompressed newc archive: busybox and
//! its applet links, the kernel modules, `/init`, the test's script and files, and host
//! binaries with the shared libraries they load (`ldd`), at the paths the host has them.

use super::assets::GuestAssets;
use super::cpio::CpioWriter;
use anyhow::{Context, bail};
use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A file to put into the guest.
#[derive(Debug, Clone)]
pub enum GuestFile {
    /// These bytes, mode 0644.
    Bytes { path: String, data: Vec<u8> },
    /// A host executable, with every shared library and the loader it needs.
    Binary { path: String, host: PathBuf },
}

/// Writes the archive to `out`: `/init`, the modules at [`module_paths`], `files`, busybox.
pub fn build(
    out: &Path,
    assets: &GuestAssets,
    modules: &[PathBuf],
    init: &str,
    files: &[GuestFile],
) -> anyhow::Result<()> {
    let file = File::create(out).with_context(|| format!("creating {}", out.display()))?;
    let mut cpio = CpioWriter::new(BufWriter::with_capacity(1 << 20, file));
    for dir in ["/proc", "/sys", "/dev", "/tmp", "/mnt", "/root"] {
        cpio.dir(dir)?;
    }
    cpio.file("/init", 0o755, init.len() as u64, init.as_bytes())?;
    for (module, guest_path) in modules.iter().zip(module_paths(modules)) {
        copy_host_file(&mut cpio, &guest_path, module)?;
    }
    for file in files {
        match file {
            GuestFile::Bytes { path, data } => {
                cpio.file(path, 0o644, data.len() as u64, data.as_slice())?
            }
            GuestFile::Binary { path, host } => copy_binary(&mut cpio, path, host)?,
        }
    }
    copy_binary(&mut cpio, "/bin/busybox", &assets.busybox)?;
    for applet in busybox_applets(&assets.busybox)? {
        // A file of the test's at an applet's path wins.
        if !cpio.contains(&applet) {
            cpio.symlink(&applet, "/bin/busybox")?;
        }
    }
    cpio.finish()?.into_inner().map_err(|e| e.into_error())?;
    Ok(())
}

/// Where the modules go in the guest: `/lib/modules/<file name>`, as `/init` loads them.
pub fn module_paths(modules: &[PathBuf]) -> Vec<String> {
    modules
        .iter()
        .map(|m| {
            let name = m.file_name().expect("module file name").to_string_lossy();
            format!("/lib/modules/{name}")
        })
        .collect()
}

fn copy_host_file<W: std::io::Write>(
    cpio: &mut CpioWriter<W>,
    guest_path: &str,
    host: &Path,
) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    // Opened and measured through the same descriptor: symbolic links are followed.
    let file = File::open(host).with_context(|| format!("opening {}", host.display()))?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        bail!("{} is not a regular file", host.display());
    }
    cpio.file(guest_path, meta.permissions().mode(), meta.len(), file)
        .with_context(|| format!("adding {} as {guest_path}", host.display()))
}

/// `host` at `guest_path`, and each library `ldd` names at its host path (once per archive).
fn copy_binary<W: std::io::Write>(
    cpio: &mut CpioWriter<W>,
    guest_path: &str,
    host: &Path,
) -> anyhow::Result<()> {
    copy_host_file(cpio, guest_path, host)?;
    for lib in shared_libraries(host)? {
        let path = lib.to_string_lossy();
        if !cpio.contains(&path) {
            copy_host_file(cpio, &path, &lib)?;
        }
    }
    Ok(())
}

/// The shared libraries and the loader `binary` needs, as `ldd` resolves them; none for a
/// static binary.
pub fn shared_libraries(binary: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let out = Command::new("ldd")
        .arg(binary)
        .output()
        .context("running ldd")?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    // glibc's ldd: "not a dynamic executable" (exit 1) or "statically linked" (static-pie).
    if stdout.contains("statically linked") || stderr.contains("not a dynamic executable") {
        return Ok(Vec::new());
    }
    if !out.status.success() {
        bail!("ldd {}: {}", binary.display(), stderr.trim());
    }
    parse_ldd(&stdout).with_context(|| format!("ldd {}", binary.display()))
}

/// `libssl.so.3 => /lib/x86_64-linux-gnu/libssl.so.3 (0x…)` and `/lib64/ld-linux-x86-64.so.2
/// (0x…)` give a path each; the vDSO (`linux-vdso.so.1 (0x…)`) has no file.
fn parse_ldd(out: &str) -> anyhow::Result<Vec<PathBuf>> {
    let mut libs = Vec::new();
    for line in out.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let (name, target) = match line.split_once(" => ") {
            Some((name, target)) => (name, target),
            None => (line, line),
        };
        if target.starts_with("not found") {
            bail!("{name} not found");
        }
        let path = target.split(" (").next().unwrap_or(target).trim();
        if path.starts_with('/') {
            libs.push(PathBuf::from(path));
        }
    }
    Ok(libs)
}

/// `busybox --list-full`: the applets' paths (`usr/bin/awk`, `sbin/ip`, ...).
fn busybox_applets(busybox: &Path) -> anyhow::Result<Vec<String>> {
    let out = Command::new(busybox)
        .arg("--list-full")
        .output()
        .context("running busybox --list-full")?;
    if !out.status.success() {
        bail!("busybox --list-full failed");
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.is_empty())
        .map(|l| format!("/{l}"))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ldd_output_gives_libraries_and_the_loader_but_not_the_vdso() {
        let out = "\tlinux-vdso.so.1 (0x00007ffd)\n\
                   \tlibssl.so.3 => /lib/x86_64-linux-gnu/libssl.so.3 (0x00007f1)\n\
                   \tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f2)\n\
                   \t/lib64/ld-linux-x86-64.so.2 (0x00007f3)\n";
        assert_eq!(
            parse_ldd(out).unwrap(),
            [
                "/lib/x86_64-linux-gnu/libssl.so.3",
                "/lib/x86_64-linux-gnu/libc.so.6",
                "/lib64/ld-linux-x86-64.so.2"
            ]
            .map(PathBuf::from)
        );
        let err = parse_ldd("\tlibfoo.so.1 => not found\n").unwrap_err();
        assert!(err.to_string().contains("libfoo.so.1 not found"));
    }

    #[test]
    fn a_dynamic_host_binary_needs_libc_and_the_loader() {
        let libs = shared_libraries(Path::new("/bin/sh")).unwrap();
        assert!(
            libs.iter().any(|l| l.to_string_lossy().contains("libc.so")),
            "{libs:?}"
        );
        assert!(
            libs.iter()
                .any(|l| l.to_string_lossy().contains("ld-linux")),
            "{libs:?}"
        );
    }
}
