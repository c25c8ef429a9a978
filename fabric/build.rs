//! Build script of dpufs-fabric. With feature `rdma` (CARGO_FEATURE_RDMA) it compiles the C shim
//! of the verbs provider (src/ibv/shim.c) against the system's libibverbs headers; the default
//! build compiles nothing and needs no RDMA packages.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    #[cfg(feature = "rdma")]
    rdma_shim();
}

/// Compiles `src/ibv/shim.c` into a static library linked into the crate. The shim calls into
/// libibverbs, which ibverbs-sys links (`-libverbs`).
#[cfg(feature = "rdma")]
fn rdma_shim() {
    const SHIM: &str = "src/ibv/shim.c";
    println!("cargo:rerun-if-changed={SHIM}");
    cc::Build::new()
        .file(SHIM)
        .warnings(true)
        .extra_warnings(true)
        .warnings_into_errors(true)
        .compile("dpufs_ibv_shim");
}
