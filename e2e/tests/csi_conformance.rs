//! The CSI conformance suite (`dpufs_e2e::csi_sanity`, the project's own csi-sanity) against
//! the dpufs driver on real processes: the embedded engine, the node's mount keeper,
//! `dpufs-csi controller` and `dpufs-csi node` on unix sockets, real FUSE mounts. The node
//! part needs root and /dev/fuse; without them it is skipped, loudly, and the controller part
//! still runs.
//!
//! Also: the suite against a driver that answers OK to everything (its checks can fail), and
//! against any driver named in the environment (`CSI_SANITY_ENDPOINT`, docs/testing.md).

#[path = "csi_conformance/yes_driver.rs"]
mod yes_driver;

use dpufs_e2e::csi_bed::{Bed, BedOptions, MIB, unix};
use dpufs_e2e::csi_sanity::{self, Config, Outcome, Report};
use std::io::Write;
use std::path::Path;

/// Straight to the terminal, past libtest's capture.
fn loud(text: &str) {
    let _ = writeln!(std::io::stderr(), "{text}");
}

/// Why the node part cannot run here, if it cannot (or `CSI_SANITY_SKIP_NODE` is set).
fn no_mounts() -> Option<String> {
    if std::env::var_os("CSI_SANITY_SKIP_NODE").is_some() {
        return Some("CSI_SANITY_SKIP_NODE is set".into());
    }
    // SAFETY: plain getter.
    let euid = unsafe { libc::geteuid() };
    if euid != 0 {
        return Some(format!(
            "not root (euid {euid}): the node plugin mounts FUSE file systems"
        ));
    }
    if !Path::new("/dev/fuse").exists() {
        return Some("no /dev/fuse".into());
    }
    None
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Cases the dpufs driver fails today, each for a gap docs/csi.md records. Each must fail
/// (the test says so when one passes, to take it off this list); every other case must pass.
const KNOWN_GAPS: &[(&str, &str)] = &[];

#[tokio::test(flavor = "multi_thread")]
async fn csi_sanity_against_dpufs() {
    let absent = no_mounts();
    if let Some(why) = &absent {
        loud(&format!(
            "\n!!!!! csi_conformance: the Node cases are SKIPPED: {why}. The Identity and \
             Controller cases still run. Run as root with /dev/fuse for all of them.\n"
        ));
    }
    // Built (when out of date) before the clock starts.
    dpufs_e2e::binary("dpufs-engine", "dpufs-engine");
    let mut opts = BedOptions::new(dpufs_e2e::binary("dpufs-csi", "dpufs-csi"));
    opts.node = absent.is_none();
    opts.log_to_files = true;
    let start = std::time::Instant::now();
    let bed = Bed::start(opts).await;
    loud(&format!(
        "csi_conformance: engine, keeper and plugins up in {:.1} s",
        start.elapsed().as_secs_f64()
    ));
    let mut config = Config::new(
        unix(&bed.controller_socket()).display().to_string(),
        absent
            .is_none()
            .then(|| unix(&bed.node_socket()).display().to_string()),
        // Under the node plugin's --mount-root, as kubelet's paths are.
        bed.path("sanity/mount"),
        bed.path("sanity/staging"),
    );
    if let Some(why) = absent {
        config.node_absent_reason = why;
    }
    // The bed's pool holds 2 GiB: csi-sanity's 10 GiB default would be OUT_OF_RANGE.
    config.volume_parameters = [("pool".to_string(), "fast".to_string())].into();
    config.volume_size = 64 * MIB;
    config.expand_size = 128 * MIB;
    config.mutable_parameters = [("maxIops".to_string(), "5000".to_string())].into();
    config.apply_env().expect("CSI_SANITY_* overrides");
    let report = csi_sanity::run(config).await;
    loud(&format!("\n{report}"));
    let failed: Vec<_> = report
        .failed()
        .map(|c| c.name.clone())
        .filter(|name| !KNOWN_GAPS.iter().any(|(gap, _)| gap == name))
        .collect();
    if !failed.is_empty() {
        for process in ["controller", "node", "keeper"] {
            loud(&format!(
                "--- last lines of the {process}'s log:\n{}",
                tail(&bed.log(process), 40)
            ));
        }
    }
    assert!(
        failed.is_empty(),
        "{} failed: {failed:#?}",
        report.summary()
    );
    for (gap, why) in KNOWN_GAPS {
        let case = report.cases.iter().find(|c| c.name == *gap);
        if case.is_some_and(|c| matches!(c.outcome, Outcome::Failed(_))) {
            loud(&format!(
                "!!!!! KNOWN DRIVER GAP, failed as expected: {gap}: {why}"
            ));
        } else if case.is_some() {
            panic!("{gap} no longer fails: remove it from KNOWN_GAPS");
        }
    }
    assert!(
        report.passed().count() > 0,
        "nothing passed: {}",
        report.summary()
    );
    let modify_skipped: Vec<String> = report
        .cases
        .iter()
        .filter(|c| c.name.starts_with("ControllerModifyVolume"))
        .filter(|c| matches!(c.outcome, Outcome::Skipped(_)))
        .map(|c| c.to_string())
        .collect();
    assert!(
        modify_skipped.is_empty(),
        "MODIFY_VOLUME is advertised, its cases must run: {modify_skipped:?}"
    );
    // No mount left under the bed, and every volume the suite made is gone.
    let left: Vec<_> = dpufs_node_api::mountinfo::read()
        .unwrap()
        .into_iter()
        .filter(|m| m.mountpoint.starts_with(bed.dir.path()))
        .collect();
    assert!(left.is_empty(), "mounts left behind: {left:?}");
    let containers = bed.containers().await;
    assert_eq!(
        containers,
        vec![bed.vol.container.clone()],
        "only the bed's own container is left"
    );
}

/// The cases whose whole check is that calls are answered OK: a driver that answers OK to
/// everything passes them. (Two empty plugin names are also the same name; GetPluginInfo's
/// own case fails them.)
const PASS_ON_OK: &[&str] = &[
    "Identity (controller endpoint): GetPluginCapabilities lists known capabilities only",
    "Identity (controller endpoint): Probe answers OK",
    "Identity (node endpoint): GetPluginCapabilities lists known capabilities only",
    "Identity (node endpoint): Probe answers OK",
    "Identity: both endpoints serve the same plugin (name and vendor version)",
    "ControllerGetCapabilities: lists known capabilities only",
    "GetCapacity: answers without optional fields",
    "GetCapacity: answers for the test parameters and a capability",
    "ListVolumes: answers without optional fields, every entry a volume with an id",
    "DeleteVolume: an unknown volume id is OK",
    "DeleteSnapshot: an unknown snapshot id is OK",
    "ListSnapshots: answers without optional fields, every entry a complete snapshot",
    "ListSnapshots: an unknown snapshot id lists nothing",
    "ListSnapshots: an unknown source volume lists nothing",
    "NodeGetCapabilities: lists known capabilities only",
];

/// And these when CreateVolume and CreateSnapshot answer ids made of the name (the same
/// request, the same id) and the size asked for, and NodeGetInfo a node id.
const PASS_ON_ECHO: &[&str] = &[
    "CreateVolume: no capacity range creates a volume",
    "CreateVolume: the test size creates a volume at least that large",
    "CreateVolume: the same name and size again is OK with the same volume",
    "CreateVolume: a 128-character name works",
    "CreateVolume: from an existing snapshot",
    "CreateVolume: from an existing volume (clone)",
    "ControllerPublishVolume and ControllerUnpublishVolume: repeated, each is OK",
    "CreateSnapshot: the same name and source again is OK with the same snapshot",
    "CreateSnapshot: a 128-character name works, twice",
    "DeleteSnapshot: deletes a snapshot, and again is OK",
    "NodeExpandVolume: after ControllerExpandVolume, on a published volume",
];

/// The suite against the driver that says yes (`echo`: with ids): only `may_pass` may pass,
/// only the ControllerModifyVolume cases that need configured parameters may be skipped,
/// everything else must fail.
async fn only_these_pass(echo: bool, may_pass: &[&str]) -> Report {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("yes.sock");
    let _server = yes_driver::serve(&socket, echo).await;
    let endpoint = unix(&socket).display().to_string();
    let mut config = Config::new(
        endpoint.clone(),
        Some(endpoint),
        dir.path().join("mount"),
        dir.path().join("staging"),
    );
    config.idempotent_count = 2;
    let report = csi_sanity::run(config).await;
    loud(&format!("\n{report}"));
    let unexpected: Vec<String> = report
        .cases
        .iter()
        .filter(|c| match &c.outcome {
            Outcome::Failed(_) => false,
            Outcome::Passed => !may_pass.contains(&c.name.as_str()),
            Outcome::Skipped(_) => !c.name.starts_with("ControllerModifyVolume"),
        })
        .map(|c| c.to_string())
        .collect();
    assert!(
        unexpected.is_empty(),
        "cases that did not fail against a driver that says OK to everything:\n{}",
        unexpected.join("\n")
    );
    report
}

/// Every check can fail: against a driver that advertises every capability and answers OK
/// with empty responses, only the cases of [`PASS_ON_OK`] pass.
#[tokio::test(flavor = "multi_thread")]
async fn the_suite_fails_a_driver_that_answers_ok_to_everything() {
    let report = only_these_pass(false, PASS_ON_OK).await;
    assert!(report.failed().count() > 80, "{}", report.summary());
}

/// Past the first call: a driver that answers OK to everything but makes up ids fails every
/// check of what a volume is (mounted targets, files, stats, removed targets, listings,
/// codes), and passes only [`PASS_ON_OK`] and [`PASS_ON_ECHO`].
#[tokio::test(flavor = "multi_thread")]
async fn the_suite_fails_a_driver_that_makes_up_ids_and_does_nothing() {
    let may_pass: Vec<&str> = PASS_ON_OK.iter().chain(PASS_ON_ECHO).copied().collect();
    let report = only_these_pass(true, &may_pass).await;
    assert!(report.failed().count() > 65, "{}", report.summary());
}

/// The suite against the driver the environment names (`CSI_SANITY_ENDPOINT`,
/// `CSI_SANITY_CONTROLLER_ENDPOINT`, …; docs/testing.md).
#[tokio::test(flavor = "multi_thread")]
async fn csi_sanity_against_the_driver_in_the_environment() {
    let config = match Config::from_env() {
        Ok(Some(config)) => config,
        Ok(None) => {
            loud(
                "\n!!!!! SKIPPED csi_sanity_against_the_driver_in_the_environment: \
                 CSI_SANITY_ENDPOINT is not set (docs/testing.md, CSI conformance)\n",
            );
            return;
        }
        Err(e) => panic!("CSI_SANITY_*: {e}"),
    };
    let report: Report = csi_sanity::run(config).await;
    loud(&format!("\n{report}"));
    let failed: Vec<_> = report.failed().map(|c| c.name.clone()).collect();
    assert!(
        failed.is_empty(),
        "{} failed: {failed:#?}",
        report.summary()
    );
}
