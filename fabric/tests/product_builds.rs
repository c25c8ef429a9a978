//! The test hooks stay out of the shipped binaries. The engine (`dpufs-engine`) and the volume
//! worker (`dpufs-csi worker`) are built here the way they ship — `cargo build -p <package>
//! --bin <name>`, which builds no dev-dependency and so leaves the feature `testing` of this
//! crate off, whatever other crates' tests enable — and their bytes are scanned: the name of
//! the check switch (`DPUFS_FABRIC_DISABLE_CHECKS`) and the warning a switched-off check
//! prints must not be in them, so nothing in them can read the variable. Controls keep the
//! scan honest: the same binaries must hold the name of another variable the same module
//! reads (`DPUFS_FABRIC_RESPONDER_POLL_US`), and `fabric-peer` built with `--features testing`
//! must hold both markers. A default build of this crate's binaries makes none (the peers
//! require the feature).
//!
//! The builds are separate cargo invocations, each resolving its own features (within one
//! `cargo test --workspace`, dev-dependencies switch the feature on for everything the test
//! build links). They are the same commands `dpufs_e2e::binary` runs, so the artifacts are
//! shared with the end-to-end tests. `DPUFS_PRODUCT_PROFILE=release` builds with the release
//! profile instead of `dev`; features, and so what is compiled in, do not depend on the
//! profile.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use dpufs_fabric::soft::{DISABLE_CHECKS_ENV, RESPONDER_POLL_ENV};

/// What only the test-only switches put in a binary: the variable's name, and the words of
/// the warning every switched-off check prints.
const FORBIDDEN: [&str; 2] = [DISABLE_CHECKS_ENV, "NIC checks DISABLED"];

/// Runs `cargo build <args>` in the workspace and returns the executables it made, by target
/// name.
fn build(args: &[&str]) -> Vec<(String, PathBuf)> {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let profile = std::env::var("DPUFS_PRODUCT_PROFILE").unwrap_or_else(|_| "dev".into());
    let out = Command::new(env!("CARGO"))
        .current_dir(&workspace)
        .args([
            "build",
            "--message-format=json-render-diagnostics",
            "--profile",
        ])
        .arg(&profile)
        .args(args)
        .stderr(Stdio::inherit())
        .output()
        .expect("run cargo build");
    assert!(
        out.status.success(),
        "cargo build --profile {profile} {} failed",
        args.join(" ")
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|m| m["reason"] == "compiler-artifact")
        .filter_map(|m| {
            let exe = m["executable"].as_str()?;
            Some((m["target"]["name"].as_str()?.to_owned(), PathBuf::from(exe)))
        })
        .collect()
}

/// The one executable `cargo build -p <package> --bin <name>` makes.
fn build_bin(package: &str, name: &str, extra: &[&str]) -> PathBuf {
    let mut args = vec!["-p", package, "--bin", name];
    args.extend_from_slice(extra);
    let made = build(&args);
    match made.as_slice() {
        [(target, path)] if target == name => path.clone(),
        _ => panic!("cargo build -p {package} --bin {name} made {made:?}"),
    }
}

/// Which of `markers` the file at `path` contains.
fn markers_in<'a>(path: &Path, markers: &[&'a str]) -> Vec<&'a str> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    // Lossy UTF-8 keeps every ASCII run intact and lets std's substring search do the work.
    let text = String::from_utf8_lossy(&bytes);
    markers
        .iter()
        .copied()
        .filter(|m| text.contains(m))
        .collect()
}

#[test]
fn shipped_engine_and_worker_cannot_switch_nic_checks_off() {
    // The scan finds the switch where the feature compiles it in.
    let peer = build_bin("dpufs-fabric", "fabric-peer", &["--features", "testing"]);
    assert_eq!(
        markers_in(&peer, &FORBIDDEN),
        FORBIDDEN,
        "{} is built with the feature `testing` and must hold the switch's name and warning",
        peer.display()
    );

    for (package, name) in [("dpufs-engine", "dpufs-engine"), ("dpufs-csi", "dpufs-csi")] {
        let exe = build_bin(package, name, &[]);
        assert_eq!(
            markers_in(&exe, &[RESPONDER_POLL_ENV]),
            [RESPONDER_POLL_ENV],
            "{} does not hold {RESPONDER_POLL_ENV}, which dpufs_fabric::soft reads: the scan \
             would not see that module's strings",
            exe.display()
        );
        let found = markers_in(&exe, &FORBIDDEN);
        assert!(
            found.is_empty(),
            "{} (built as it ships: cargo build -p {package} --bin {name}) holds {found:?}: the \
             NIC check switches of dpufs-fabric reached a product build; keep them behind \
             #[cfg(feature = \"testing\")] and the feature out of [dependencies]",
            exe.display()
        );
    }

    // The peers of the tests need the feature: a default build of this crate makes no binary.
    let made = build(&["-p", "dpufs-fabric", "--bins"]);
    assert!(
        made.is_empty(),
        "a default build of dpufs-fabric made {made:?}"
    );
}
