//! A guest's network cards: QEMU's user-mode network (slirp: the guest reaches every TCP address
//! the QEMU process can, the host side is 10.0.2.2) and tap devices on the machine.

use crate::netns::ip;
use std::net::Ipv4Addr;

/// The guest's address on QEMU's user-mode network (QEMU's default).
pub const USER_NET_GUEST: &str = "10.0.2.15/24";
/// Where the guest reaches the machine on the user-mode network: QEMU's own connections then
/// come from the QEMU process, so `10.0.2.2:P` is `127.0.0.1:P` in the QEMU's network namespace.
pub const USER_NET_HOST: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 2);

/// One virtio-net card of a guest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Nic {
    /// QEMU's user-mode network, with TCP ports of the machine forwarded into the guest
    /// (`(host port on 127.0.0.1, guest port)`). The guest gets 10.0.2.15/24 and a default
    /// route through 10.0.2.2.
    User { hostfwd: Vec<(u16, u16)> },
    /// An existing tap device of the machine ([`TapDevice`]); the guest gets `guest_cidr` and,
    /// when given, a default route through `gateway`.
    Tap {
        ifname: String,
        guest_cidr: String,
        gateway: Option<Ipv4Addr>,
    },
}

impl Nic {
    /// The user-mode network without forwarded ports.
    pub fn user() -> Nic {
        Nic::User {
            hostfwd: Vec::new(),
        }
    }

    /// Forwards `127.0.0.1:host_port` of the machine to `guest_port` in the guest (user-mode
    /// network only).
    pub fn hostfwd(mut self, host_port: u16, guest_port: u16) -> Nic {
        match &mut self {
            Nic::User { hostfwd } => hostfwd.push((host_port, guest_port)),
            Nic::Tap { .. } => panic!("hostfwd is for the user-mode network"),
        }
        self
    }

    /// A card on tap device `ifname` with the guest address `guest_cidr` (`10.0.3.2/24`).
    pub fn tap(ifname: &str, guest_cidr: &str) -> Nic {
        Nic::Tap {
            ifname: ifname.to_string(),
            guest_cidr: guest_cidr.to_string(),
            gateway: None,
        }
    }

    /// The guest's address, as `ip addr add` takes it.
    pub(crate) fn guest_cidr(&self) -> &str {
        match self {
            Nic::User { .. } => USER_NET_GUEST,
            Nic::Tap { guest_cidr, .. } => guest_cidr,
        }
    }

    /// The guest's default route, if this card gives one.
    pub(crate) fn gateway(&self) -> Option<Ipv4Addr> {
        match self {
            Nic::User { .. } => Some(USER_NET_HOST),
            Nic::Tap { gateway, .. } => *gateway,
        }
    }

    /// The card's MAC address; the guest's /init finds its interface by it (interface names
    /// follow probe order, which nothing promises).
    pub(crate) fn mac(index: usize) -> String {
        format!("52:54:00:d9:f5:{:02x}", 0x10 + index)
    }

    /// QEMU's `-netdev` value for card `index`.
    pub(crate) fn netdev_arg(&self, index: usize) -> String {
        match self {
            Nic::User { hostfwd } => {
                let mut arg = format!("user,id=net{index}");
                for (host, guest) in hostfwd {
                    arg.push_str(&format!(",hostfwd=tcp:127.0.0.1:{host}-:{guest}"));
                }
                arg
            }
            Nic::Tap { ifname, .. } => {
                format!("tap,id=net{index},ifname={ifname},script=no,downscript=no")
            }
        }
    }
}

/// A tap device on the machine with an address of its own, deleted on drop. QEMU opens it by
/// name ([`Nic::Tap`]); the machine reaches the guest through it. Needs CAP_NET_ADMIN.
#[derive(Debug)]
pub struct TapDevice {
    pub name: String,
}

impl TapDevice {
    /// Creates tap device `name` (at most 15 bytes), gives it `host_cidr` and brings it up.
    pub fn create(name: &str, host_cidr: &str) -> anyhow::Result<TapDevice> {
        ip(&["tuntap", "add", "dev", name, "mode", "tap"])?;
        let tap = TapDevice {
            name: name.to_string(),
        };
        ip(&["addr", "add", host_cidr, "dev", name])?;
        ip(&["link", "set", name, "up"])?;
        Ok(tap)
    }
}

impl Drop for TapDevice {
    fn drop(&mut self) {
        if let Err(e) = ip(&["tuntap", "del", "dev", &self.name, "mode", "tap"]) {
            eprintln!("removing tap device {}: {e:#}", self.name);
        }
    }
}
