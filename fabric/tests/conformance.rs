//! The conformance suite against the software provider, across real processes: this test
//! process holds node 1's device context, a `fabric-peer` process the engine on node 2 (and,
//! for the cross-tenant case, a second tenant on node 1). One test per case, and one test per
//! NIC check proving that switching it off makes its witness case fail. The suite and the
//! check switches run once more with the engine in a second context of node 1's device, where
//! transfers take the same-device path (a unix socket and one copy between the buffers).

mod common;

use std::process::Command;
use std::time::Duration;

use common::case_tests;
use dpufs_fabric::NicChecks;
use dpufs_fabric::conformance::{self, CHECK_WITNESSES, Env, Peer};
use dpufs_fabric::soft::{DISABLE_CHECKS_ENV, DeviceOptions, RESPONDER_POLL_ENV, SoftDevice};

/// Node 1 opened here and a peer process, both with `disabled` checks switched off.
fn env(disabled: NicChecks) -> (tempfile::TempDir, Env<SoftDevice>) {
    env_with_engine_on(disabled, "node2", Duration::ZERO)
}

/// As [`env`], with the peer's engine context on device `engine_device`, and every
/// responder polling for `responder_poll` before it sleeps.
fn env_with_engine_on(
    disabled: NicChecks,
    engine_device: &str,
    responder_poll: Duration,
) -> (tempfile::TempDir, Env<SoftDevice>) {
    let dir = common::device_dir("dpufs-fabric-test");
    let opts = DeviceOptions {
        disabled_checks: disabled,
        responder_poll,
        ..DeviceOptions::new("node1").in_dir(dir.path())
    };
    let dev = SoftDevice::open(&opts).expect("open node1");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_fabric-peer"));
    cmd.arg(dir.path())
        .env(RESPONDER_POLL_ENV, responder_poll.as_micros().to_string());
    if disabled.is_empty() {
        cmd.env_remove(DISABLE_CHECKS_ENV);
    } else {
        cmd.env(DISABLE_CHECKS_ENV, disabled.to_string());
    }
    let peer = Peer::spawn(cmd).expect("spawn fabric-peer");
    let env = Env::new(dev, "node1", peer, engine_device).expect("engine setup in the peer");
    (dir, env)
}

fn run_case(name: &str) {
    let (_dir, env) = env(NicChecks::NONE);
    if let Err(failure) = conformance::run_case(&env, name) {
        panic!("{name}: {failure}");
    }
}

/// The provider the per-case tests run on.
type Device = SoftDevice;

dpufs_fabric::conformance_cases!(case_tests);

/// Runs the whole suite with `check` off in both processes' responders and asserts that its
/// witness fails. Prints every failing case, which documents what each check protects.
fn switched_off(check: NicChecks) {
    switched_off_with_engine_on(check, "node2");
}

fn switched_off_with_engine_on(check: NicChecks, engine_device: &str) {
    let witness = CHECK_WITNESSES
        .iter()
        .find(|(c, _)| *c == check)
        .map(|(_, w)| *w)
        .expect("every check has a witness");
    let (_dir, env) = env_with_engine_on(check, engine_device, Duration::ZERO);
    let failed: Vec<&str> = conformance::run_suite(&env, |_| true)
        .into_iter()
        .filter(|(_, r)| r.is_err())
        .map(|(name, _)| name)
        .collect();
    eprintln!("with `{check}` off, failing cases: {failed:?}");
    assert!(
        failed.contains(&witness),
        "switching off `{check}` did not make `{witness}` fail (failed: {failed:?})"
    );
}

#[test]
fn check_switch_opcode() {
    switched_off(NicChecks::OPCODE);
}

#[test]
fn check_switch_key_byte() {
    switched_off(NicChecks::KEY_BYTE);
}

#[test]
fn check_switch_pd() {
    switched_off(NicChecks::PD);
}

#[test]
fn check_switch_mw_qp_binding() {
    switched_off(NicChecks::MW_QP_BINDING);
}

#[test]
fn check_switch_state() {
    switched_off(NicChecks::STATE);
}

#[test]
fn check_switch_rights() {
    switched_off(NicChecks::RIGHTS);
}

#[test]
fn check_switch_bounds() {
    switched_off(NicChecks::BOUNDS);
}

#[test]
fn every_check_has_a_switch_test() {
    assert_eq!(CHECK_WITNESSES.len(), NicChecks::each().count());
}

/// Runs the whole suite with every check on and asserts that every case passes.
fn suite_passes(engine_device: &str, responder_poll: Duration) {
    let (_dir, env) = env_with_engine_on(NicChecks::NONE, engine_device, responder_poll);
    let failed: Vec<String> = conformance::run_suite(&env, |_| true)
        .into_iter()
        .filter_map(|(name, r)| r.err().map(|f| format!("{name}: {f}")))
        .collect();
    assert!(
        failed.is_empty(),
        "failed with the engine on {engine_device}, responders polling {responder_poll:?}: \
         {failed:#?}"
    );
}

#[test]
fn the_suite_passes_between_contexts_of_one_device() {
    suite_passes("node1", Duration::ZERO);
}

#[test]
fn every_check_is_needed_between_contexts_of_one_device() {
    for (check, _) in NicChecks::each() {
        switched_off_with_engine_on(check, "node1");
    }
}

/// Responders that poll before they sleep take the same decisions: the whole suite passes with
/// every responder of both processes polling, over TCP and on the same device.
#[test]
fn the_suite_passes_with_polling_responders() {
    for engine_device in ["node2", "node1"] {
        suite_passes(engine_device, Duration::from_micros(50));
    }
}
