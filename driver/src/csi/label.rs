//! Container labels of CSI volumes, and the names CSI gives volumes.
//!
//! A CSI name is up to 128 bytes of Unicode (Kubernetes sends `pvc-<uuid>`, conformance
//! suites 128-character names); a DAOS label is 1 to 127 characters of `A-Z a-z 0-9 . _ : -`.
//! So the label is a digest: `csi-` and the SHA-256 of the name in hex (68 characters). The
//! full name is kept in the container attribute [`NAME_ATTR`].
//!
//! The label is the controller's idempotency journal: a retried CreateVolume looks the
//! container up by the label of its name, whatever step the first attempt stopped at.

/// The prefix of every label this driver gives a container.
pub const LABEL_PREFIX: &str = "csi-";

/// Container attribute holding the CSI name the container was created for (UTF-8).
pub const NAME_ATTR: &str = "dpufs.csi/name";
/// Container attribute holding what the volume was created with (JSON,
/// [`crate::csi::controller`]'s request record); written last, it marks a complete create.
pub const REQUEST_ATTR: &str = "dpufs.csi/request";
/// Container attributes naming the PVC and PV the volume was provisioned for, when the
/// provisioner sends them (`--extra-create-metadata`). Informational.
pub const PVC_NAMESPACE_ATTR: &str = "dpufs.csi/pvc-namespace";
pub const PVC_NAME_ATTR: &str = "dpufs.csi/pvc-name";
pub const PV_NAME_ATTR: &str = "dpufs.csi/pv-name";
/// Container attribute holding the volume's QoS limits (JSON, `dpufs_node_api::qos`): set by
/// CreateVolume and ControllerModifyVolume, read by the node plugins that stage the volume.
pub const QOS_ATTR: &str = "dpufs.csi/qos";

/// Longest CSI name accepted, in bytes. CSI's limit is 128 bytes; the conformance suite's
/// 128-character names are longer than that outside ASCII, so we allow more.
pub const MAX_NAME_BYTES: usize = 1024;

/// Why a CSI volume name is not acceptable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    #[error("the volume name is empty")]
    Empty,
    #[error("the volume name is {0} bytes long, at most {MAX_NAME_BYTES} are accepted")]
    TooLong(usize),
    #[error("the volume name contains the control character U+{0:04X}, which CSI forbids")]
    ControlCharacter(u32),
}

/// Checks a CSI name: not empty, not too long, none of the characters CSI bans
/// (U+0000–U+0008, U+000B, U+000C, U+000E–U+001F, U+007F–U+009F).
pub fn validate_name(name: &str) -> Result<(), NameError> {
    if name.is_empty() {
        return Err(NameError::Empty);
    }
    if name.len() > MAX_NAME_BYTES {
        return Err(NameError::TooLong(name.len()));
    }
    if let Some(c) = name
        .chars()
        .find(|&c| matches!(c as u32, 0x00..=0x08 | 0x0B | 0x0C | 0x0E..=0x1F | 0x7F..=0x9F))
    {
        return Err(NameError::ControlCharacter(c as u32));
    }
    Ok(())
}

/// The container label of the volume named `name`.
pub fn label_for(name: &str) -> String {
    let digest = openssl::sha::sha256(name.as_bytes());
    let mut label = String::with_capacity(LABEL_PREFIX.len() + 64);
    label.push_str(LABEL_PREFIX);
    for b in digest {
        label.push_str(&format!("{b:02x}"));
    }
    label
}

/// Whether `label` has the shape of a label this driver gives containers.
pub fn is_volume_label(label: &str) -> bool {
    label.strip_prefix(LABEL_PREFIX).is_some_and(|hex| {
        hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use dpufs_proto::daos::label::validate_label;
    use proptest::prelude::*;

    #[test]
    fn known_digest() {
        // `printf pvc-1 | sha256sum`
        assert_eq!(
            label_for("pvc-1"),
            "csi-f2868e1aa7cab669517cd9f5ab1b7957c0b92df38fef583267e34e1acc8253fe"
        );
        assert_ne!(label_for("pvc-1"), label_for("pvc-2"));
    }

    #[test]
    fn names() {
        assert_eq!(validate_name(""), Err(NameError::Empty));
        assert_eq!(validate_name("pvc-0b8a9c55"), Ok(()));
        assert_eq!(validate_name(&"é".repeat(128)), Ok(()));
        assert_eq!(validate_name("tab\tand\nnewline\rok"), Ok(()));
        assert_eq!(
            validate_name("bell\u{7}"),
            Err(NameError::ControlCharacter(7))
        );
        assert_eq!(
            validate_name("c1\u{85}"),
            Err(NameError::ControlCharacter(0x85))
        );
        assert_eq!(
            validate_name(&"x".repeat(MAX_NAME_BYTES + 1)),
            Err(NameError::TooLong(MAX_NAME_BYTES + 1))
        );
    }

    #[test]
    fn labels_are_recognised() {
        assert!(is_volume_label(&label_for("x")));
        assert!(!is_volume_label("csi-abc"));
        assert!(!is_volume_label("training"));
        assert!(!is_volume_label(&label_for("x").to_uppercase()));
    }

    proptest! {
        #[test]
        fn every_name_gives_a_valid_daos_label(name in any::<String>()) {
            let label = label_for(&name);
            prop_assert!(validate_label(&label).is_ok(), "{}", label);
            prop_assert!(is_volume_label(&label));
            prop_assert_eq!(label.len(), 68);
        }
    }
}
