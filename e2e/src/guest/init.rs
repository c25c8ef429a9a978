//! The guest's `/init` (busybox sh, PID 1): file systems, kernel modules, network cards and
//! virtio-fs mounts, then the test's script with its stdout on the second serial port, then
//! power-off.
//!
//! What the host reads back (docs/testing.md, "Guest tests"): the script's stdout on `ttyS1`
//! then `GUEST-DONE rc=N`; or `GUEST-SETUP-FAILED: what` when the guest could not get ready
//! for the script. The kernel's messages, /init's own and the script's stderr go to `ttyS0`,
//! the console log.

use super::net::Nic;
use std::fmt::Write;

/// Where the test's script is in the guest.
pub const SCRIPT: &str = "/guest/script.sh";
/// The serial port of the script's output (the first one is the console).
pub const OUTPUT_TTY: &str = "/dev/ttyS1";
/// The last line of a guest that ran its script.
pub const DONE: &str = "GUEST-DONE rc=";
/// The line of a guest that could not get ready for its script.
pub const SETUP_FAILED: &str = "GUEST-SETUP-FAILED: ";

/// What `/init` sets up before the script.
#[derive(Debug)]
pub struct InitPlan<'a> {
    /// Guest paths of the kernel modules, in load order.
    pub modules: &'a [String],
    pub nics: &'a [Nic],
    /// virtio-fs tags to mount at `/mnt/<tag>`.
    pub virtiofs_tags: &'a [String],
}

impl InitPlan<'_> {
    /// The `/init` script.
    pub fn render(&self) -> String {
        let mut s = String::from(
            r#"#!/bin/sh
# Written by dpufs_e2e::guest (e2e/src/guest/init.rs).
export PATH=/bin:/sbin:/usr/bin:/usr/sbin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t tmpfs tmpfs /tmp
exec </dev/null
setup_failed() {
    echo "GUEST-SETUP-FAILED: $*"
    echo "GUEST-SETUP-FAILED: $*" >/dev/ttyS1
    poweroff -f
}
# The interface whose MAC address is $1.
iface_of() {
    for d in /sys/class/net/*; do
        [ "$(cat "$d/address")" = "$1" ] && { echo "${d##*/}"; return; }
    done
}
"#,
        );
        for module in self.modules {
            let _ = writeln!(s, "insmod {module} || setup_failed 'insmod {module}'");
        }
        s.push_str("ip link set lo up\n");
        for (index, nic) in self.nics.iter().enumerate() {
            let mac = Nic::mac(index);
            let cidr = nic.guest_cidr();
            let _ = writeln!(
                s,
                "i=$(iface_of {mac}); [ -n \"$i\" ] || setup_failed 'no interface with MAC {mac}'\n\
                 ip link set \"$i\" up && ip addr add {cidr} dev \"$i\" || setup_failed \"$i: {cidr}\""
            );
            if let Some(gateway) = nic.gateway() {
                let _ = writeln!(
                    s,
                    "ip route add default via {gateway} || setup_failed 'default route via {gateway}'"
                );
            }
        }
        for tag in self.virtiofs_tags {
            let _ = writeln!(
                s,
                "mkdir -p /mnt/{tag} && mount -t virtiofs {tag} /mnt/{tag} || setup_failed 'mount -t virtiofs {tag}'"
            );
        }
        let _ = write!(
            s,
            r#"echo "dpufs guest: running {SCRIPT} at $(cut -d' ' -f1 /proc/uptime) s"
sh {SCRIPT} >{OUTPUT_TTY} 2>/dev/console
echo "{DONE}$?" >{OUTPUT_TTY}
sync
"#
        );
        // Unmounting sends the servers FUSE_DESTROY, as a clean shutdown of a host would.
        for tag in self.virtiofs_tags {
            let _ = writeln!(s, "umount /mnt/{tag}");
        }
        s.push_str("poweroff -f\n");
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The host's /bin/sh parses the script (`sh -n`), and the set-up comes in order.
    #[test]
    fn the_init_script_parses_and_sets_up_in_order() {
        let modules = ["/lib/modules/virtio.ko".to_string()];
        let nics = [Nic::user(), Nic::tap("tap0", "10.9.0.2/24")];
        let tags = ["vol".to_string()];
        let init = InitPlan {
            modules: &modules,
            nics: &nics,
            virtiofs_tags: &tags,
        }
        .render();
        let out = std::process::Command::new("sh")
            .args(["-n", "-c", &init])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let at = |needle: &str| {
            init.find(needle)
                .unwrap_or_else(|| panic!("{needle}\n{init}"))
        };
        assert!(at("insmod /lib/modules/virtio.ko") < at("iface_of 52:54:00:d9:f5:10"));
        assert!(at("ip addr add 10.0.2.15/24") < at("ip addr add 10.9.0.2/24"));
        assert_eq!(init.matches("ip route add default").count(), 1);
        assert!(at("mount -t virtiofs vol /mnt/vol") < at(&format!("sh {SCRIPT}")));
        assert!(at(DONE) < at("umount /mnt/vol"));
        assert!(init.trim_end().ends_with("poweroff -f"));
    }
}
