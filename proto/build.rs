//! Compiles every `.proto` under this folder with protox (no system protoc) and
//! generates prost messages plus tonic clients and servers. The encoded
//! descriptor set is kept too, for gRPC server reflection (grpcurl).

use std::path::{Path, PathBuf};

const PROTO_ROOTS: [&str; 5] = ["csi", "daos", "dpufs", "google", "nvidia"];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let here = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    let mut files = Vec::new();
    for root in PROTO_ROOTS {
        collect_protos(&here.join(root), &mut files)?;
        println!("cargo:rerun-if-changed={root}");
    }
    files.sort();
    let relative: Vec<PathBuf> = files
        .iter()
        .map(|f| f.strip_prefix(&here).map(Path::to_path_buf))
        .collect::<Result<_, _>>()?;

    let fds = protox::compile(&relative, [&here])?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out.join("descriptor_set.bin"),
        prost::Message::encode_to_vec(&fds),
    )?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds_with_config(fds, type_named())?;
    Ok(())
}

/// Messages implement `prost::Name`, so google.rpc details pack into `Any`.
fn type_named() -> prost_build::Config {
    let mut config = prost_build::Config::new();
    config.enable_type_names();
    config
}

fn collect_protos(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            collect_protos(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "proto") {
            out.push(path);
        }
    }
    Ok(())
}
