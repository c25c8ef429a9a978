//! `dpufs bench meta` end to end against two plain directories (a target and a baseline),
//! with tiny counts: every phase runs on both and lands in both reports.

use serde_json::Value;
use std::path::Path;
use std::process::Command;

const DPUFS: &str = env!("CARGO_BIN_EXE_dpufs");

#[test]
fn meta_bench_reports_every_phase_for_every_target() {
    let root = rustix::process::geteuid().is_root();
    if !dpufs_e2e::skip::host_has(
        root,
        "dpufs bench meta drops the page cache, which needs root",
    ) {
        return;
    }
    let (target, baseline, out) = (dir(), dir(), dir());
    let arg = |name: &str, d: &tempfile::TempDir| format!("{name}={}", d.path().display());
    let run = Command::new(DPUFS)
        .args([
            "bench",
            "meta",
            "--files",
            "20",
            "--jobs",
            "1,2",
            "--tree-files",
            "30",
        ])
        .args(["--rounds", "2", "--target", &arg("fast", &target)])
        .args(["--baseline", &arg("local", &baseline), "--out"])
        .arg(out.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{stderr}");

    let md = std::fs::read_to_string(out.path().join("meta.md")).unwrap();
    assert!(md.starts_with("Command: `"), "{md}");
    assert!(md.contains("--tree-files 30"), "{md}");
    let json: Value =
        serde_json::from_slice(&std::fs::read(out.path().join("meta.json")).unwrap()).unwrap();
    let rows = json["rows"].as_array().unwrap();
    // 2 layouts × 2 job counts × 4 operations, and 5 steps of the tree; for both targets.
    assert_eq!(rows.len(), (2 * 2 * 4 + 5) * 2);
    for row in rows {
        let (phase, name) = (
            row["phase"].as_str().unwrap(),
            row["target"].as_str().unwrap(),
        );
        let median = row["median"].as_f64().unwrap_or(0.0);
        assert!(median > 0.0, "{name} {phase}: {row}");
        assert!(
            md.contains(&format!("| {phase} | {name} |")),
            "{phase}, {name}: {md}"
        );
        if name == "local" {
            assert_eq!(row["vs_baseline"].as_f64(), Some(1.0));
        }
    }
    assert_eq!(json["runs"].as_array().unwrap().len(), rows.len() * 2);

    // The targets are left as found; the scratch source is gone too.
    assert_eq!(entries(target.path()), 0);
    assert_eq!(entries(baseline.path()), 0);
    assert_eq!(entries(out.path()), 2);
}

#[test]
fn meta_bench_refuses_a_target_that_is_not_a_directory() {
    let root = rustix::process::geteuid().is_root();
    if !dpufs_e2e::skip::host_has(root, "dpufs bench meta refuses to run without root first") {
        return;
    }
    let baseline = dir();
    let run = Command::new(DPUFS)
        .args(["bench", "meta", "--target", "t=/no/such/dir"])
        .arg(format!("--baseline=b={}", baseline.path().display()))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(!run.status.success());
    assert!(
        stderr.contains("t: /no/such/dir is not a directory"),
        "{stderr}"
    );
}

fn dir() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

fn entries(dir: &Path) -> usize {
    std::fs::read_dir(dir).unwrap().count()
}
