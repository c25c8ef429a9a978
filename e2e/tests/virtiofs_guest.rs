//! A real Linux guest under QEMU mounts virtio-fs volumes (docs/testing.md, "Guest tests").
//!
//! The differential test: one guest script (`e2e/guest/fs_ops.sh`) on a virtio-fs mount served
//! by (a) the C `virtiofsd` that Debian's QEMU ships, over a plain directory, and (b) our worker
//! (`dpufs-csi worker --transport vhost-user-fs`) over a plain directory. The two transcripts
//! must be the same, each must match what its directory holds afterwards (checksums computed on
//! the machine), and the contents must be what the test wrote: two servers broken the same way
//! fail too.
//!
//! Also: the guest's network cards reach the machine (the DPU-mode test's shim reaches its
//! agent that way).

use dpufs_e2e::guest::{
    Guest, GuestAssets, GuestRun, Nic, TapDevice, USER_NET_HOST, wait_for_listener,
};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

const FS_OPS: &str = include_str!("../guest/fs_ops.sh");
/// Boot, script and power-off; about 10 s under TCG on an idle 2-core machine.
const GUEST_TIMEOUT: Duration = Duration::from_secs(120);
/// The mount's tag, the same for every server so that the transcripts can be compared.
const TAG: &str = "vol";

/// The test's data, random, made once per test process (both servers get the same).
#[derive(Debug)]
struct TestData {
    one: Vec<u8>,
    page: Vec<u8>,
    big: Vec<u8>,
}

fn data() -> &'static TestData {
    static DATA: OnceLock<TestData> = OnceLock::new();
    DATA.get_or_init(|| {
        let mut urandom = std::fs::File::open("/dev/urandom").expect("/dev/urandom");
        let mut bytes = |n: usize| {
            let mut b = vec![0; n];
            urandom.read_exact(&mut b).expect("reading /dev/urandom");
            b
        };
        TestData {
            one: bytes(1),
            page: bytes(4096),
            big: bytes((1 << 20) + 4099),
        }
    })
}

/// What serves the guest's mount.
#[derive(Debug, Clone, Copy)]
enum Server {
    /// `/usr/lib/qemu/virtiofsd` (qemu-system-common), the implementation nobody here wrote.
    Virtiofsd,
    /// `dpufs-csi worker --backend local:DIR --transport vhost-user-fs`.
    Worker,
}

impl Server {
    /// Starts the server on `source`, listening on `socket`, its output in `log`.
    fn spawn(self, source: &Path, socket: &Path, state: &Path, log: &Path) -> ServerProcess {
        let mut cmd = match self {
            Server::Virtiofsd => {
                let mut cmd = Command::new("/usr/lib/qemu/virtiofsd");
                cmd.arg(format!("--socket-path={}", socket.display()))
                    .arg("-o")
                    .arg(format!("source={}", source.display()));
                cmd
            }
            Server::Worker => {
                let mut cmd = Command::new(dpufs_e2e::binary("dpufs-csi", "dpufs-csi"));
                cmd.arg("worker")
                    .arg("--backend")
                    .arg(format!("local:{}", source.display()))
                    .args(["--transport", "vhost-user-fs", "--vhost-user-socket"])
                    .arg(socket)
                    .arg("--state-dir")
                    .arg(state);
                cmd
            }
        };
        let out = std::fs::File::create(log).expect("server log");
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("log"))
            .stderr(out)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {self:?}: {e}"));
        ServerProcess {
            child,
            log: log.to_path_buf(),
        }
    }
}

/// A running server; killed on drop (virtiofsd exits by itself when QEMU disconnects).
#[derive(Debug)]
struct ServerProcess {
    child: Child,
    log: PathBuf,
}

impl ServerProcess {
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A run of the script against one server.
#[derive(Debug)]
struct ScriptRun {
    run: GuestRun,
    /// The manifest of the server's directory afterwards, computed on the machine.
    host_manifest: String,
}

impl ScriptRun {
    /// The `M ...` lines the guest printed last.
    fn guest_manifest(&self) -> String {
        manifest_lines(&self.run.output)
    }

