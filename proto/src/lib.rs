//! Wire protocols of dpufs, generated from the `.proto` files beside this crate,
//! plus the small vocabulary of constants both ends of the DAOS wire must agree
//! on (DER codes, fault codes, ErrorInfo reasons, property numbers, label rules, DAOS's
//! TLS rules) and the DFS vocabulary of the engine's data protocol (errno, limits, names).
//!
//! The engine and the clients depend on this crate and on nothing of each other:
//! they meet only on these definitions, so the real DAOS can stand in for the
//! engine.

#![allow(clippy::doc_lazy_continuation, clippy::large_enum_variant)]

/// Container Storage Interface v1.12.0.
pub mod csi {
    /// Package `csi.v1`.
    pub mod v1 {
        tonic::include_proto!("csi.v1");
    }
}

/// DAOS 2.8 management API, package `mgmt` (`/mgmt.MgmtSvc/...`).
pub mod mgmt {
    tonic::include_proto!("mgmt");

    /// The DAOS 2.6 messages that differ from 2.8's.
    pub mod v2_6 {
        tonic::include_proto!("mgmt.v2_6");
    }
}

/// `google.rpc.Status` and `ErrorInfo`, as DAOS puts them in error trailers.
pub mod google {
    /// Package `google.rpc`.
    pub mod rpc {
        tonic::include_proto!("google.rpc");
    }
}

/// The embedded engine's own services (containers, rank control).
pub mod engine {
    /// Package `dpufs.engine.v1`.
    pub mod v1 {
        tonic::include_proto!("dpufs.engine.v1");
    }
}

/// The storage-plugin API of NVIDIA's DOCA Platform Framework: what DPF's SNAP node driver
/// calls on a storage vendor's plugin on the DPU.
pub mod nvidia {
    /// Package `nvidia.storage.plugins.v1`.
    pub mod storage {
        pub mod plugins {
            pub mod v1 {
                tonic::include_proto!("nvidia.storage.plugins.v1");
            }
        }
    }
}

/// The control channel between a host's CSI node shim and the dpufs agent on its DPU
/// (`docs/dpu.md`).
pub mod dpu {
    /// Package `dpufs.dpu.v1`.
    pub mod v1 {
        tonic::include_proto!("dpufs.dpu.v1");
    }
}

pub mod daos;
pub mod dfs;

/// Encoded `FileDescriptorSet` of every file above, for gRPC server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/descriptor_set.bin"));

#[cfg(test)]
mod tests;
