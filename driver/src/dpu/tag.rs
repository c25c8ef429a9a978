//! The virtio-fs tag of a volume's device: the name the host mounts (`mount -t virtiofs TAG`),
//! QEMU's device id under `--attach qmp`, and the device name DPF's SNAP node driver gets from
//! the storage plugin. It is derived from the volume id alone, so the agent, a restarted agent
//! and the storage plugin all name a volume's device the same way without remembering it.
//!
//! The bound that decides its length is DOCA SNAP's: a SNAP virtio-fs function's tag holds at
//! most 20 bytes (and DPF's SNAP node driver names its fsdevs within 21 characters), far below
//! the 36 bytes of the virtio-fs device's own config field. A tag is `dpufs-` and 13 hex digits
//! of the SHA-256 of the volume id: 19 bytes, one under SNAP's cap, so a C API that counts the
//! terminating NUL in its 20 still takes it. 13 hex digits are 52 bits: two of the (at most a few
//! hundred) volumes of one DPU share a tag with a chance below 10^-10.

use crate::csi::node::record::key_of;
use crate::csi::volume_id::VolumeId;

/// What every tag of a dpufs device starts with.
pub const TAG_PREFIX: &str = "dpufs-";

/// The most bytes of a tag DOCA SNAP virtio-fs takes.
pub const MAX_TAG_BYTES: usize = 20;

/// Hex digits of the volume id's digest in its tag.
const TAG_DIGITS: usize = 13;

/// The virtio-fs tag of volume `id`: `dpufs-` and the first 13 hex digits of the digest that
/// also names its files (`csi::node::record::key_of`).
pub fn tag_of(id: &VolumeId) -> String {
    format!("{TAG_PREFIX}{}", &key_of(id)[..TAG_DIGITS])
}

/// Whether `tag` is one [`tag_of`] makes (the shim unmounts only virtio-fs mounts of these).
pub fn is_dpufs_tag(tag: &str) -> bool {
    tag.strip_prefix(TAG_PREFIX).is_some_and(|hex| {
        hex.len() == TAG_DIGITS && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(system: &str, container: &str) -> VolumeId {
        VolumeId::parse(&format!(
            "v1/{system}/6f1c2d1e-3a4b-4c5d-8e9f-0a1b2c3d4e5f/{container}"
        ))
        .unwrap()
    }

    #[test]
    fn a_tag_fits_snaps_bound_and_is_the_volumes_own() {
        // The tag's length does not follow the id's: a system name of the full 15 bytes too.
        let ids = [
            id("daos_server", "0b8a9c55-1d2e-4f60-9a7b-8c9d0e1f2a3b"),
            id("daos_server", "1b8a9c55-1d2e-4f60-9a7b-8c9d0e1f2a3b"),
            id("daos-system-015", "0b8a9c55-1d2e-4f60-9a7b-8c9d0e1f2a3b"),
        ];
        let tags: Vec<String> = ids.iter().map(tag_of).collect();
        for (id, tag) in ids.iter().zip(&tags) {
            // Below the bound, not at it: room for a terminating NUL.
            assert!(tag.len() < MAX_TAG_BYTES, "{tag}: {} bytes", tag.len());
            assert_eq!(tag.len(), 19, "{tag}");
            assert!(tag.is_ascii() && is_dpufs_tag(tag), "{tag}");
            assert_eq!(tag, &tag_of(id), "the same volume, the same tag");
            assert!(key_of(id).starts_with(&tag[TAG_PREFIX.len()..]), "{tag}");
        }
        assert_ne!(tags[0], tags[1], "another volume, another tag");
        assert_ne!(tags[1], tags[2]);
    }

    #[test]
    fn only_tags_of_dpufs_devices_are_recognised() {
        assert!(is_dpufs_tag("dpufs-0123456789abc"));
        for other in [
            "dpufs-",
            "dpufs-0123456789ab",
            "dpufs-0123456789abcd",
            "dpufs-0123456789ABC",
            "myfs-0123456789abc",
            "",
        ] {
            assert!(!is_dpufs_tag(other), "{other}");
        }
    }
}
