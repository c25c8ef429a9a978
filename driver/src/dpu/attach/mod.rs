//! How a staged volume's virtio-fs device reaches the host (`dpufs-csi dpu-agent --attach`):
//!
//! - `none`: something else provides the device (DPF's SNAP node driver, or devices declared
//!   when the host's VM started); the agent only serves the vhost-user socket.
//! - `qmp:/path/to/qmp.sock`: the host is a QEMU guest and the agent hot-plugs a
//!   `vhost-user-fs-pci` device into a free `pcie-root-port` named `dpufs-port-N` through
//!   QEMU's monitor ([`qmp`]), the way DOCA SNAP hot-plugs a PCIe function.
//! - `snap` (cargo feature `snap`): a BlueField's DOCA SNAP virtio-fs function. It needs the
//!   DOCA SDK, which this build has not got; the agent says so at start.
//!
//! Every implementation is idempotent: attaching what is attached, or detaching what is not,
//! succeeds without a change.

mod qmp;
mod qmp_attach;
#[cfg(feature = "snap")]
mod snap;

pub use qmp::{QmpClient, QmpError};
pub use qmp_attach::QmpAttach;

use dpufs_proto::dpu::v1::DeviceTransport;
use std::path::PathBuf;
use std::time::Duration;

/// One volume's device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceSpec {
    /// The virtio-fs tag, also the device's id where the attachment names devices.
    pub tag: String,
    /// The vhost-user socket the volume's worker serves.
    pub socket: PathBuf,
}

/// Why a device could not be attached or detached.
#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    #[error("QEMU's monitor: {0}")]
    Qmp(#[from] QmpError),
    #[error(
        "no free pcie-root-port named dpufs-port-N in the host's VM: start QEMU with more (-device pcie-root-port,id=dpufs-port-N,...)"
    )]
    NoFreePort,
    #[error(
        "the host has not released device {tag} after {waited:?} (device_del sent; the host's kernel must let it go)"
    )]
    NotReleased { tag: String, waited: Duration },
    #[error(
        "QEMU did not connect to the worker's vhost-user socket {} in {waited:?}",
        socket.display()
    )]
    NotConnected { socket: PathBuf, waited: Duration },
    #[error("{0}")]
    Unsupported(String),
}

/// Shows volumes to the host as virtio-fs devices, and takes them away.
pub trait Attach: Send + Sync + std::fmt::Debug {
    /// How the host sees the devices.
    fn transport(&self) -> DeviceTransport;
    /// Shows the device to the host; a device already there is left as it is.
    fn attach(&self, device: &DeviceSpec) -> Result<(), AttachError>;
    /// Takes the device from the host (waits until the host let it go); a device that is
    /// not there is fine.
    fn detach(&self, device: &DeviceSpec) -> Result<(), AttachError>;
}

/// Devices are provided by someone else.
#[derive(Debug, Clone, Copy)]
pub struct NoAttach;

impl Attach for NoAttach {
    fn transport(&self) -> DeviceTransport {
        DeviceTransport::VhostUserFs
    }
    fn attach(&self, _: &DeviceSpec) -> Result<(), AttachError> {
        Ok(())
    }
    fn detach(&self, _: &DeviceSpec) -> Result<(), AttachError> {
        Ok(())
    }
}

/// The `--attach` flag.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttachSpec {
    None,
    Qmp(PathBuf),
    Snap,
}

impl std::str::FromStr for AttachSpec {
    type Err = String;

    fn from_str(s: &str) -> Result<AttachSpec, String> {
        match s {
            "none" => Ok(AttachSpec::None),
            "snap" => Ok(AttachSpec::Snap),
            _ => match s.strip_prefix("qmp:") {
                Some(path) if path.starts_with('/') => Ok(AttachSpec::Qmp(path.into())),
                _ => Err(format!(
                    "{s:?}: use none, qmp:/absolute/path/to/qmp.sock or snap"
                )),
            },
        }
    }
}

impl AttachSpec {
    /// The implementation the flag names.
    pub fn open(&self) -> Result<Box<dyn Attach>, AttachError> {
        match self {
            AttachSpec::None => Ok(Box::new(NoAttach)),
            AttachSpec::Qmp(socket) => Ok(Box::new(QmpAttach::new(socket.clone()))),
            AttachSpec::Snap => snap(),
        }
    }
}

#[cfg(feature = "snap")]
fn snap() -> Result<Box<dyn Attach>, AttachError> {
    snap::open()
}

#[cfg(not(feature = "snap"))]
fn snap() -> Result<Box<dyn Attach>, AttachError> {
    Err(AttachError::Unsupported(
        "--attach snap needs a dpufs-csi built with the cargo feature snap, on a BlueField with the DOCA SDK".into(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flag_names_one_way() {
        assert_eq!("none".parse::<AttachSpec>(), Ok(AttachSpec::None));
        assert_eq!("snap".parse::<AttachSpec>(), Ok(AttachSpec::Snap));
        assert_eq!(
            "qmp:/run/qemu/qmp.sock".parse::<AttachSpec>(),
            Ok(AttachSpec::Qmp("/run/qemu/qmp.sock".into()))
        );
        for bad in ["", "qmp:", "qmp:relative.sock", "vfio"] {
            assert!(bad.parse::<AttachSpec>().is_err(), "{bad}");
        }
    }

    #[test]
    fn snap_says_what_it_needs() {
        let e = AttachSpec::Snap.open().unwrap_err().to_string();
        assert!(e.contains("DOCA"), "{e}");
    }
}
