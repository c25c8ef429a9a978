//! The DPU agent's QMP attachment (`--attach qmp:PATH`, docs/dpu.md) against a real QEMU guest:
//! two volume workers serving vhost-user-fs, hot-plugged into the guest's one free root port
//! in turn, each mounted, written and unmounted by the guest, then unplugged. Runs where QEMU
//! and the guest kernel are (`DPUFS_REQUIRE_GUEST=1` makes their absence a failure).

use dpufs_csi::dpu::attach::{Attach, AttachError, DeviceSpec, QmpAttach};
use dpufs_e2e::guest::{Guest, GuestAssets, wait_for_listener};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A worker serving `dir` on the vhost-user socket `socket`; killed on drop.
struct Backend(Child);

impl Drop for Backend {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn backend(dir: &Path, socket: &Path, state: &Path) -> Backend {
    std::fs::create_dir_all(dir).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_dpufs-csi"))
        .arg("worker")
        .arg("--backend")
        .arg(format!("local:{}", dir.display()))
        .args(["--transport", "vhost-user-fs", "--vhost-user-socket"])
        .arg(socket)
        .arg("--state-dir")
        .arg(state)
        .stdin(Stdio::null())
        .spawn()
        .expect("spawn a worker");
    wait_for_listener(socket, Duration::from_secs(30)).expect("the worker listens");
    Backend(child)
}

/// The guest mounts the first tag when it appears, writes, unmounts; then the second.
const SCRIPT: &str = r#"
attach() {
  mkdir -p /mnt/$1
  i=0
  until mount -t virtiofs $1 /mnt/$1 2>/dev/null; do
    i=$((i+1)); [ $i -gt 1200 ] && return 1; sleep 0.1
  done
}
attach dpufs-000000000000000a || exit 1
echo "from the guest" > /mnt/dpufs-000000000000000a/written
sync
umount /mnt/dpufs-000000000000000a
echo RESULT a=done
attach dpufs-000000000000000b || exit 1
echo RESULT b=$(cat /mnt/dpufs-000000000000000b/seed)
echo "second" > /mnt/dpufs-000000000000000b/written
sync
umount /mnt/dpufs-000000000000000b
echo RESULT b_done=1
# The DPU takes the function away: no virtio device is left.
i=0
until [ -z "$(ls /sys/bus/virtio/devices)" ]; do
  i=$((i+1)); [ $i -gt 1200 ] && exit 1; sleep 0.1
done
echo RESULT b_gone=1
# The agent's detach goes on after the device is gone (chardev-remove): QEMU must still run.
sleep 5
"#;

#[test]
fn devices_are_hot_plugged_into_free_ports_and_unplugged_once_the_guest_lets_go() {
    let test = "devices_are_hot_plugged_into_free_ports_and_unplugged_once_the_guest_lets_go";
    let Some(assets) = GuestAssets::get(test) else {
        return;
    };
    let dir = dpufs_e2e::csi_bed::tempdir("dpufs-qmp-");
    let a = DeviceSpec {
        tag: "dpufs-000000000000000a".into(),
        socket: dir.path().join("a.sock"),
    };
    let b = DeviceSpec {
        tag: "dpufs-000000000000000b".into(),
        socket: dir.path().join("b.sock"),
    };
    let _backend_a = backend(
        &dir.path().join("a"),
        &a.socket,
        &dir.path().join("a-state"),
    );
    std::fs::create_dir_all(dir.path().join("b")).unwrap();
    std::fs::write(dir.path().join("b/seed"), "seeded-on-the-dpu").unwrap();
    let _backend_b = backend(
        &dir.path().join("b"),
        &b.socket,
        &dir.path().join("b-state"),
    );
    let mut guest = Guest::builder(&assets)
        .pcie_hotplug_slots(1)
        .script(SCRIPT)
        .boot()
        .expect("boot the guest");
    let qmp = QmpAttach::new(guest.qmp_socket().to_path_buf());
    // QEMU answers on its monitor from its start.
    let mut attached = qmp.attach(&a);
    for _ in 0..100 {
        if attached.is_ok() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
        attached = qmp.attach(&a);
    }
    attached.expect("attach a");
    qmp.attach(&a)
        .expect("attaching what is attached changes nothing");
    // One root port, taken.
    let second = qmp.attach(&b);
    assert!(
        matches!(second, Err(AttachError::NoFreePort)),
        "the only port is a's: {second:?}\n{}",
        guest.report()
    );
    guest
        .wait_for_result("a", Duration::from_secs(120))
        .expect("the guest mounted, wrote and unmounted a");
    qmp.detach(&a).expect("detach a: the guest lets it go");
    qmp.detach(&a)
        .expect("detaching what is not there changes nothing");
    qmp.attach(&b).expect("attach b into the port a left");
    let seed = guest
        .wait_for_result("b", Duration::from_secs(120))
        .expect("the guest mounted b");
    assert_eq!(seed, "seeded-on-the-dpu");
    guest
        .wait_for_result("b_done", Duration::from_secs(60))
        .expect("the guest unmounted b");
    qmp.detach(&b).expect("detach b");
    guest
        .wait_for_result("b_gone", Duration::from_secs(60))
        .expect("the guest saw b go");
    let run = guest.wait(Duration::from_secs(60)).expect("the guest ends");
    assert_eq!(run.rc, 0, "{}", run.report());
    assert_eq!(
        std::fs::read_to_string(dir.path().join("a/written")).unwrap(),
        "from the guest\n"
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("b/written")).unwrap(),
        "second\n"
    );
}