    fn result(&self, key: &str) -> &str {
        self.run
            .result(key)
            .unwrap_or_else(|| panic!("no RESULT {key}=\n{}", self.run.report()))
    }
}

/// Boots a guest whose script runs `fs_ops.sh` on a mount `server` serves from an empty
/// directory.
fn run_script(assets: &GuestAssets, server: Server) -> anyhow::Result<ScriptRun> {
    let dir = tempfile::tempdir()?;
    let source = dir.path().join("source");
    let state = dir.path().join("state");
    std::fs::create_dir_all(&source)?;
    let socket = dir.path().join("vhost.sock");
    let log = dir.path().join("server.log");
    let process = server.spawn(&source, &socket, &state, &log);
    let with_log = |e: anyhow::Error| e.context(format!("{server:?}'s log:\n{}", process.log()));
    wait_for_listener(&socket, Duration::from_secs(60)).map_err(with_log)?;
    let d = data();
    let guest = Guest::builder(assets)
        .virtiofs(TAG, &socket)
        .bytes("/data/one", d.one.clone())
        .bytes("/data/page", d.page.clone())
        .bytes("/data/big", d.big.clone())
        .bytes("/guest/fs_ops.sh", FS_OPS)
        .script(&format!("sh /guest/fs_ops.sh /mnt/{TAG}"))
        .boot()?;
    let run = guest.wait(GUEST_TIMEOUT).map_err(with_log)?;
    eprintln!(
        "{server:?}: the guest ran for {:.1} s",
        run.elapsed.as_secs_f64()
    );
    Ok(ScriptRun {
        run,
        host_manifest: host_manifest(&source)?,
    })
}

/// The run against virtiofsd, made once per test process: the worker's is compared with it.
fn reference(assets: &GuestAssets) -> &'static ScriptRun {
    static REFERENCE: OnceLock<Result<ScriptRun, String>> = OnceLock::new();
    REFERENCE
        .get_or_init(|| run_script(assets, Server::Virtiofsd).map_err(|e| format!("{e:#}")))
        .as_ref()
        .unwrap_or_else(|e| panic!("the script against virtiofsd: {e}"))
}

/// What `fs_ops.sh`'s manifest prints for directory `root`, from the machine's side.
fn host_manifest(root: &Path) -> anyhow::Result<String> {
    let mut paths = vec![PathBuf::from(".")];
    let mut i = 0;
    while i < paths.len() {
        let path = root.join(&paths[i]);
        if path.symlink_metadata()?.is_dir() {
            for entry in std::fs::read_dir(&path)? {
                paths.push(paths[i].join(entry?.file_name()));
            }
        }
        i += 1;
    }
    // `find . | sort`: byte order of the whole path.
    paths.sort_by(|a, b| {
        a.as_os_str()
            .as_encoded_bytes()
            .cmp(b.as_os_str().as_encoded_bytes())
    });
    let mut out = String::new();
    for rel in paths {
        let path = root.join(&rel);
        let meta = path.symlink_metadata()?;
        let name = rel.display();
        let line = if meta.is_symlink() {
            format!("M l {name} -> {}", std::fs::read_link(&path)?.display())
        } else if meta.is_dir() {
            format!("M d {name}")
        } else {
            format!("M f {name} {} {}", meta.len(), sha(&std::fs::read(&path)?))
        };
        out.push_str(&line);
        out.push('\n');
    }
    Ok(out)
}

fn manifest_lines(output: &str) -> String {
    output
        .lines()
        .filter(|l| l.starts_with("M "))
        .map(|l| format!("{l}\n"))
        .collect()
}

