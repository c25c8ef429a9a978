//! Which provider a process opens, chosen at run time (`--fabric-provider soft|verbs`): the one
//! place a product binary turns that choice into a device. Everything above it is generic over
//! [`RdmaDevice`], so callers hand the opened device to a [`UseDevice`] and get back whatever
//! they built on it (a session server, a tenant session), type-erased by themselves.

use crate::error::{FabricError, Result};
use crate::provider::RdmaDevice;
use crate::soft::{DeviceOptions, SoftDevice};
use std::fmt;
use std::str::FromStr;

/// The providers a binary can be asked for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ProviderKind {
    /// The software RDMA device (always built): the node's shared key table, QPs over TCP.
    #[default]
    Soft,
    /// A real RDMA device through libibverbs (needs the `rdma` feature and a device).
    Verbs,
}

impl FromStr for ProviderKind {
    type Err = FabricError;

    fn from_str(s: &str) -> Result<ProviderKind> {
        match s {
            "soft" => Ok(ProviderKind::Soft),
            "verbs" => Ok(ProviderKind::Verbs),
            other => Err(FabricError::InvalidArgument(format!(
                "fabric provider {other:?}: expected soft or verbs"
            ))),
        }
    }
}

impl fmt::Display for ProviderKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ProviderKind::Soft => "soft",
            ProviderKind::Verbs => "verbs",
        })
    }
}

/// A provider and how to open its device.
#[derive(Clone, Debug)]
pub enum Provider {
    /// The software device with these options.
    Soft(DeviceOptions),
    /// The RDMA device of this name (`mlx5_0`; `None`: `$DPUFS_RDMA_DEVICE`, else the first),
    /// with the port and GID index of `DPUFS_RDMA_PORT` and `DPUFS_RDMA_GID_INDEX`.
    Verbs {
        /// Device name.
        device: Option<String>,
    },
}

/// Environment variable naming the RDMA device the verbs provider opens.
pub const RDMA_DEVICE_ENV: &str = "DPUFS_RDMA_DEVICE";

impl Provider {
    /// The provider `kind` names: the software device `soft` describes, or the RDMA device of
    /// `$DPUFS_RDMA_DEVICE` (the first device when unset).
    pub fn new(kind: ProviderKind, soft: DeviceOptions) -> Provider {
        match kind {
            ProviderKind::Soft => Provider::Soft(soft),
            ProviderKind::Verbs => Provider::Verbs {
                device: std::env::var(RDMA_DEVICE_ENV)
                    .ok()
                    .filter(|d| !d.is_empty()),
            },
        }
    }

    /// Which provider this is.
    pub fn kind(&self) -> ProviderKind {
        match self {
            Provider::Soft(_) => ProviderKind::Soft,
            Provider::Verbs { .. } => ProviderKind::Verbs,
        }
    }

    /// The same provider for talking to `peer` on another node: a software device's QPs then
    /// accept connections on this machine's address towards `peer`
    /// ([`DeviceOptions::facing`]); an RDMA device needs nothing.
    pub fn facing(&self, peer: std::net::SocketAddr) -> Result<Provider> {
        Ok(match self {
            Provider::Soft(opts) => Provider::Soft(opts.clone().facing(peer)?),
            verbs @ Provider::Verbs { .. } => verbs.clone(),
        })
    }

    /// Opens the device and hands it to `user`. A build without the `rdma` feature, or a
    /// machine without an RDMA device, fails with [`FabricError::NoDevice`] saying which.
    pub fn open<U: UseDevice>(&self, user: U) -> Result<U::Output> {
        match self {
            Provider::Soft(opts) => Ok(user.use_device(SoftDevice::open(opts)?)),
            Provider::Verbs { device } => open_verbs(device.as_deref(), user),
        }
    }
}

/// Code generic over the provider, run on the device [`Provider::open`] opened.
pub trait UseDevice {
    /// What it builds.
    type Output;
    /// Builds it on `device`.
    fn use_device<D: RdmaDevice>(self, device: D) -> Self::Output;
}

#[cfg(feature = "rdma")]
fn open_verbs<U: UseDevice>(name: Option<&str>, user: U) -> Result<U::Output> {
    let opts = crate::ibv::IbvOptions::from_env(name)?;
    Ok(user.use_device(crate::ibv::IbvDevice::open_with(&opts)?))
}

#[cfg(not(feature = "rdma"))]
fn open_verbs<U: UseDevice>(name: Option<&str>, _: U) -> Result<U::Output> {
    Err(FabricError::NoDevice(format!(
        "the verbs provider (device {}) is not in this build: build dpufs with the `rdma` \
         feature, or use --fabric-provider soft",
        name.unwrap_or("of $DPUFS_RDMA_DEVICE")
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Says which device it was given.
    struct Name;
    impl UseDevice for Name {
        type Output = &'static str;
        fn use_device<D: RdmaDevice>(self, _: D) -> &'static str {
            std::any::type_name::<D>()
        }
    }

    #[test]
    fn kinds_parse_and_print() {
        for kind in [ProviderKind::Soft, ProviderKind::Verbs] {
            assert_eq!(kind.to_string().parse::<ProviderKind>().unwrap(), kind);
        }
        let err = "ucx".parse::<ProviderKind>().unwrap_err();
        assert!(err.to_string().contains("soft or verbs"), "{err}");
    }

    #[test]
    fn the_soft_provider_opens_a_software_device() {
        let dir = tempfile::tempdir().unwrap();
        let provider = Provider::new(
            ProviderKind::Soft,
            DeviceOptions::new("choice").in_dir(dir.path()),
        );
        assert_eq!(provider.kind(), ProviderKind::Soft);
        assert!(provider.open(Name).unwrap().ends_with("SoftDevice"));
    }

    #[test]
    fn a_soft_device_facing_a_peer_listens_where_the_peer_reaches_it() {
        let provider = Provider::Soft(DeviceOptions::new("facing"));
        let Provider::Soft(opts) = provider.facing("127.0.0.1:9".parse().unwrap()).unwrap() else {
            panic!("still the soft provider");
        };
        assert_eq!(opts.listen, "127.0.0.1:0".parse().unwrap());
        let verbs = Provider::Verbs { device: None };
        assert!(matches!(
            verbs.facing("127.0.0.1:9".parse().unwrap()),
            Ok(Provider::Verbs { device: None })
        ));
    }

    #[test]
    fn verbs_without_a_device_is_a_clear_error() {
        // CI has no RDMA device; with the feature the open fails for want of one, without it
        // for want of the provider. Either way: NoDevice, never a panic.
        let provider = Provider::Verbs {
            device: Some("mlx5_404".into()),
        };
        match provider.open(Name) {
            Err(FabricError::NoDevice(why)) if cfg!(feature = "rdma") => {
                assert!(!why.is_empty())
            }
            Err(FabricError::NoDevice(why)) => {
                assert!(
                    why.contains("`rdma` feature") && why.contains("mlx5_404"),
                    "{why}"
                )
            }
            other => panic!("expected NoDevice, got {other:?}"),
        }
    }
}
