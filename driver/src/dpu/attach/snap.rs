//! `--attach snap` (cargo feature `snap`): on a BlueField, DOCA SNAP virtio-fs would expose each
//! volume to the host as a virtio-fs PCIe function served from the DPU (docs/dpu.md, "The
//! hardware path"). The binding to DOCA is not written: it needs the DOCA SDK and a BlueField
//! to build and test against, neither of which this build has. The feature is compiled in CI
//! so the flag, the error and the agent's wiring stay whole; the agent refuses to start with
//! it and says why.

use super::{Attach, AttachError};
use std::path::Path;

/// Where the DOCA SDK installs on a BlueField's Arm OS.
const DOCA_DIR: &str = "/opt/mellanox/doca";

/// The SNAP attachment of this build: a clear refusal.
pub fn open() -> Result<Box<dyn Attach>, AttachError> {
    let found = Path::new(DOCA_DIR).is_dir();
    Err(AttachError::Unsupported(if found {
        format!(
            "DOCA SNAP virtio-fs: the DOCA SDK is at {DOCA_DIR}, but this dpufs-csi has no DOCA binding yet (docs/dpu.md, \"The hardware path\"); use --attach none with DPF's SNAP node driver"
        )
    } else {
        format!(
            "DOCA SNAP virtio-fs needs a BlueField with the DOCA SDK ({DOCA_DIR} is missing); use --attach none or qmp:PATH"
        )
    }))
}