fn sha(bytes: &[u8]) -> String {
    openssl::sha::sha256(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A difference between the worker and virtiofsd that is by design (docs/worker.md, "Tests":
/// the same as the POSIX differential suite's allow list): where virtiofsd's transcript says
/// `virtiofsd`, the worker's says `worker`. Each must show up exactly so: a worker that stops
/// differing fails the test until the entry goes.
#[derive(Debug)]
struct ByDesign {
    what: &'static str,
    virtiofsd: String,
    worker: String,
}

/// The worker's by-design differences in this script's transcript.
fn by_design() -> Vec<ByDesign> {
    vec![
        ByDesign {
            what: "no `.` and `..` entries in directory listings",
            virtiofsd: "drwxr-xr-x - .\ndrwxr-xr-x - ..\n".into(),
            worker: String::new(),
        },
        ByDesign {
            what: "a file unlinked while open cannot be read through its descriptor (ESTALE): \
                   DFS frees the object at the unlink",
            virtiofsd: format!("$ sha256sum\n{}  -\n[rc=0]\n", sha(&data().big)),
            worker: "$ sha256sum\nsha256sum: can't read '-': Stale file handle\n[rc=1]\n".into(),
        },
    ]
}

/// `transcript` as the worker must print it, given virtiofsd's.
fn as_the_worker_prints_it(transcript: &str) -> String {
    by_design().iter().fold(transcript.to_string(), |t, d| {
        t.replace(&d.virtiofsd, &d.worker)
    })
}

/// Checks what the script's operations must have done, from the test's data alone; `expect`
/// turns what virtiofsd prints into what the server under test must.
fn check_contents(run: &ScriptRun, expect: impl Fn(&str) -> String) {
    let d = data();
    let report = || run.run.report();
    assert_eq!(run.run.rc, 0, "the script failed\n{}", report());
    let mut expected: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    for (name, bytes) in [
        ("empty", &[][..]),
        ("one", &d.one),
        ("page", &d.page),
        ("big", &d.big),
        ("big.dd", &d.big),
    ] {
        expected.insert(format!("{name}.cached"), bytes.to_vec());
        expected.insert(name.to_string(), bytes.to_vec());
    }
    let mut patched = d.page.clone();
    patched[100..103].copy_from_slice(b"XYZ");
    expected.insert("page.patched".into(), patched);
    let mut log = b"first\nsecond\n".to_vec();
    log.extend_from_slice(&d.one);
    log.extend_from_slice(b"tail");
    expected.insert("log".into(), log);
    expected.insert("shrunk".into(), d.big[..1000].to_vec());
    let mut grown = d.big[..1000].to_vec();
    grown.resize(20000, 0);
    expected.insert("grown".into(), grown);
    expected.insert("truncated-on-open".into(), Vec::new());
    for (key, bytes) in &expected {
        assert_eq!(
            run.result(&format!("size.{key}")),
            bytes.len().to_string(),
            "size of {key}\n{}",
            report()
        );
        assert_eq!(
            run.result(&format!("sha.{key}")),
            sha(bytes),
            "content of {key}\n{}",
            report()
        );
    }
    assert_eq!(run.result("sha.big.piece"), sha(&d.big[3 * 4097..8 * 4097]));
    assert_eq!(run.result("nonzero-after-1000.grown"), "0");
    assert_eq!(
        run.result("sha.link"),
        sha(&d.one),
        "through the symbolic link"
    );
    for transcript_part in [
        "$ cat target\nsource\n[rc=0]\n".to_string(),
        "$ rmdir a/b\nrmdir: 'a/b': Directory not empty\n[rc=1]\n".to_string(),
        "$ stat -c %s missing\nstat: can't stat 'missing': No such file or directory\n[rc=1]\n"
            .to_string(),
        "$ readlink link\na/one.moved\n[rc=0]\n".to_string(),
        // A file read through a descriptor opened before its unlink.
        format!(
            "big, read through a descriptor opened before its unlink:\n$ sha256sum\n{}  -\n[rc=0]\n",
            sha(&d.big)
        ),
        "$ ls_la a\ndrwxr-xr-x - .\ndrwxr-xr-x - ..\ndrwxr-xr-x - b\n[rc=0]\n".to_string(),
    ] {
        let transcript_part = expect(&transcript_part);
        assert!(
            run.run.output.contains(&transcript_part),
            "{transcript_part:?} not in the transcript\n{}",
            report()
        );
    }
    assert_eq!(
        run.guest_manifest(),
        run.host_manifest,
        "what the guest listed and what the directory holds differ\n{}",
        line_diff(&run.guest_manifest(), &run.host_manifest)
    );
}

/// The lines only in `a` (`-`) and only in `b` (`+`), in order (a longest common subsequence).
fn line_diff(a: &str, b: &str) -> String {
    let (a, b): (Vec<&str>, Vec<&str>) = (a.lines().collect(), b.lines().collect());
    let mut lcs = vec![vec![0u32; b.len() + 1]; a.len() + 1];
    for i in (0..a.len()).rev() {
        for j in (0..b.len()).rev() {
            lcs[i][j] = if a[i] == b[j] {
                lcs[i + 1][j + 1] + 1
            } else {
                lcs[i + 1][j].max(lcs[i][j + 1])
            };
        }
    }
    let (mut i, mut j, mut out) = (0, 0, String::new());
    while i < a.len() || j < b.len() {
        if i < a.len() && j < b.len() && a[i] == b[j] {
            (i, j) = (i + 1, j + 1);
        } else if j == b.len() || (i < a.len() && lcs[i + 1][j] >= lcs[i][j + 1]) {
            out.push_str(&format!("-{:4}: {}\n", i + 1, a[i]));
            i += 1;
        } else {
            out.push_str(&format!("+{:4}: {}\n", j + 1, b[j]));
            j += 1;
        }
    }
    out
}

#[test]
fn the_script_against_virtiofsd_does_what_it_says() {
    let Some(assets) = GuestAssets::get("the_script_against_virtiofsd_does_what_it_says") else {
        return;
    };
    check_contents(reference(&assets), str::to_string);
}

#[test]
fn the_worker_serves_the_guest_as_virtiofsd_does() {
    let Some(assets) = GuestAssets::get("the_worker_serves_the_guest_as_virtiofsd_does") else {
        return;
    };
    let reference = reference(&assets);
    let ours = run_script(&assets, Server::Worker).unwrap_or_else(|e| panic!("{e:#}"));
    for difference in by_design() {
        assert!(
            reference.run.output.contains(&difference.virtiofsd),
            "virtiofsd's transcript no longer shows what makes this difference ({}): {:?}",
            difference.what,
            difference.virtiofsd
        );
        // Straight to stderr: libtest captures eprintln! and shows it only for failures.
        let _ = writeln!(
            std::io::stderr(),
            "!!! by design, the worker differs from virtiofsd: {}",
            difference.what
        );
    }
    let expected = as_the_worker_prints_it(&reference.run.output);
    assert!(
        ours.run.output == expected,
        "the transcripts differ (- virtiofsd's with the by-design differences, + the worker's):\n{}\n--- the worker's run\n{}",
        line_diff(&expected, &ours.run.output),
        ours.run.report()
    );
    check_contents(&ours, as_the_worker_prints_it);
}

#[test]
fn the_guest_reaches_the_machine_over_its_network_cards() {
    let Some(assets) = GuestAssets::get("the_guest_reaches_the_machine_over_its_network_cards")
    else {
        return;
    };
    // The tap device's subnet: one no interface of these machines uses.
    let tap = TapDevice::create(
        &format!("dpufs-t{}", std::process::id() % 100_000),
        "10.213.77.1/24",
    )
    .expect("a tap device (root)");
    let on_loopback = TcpListener::bind("127.0.0.1:0").unwrap();
    let on_tap = TcpListener::bind("10.213.77.1:0").unwrap();
    let forwarded = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let script = format!(
        "echo RESULT user=$(echo ping-user | nc -w 10 {USER_NET_HOST} {user_port})\n\
         echo RESULT tap=$(echo ping-tap | nc -w 10 10.213.77.1 {tap_port})\n\
         echo from-guest | nc -l -p 7000 &\n\
         while ! netstat -ltn | grep -q ':7000 '; do sleep 0.1; done\n\
         echo RESULT listening=1\n\
         wait\n",
        user_port = on_loopback.local_addr().unwrap().port(),
        tap_port = on_tap.local_addr().unwrap().port(),
    );
    let mut guest = Guest::builder(&assets)
        .nic(Nic::user().hostfwd(forwarded, 7000))
        .nic(Nic::tap(&tap.name, "10.213.77.2/24"))
        .script(&script)
        .boot()
        .unwrap_or_else(|e| panic!("{e:#}"));
    let answer = |listener: TcpListener, reply: &'static str| {
        std::thread::spawn(move || {
            let (mut conn, peer) = listener.accept().unwrap();
            let mut got = String::new();
            conn.read_to_string(&mut got).unwrap();
            conn.write_all(reply.as_bytes()).unwrap();
            (got, peer)
        })
    };
    let user = answer(on_loopback, "pong-user\n");
    let via_tap = answer(on_tap, "pong-tap\n");
    guest
        .wait_for_result("listening", GUEST_TIMEOUT)
        .unwrap_or_else(|e| panic!("{e:#}"));
    let mut from_guest = String::new();
    std::net::TcpStream::connect(("127.0.0.1", forwarded))
        .and_then(|mut c| c.read_to_string(&mut from_guest))
        .unwrap_or_else(|e| panic!("connecting to the guest's port 7000 through hostfwd: {e}"));
    let run = guest
        .wait(GUEST_TIMEOUT)
        .unwrap_or_else(|e| panic!("{e:#}"));
    assert_eq!(run.result("user"), Some("pong-user"), "{}", run.report());
    assert_eq!(run.result("tap"), Some("pong-tap"), "{}", run.report());
    let (got, _) = user.join().unwrap();
    assert_eq!(got, "ping-user\n");
    let (got, peer) = via_tap.join().unwrap();
    assert_eq!(got, "ping-tap\n");
    assert_eq!(
        peer.ip().to_string(),
        "10.213.77.2",
        "the guest's own address on the tap"
    );
    assert_eq!(from_guest, "from-guest\n");
    assert_eq!(run.rc, 0, "{}", run.report());
}
