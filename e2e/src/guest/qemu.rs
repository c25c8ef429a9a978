//! QEMU's command line for a guest (facts of docs/testing.md, "Guest tests"): TCG, a q35
//! machine whose RAM is a shared memfd (vhost-user backends map guest memory), the kernel and
//! initramfs given directly, two serial ports to files, no monitor, QMP on a unix socket.

use super::assets::Kernel;
use super::net::Nic;
use std::path::{Path, PathBuf};

/// The files of one guest's run, in its temporary directory.
#[derive(Debug)]
pub struct RunFiles {
    pub initramfs: PathBuf,
    /// ttyS0: the kernel's console.
    pub console_log: PathBuf,
    /// ttyS1: the script's stdout.
    pub output_log: PathBuf,
    /// QEMU's own stdout and stderr.
    pub qemu_log: PathBuf,
    pub qmp_socket: PathBuf,
}

impl RunFiles {
    pub fn in_dir(dir: &Path) -> RunFiles {
        RunFiles {
            initramfs: dir.join("initramfs.cpio"),
            console_log: dir.join("console.log"),
            output_log: dir.join("output.log"),
            qemu_log: dir.join("qemu.log"),
            qmp_socket: dir.join("qmp.sock"),
        }
    }
}

/// The id of the free root port `i`: the name the DPU agent's QMP attachment looks for
/// (`driver/src/dpu/attach/qmp_attach.rs`).
pub fn hotplug_port(i: usize) -> String {
    format!("dpufs-port-{i}")
}

/// Everything QEMU's arguments depend on.
#[derive(Debug)]
pub struct QemuArgs<'a> {
    pub kernel: &'a Kernel,
    pub files: &'a RunFiles,
    pub memory_mib: u32,
    pub virtiofs: &'a [(String, PathBuf)],
    pub hotplug_slots: usize,
    pub nics: &'a [Nic],
}

impl QemuArgs<'_> {
    pub fn to_args(&self) -> Vec<String> {
        let f = self.files;
        let mem = self.memory_mib;
        let mut args: Vec<String> = [
            // KVM is there but does not work on these machines: `-cpu host` aborts, the other
            // models hang early in boot.
            "-accel",
            "tcg",
            "-cpu",
            "max",
            "-machine",
            "q35",
            "-smp",
            "1",
            // No default devices (a NIC, a VGA card, a monitor): only what is asked for.
            "-nodefaults",
            "-display",
            "none",
            "-monitor",
            "none",
            "-no-reboot",
            "-append",
            // panic=-1: a kernel panic reboots at once, and -no-reboot makes that QEMU's exit.
            "console=ttyS0 panic=-1",
        ]
        .map(String::from)
        .into();
        let kernel = self.kernel.vmlinuz.display().to_string();
        for (flag, value) in [
            ("-m", format!("{mem}M")),
            (
                "-object",
                format!("memory-backend-memfd,id=mem,size={mem}M,share=on"),
            ),
            ("-numa", "node,memdev=mem".to_string()),
            ("-kernel", kernel),
            ("-initrd", opt_path(&f.initramfs)),
            ("-serial", format!("file:{}", opt_path(&f.console_log))),
            ("-serial", format!("file:{}", opt_path(&f.output_log))),
            (
                "-qmp",
                format!("unix:{},server=on,wait=off", opt_path(&f.qmp_socket)),
            ),
        ] {
            args.extend([flag.to_string(), value]);
        }
        for (i, (tag, socket)) in self.virtiofs.iter().enumerate() {
            args.extend([
                "-chardev".to_string(),
                format!("socket,id=vfs{i},path={}", opt_path(socket)),
                "-device".to_string(),
                format!("vhost-user-fs-pci,id=vfsdev{i},queue-size=1024,chardev=vfs{i},tag={tag}"),
            ]);
        }
        for i in 0..self.hotplug_slots {
            args.extend([
                "-device".to_string(),
                format!(
                    "pcie-root-port,id={},bus=pcie.0,chassis={}",
                    hotplug_port(i),
                    i + 1
                ),
            ]);
        }
        for (i, nic) in self.nics.iter().enumerate() {
            args.extend([
                "-netdev".to_string(),
                nic.netdev_arg(i),
                "-device".to_string(),
                format!("virtio-net-pci,netdev=net{i},mac={}", Nic::mac(i)),
            ]);
        }
        args
    }
}

/// A path inside a QEMU option value, where a comma is written twice.
fn opt_path(path: &Path) -> String {
    path.display().to_string().replace(',', ",,")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_sockets_and_ports_are_on_the_command_line() {
        let kernel = Kernel {
            release: "6.1.0-56-amd64".into(),
            vmlinuz: "/k/vmlinuz".into(),
            modules: "/k/lib/modules/6.1.0-56-amd64".into(),
        };
        let files = RunFiles::in_dir(Path::new("/run/g,1"));
        let virtiofs = [("vol".to_string(), PathBuf::from("/s/vol.sock"))];
        let nics = [Nic::user().hostfwd(2222, 22)];
        let args = QemuArgs {
            kernel: &kernel,
            files: &files,
            memory_mib: 256,
            virtiofs: &virtiofs,
            hotplug_slots: 2,
            nics: &nics,
        }
        .to_args()
        .join(" ");
        for part in [
            "-accel tcg -cpu max -machine q35",
            "-m 256M -object memory-backend-memfd,id=mem,size=256M,share=on -numa node,memdev=mem",
            "-serial file:/run/g,,1/console.log -serial file:/run/g,,1/output.log",
            "-qmp unix:/run/g,,1/qmp.sock,server=on,wait=off",
            "-chardev socket,id=vfs0,path=/s/vol.sock -device vhost-user-fs-pci,id=vfsdev0,queue-size=1024,chardev=vfs0,tag=vol",
            "-device pcie-root-port,id=dpufs-port-0,bus=pcie.0,chassis=1 -device pcie-root-port,id=dpufs-port-1,bus=pcie.0,chassis=2",
            "-netdev user,id=net0,hostfwd=tcp:127.0.0.1:2222-:22 -device virtio-net-pci,netdev=net0,mac=52:54:00:d9:f5:10",
        ] {
            assert!(args.contains(part), "{part}\nnot in\n{args}");
        }
    }
}
