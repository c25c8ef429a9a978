//! Network namespaces for tests that need machines apart on one machine: a namespace per role
//! (the storage network's engine, a DPU's host), veth links between them, processes started
//! inside one, and TCP connections made from inside one. Needs root (CAP_SYS_ADMIN and
//! CAP_NET_ADMIN) and `ip` (iproute2).
//!
//! A namespace is `ip netns add`'s (a file under `/run/netns`), deleted on drop with its
//! interfaces: a veth pair goes when either end's namespace goes.

use anyhow::{Context, bail};
use std::fs::File;
use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// A network namespace made by the test; deleted on drop.
#[derive(Debug)]
pub struct Netns {
    name: String,
}

impl Netns {
    /// Creates namespace `name` with its loopback up. A namespace of that name left by an
    /// earlier run that died is replaced.
    pub fn create(name: &str) -> anyhow::Result<Netns> {
        if Path::new("/run/netns").join(name).exists() {
            ip(&["netns", "del", name])?;
        }
        ip(&["netns", "add", name])?;
        let ns = Netns {
            name: name.to_string(),
        };
        ip(&["-n", name, "link", "set", "lo", "up"])?;
        Ok(ns)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The namespace's file, what `setns(2)` enters.
    pub fn path(&self) -> PathBuf {
        Path::new("/run/netns").join(&self.name)
    }

    /// Makes `cmd`'s process start inside this namespace (a `setns(2)` between fork and exec).
    pub fn enter_on_exec(&self, cmd: &mut Command) -> anyhow::Result<()> {
        enter_on_exec(&self.path(), cmd)
    }

    /// Runs `f` on a thread inside this namespace ([`run_in`]).
    pub fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> anyhow::Result<T> {
        run_in(&self.path(), f)
    }

    /// A TCP connection to `addr` made from inside this namespace ([`connect_from`]).
    pub fn connect(&self, addr: SocketAddr, timeout: Duration) -> anyhow::Result<TcpStream> {
        connect_from(&self.path(), addr, timeout)
    }

    /// Runs `ip` inside this namespace (`ip -n NAME ARGS`).
    pub fn ip(&self, args: &[&str]) -> anyhow::Result<()> {
        let mut all = vec!["-n", &self.name];
        all.extend_from_slice(args);
        ip(&all)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        if let Err(e) = ip(&["netns", "del", &self.name]) {
            eprintln!("deleting network namespace {}: {e:#}", self.name);
        }
    }
}

/// One end of a veth link: its interface name (at most 15 bytes), its namespace (`None`: the
/// test's own) and its address (`10.0.0.1/24`).
#[derive(Debug, Clone, Copy)]
pub struct End<'a> {
    pub ifname: &'a str,
    pub netns: Option<&'a Netns>,
    pub cidr: &'a str,
}

/// A veth link between `a` and `b`, both ends up with their addresses. The pair is deleted
/// with the namespace of either end; between two ends in the test's own namespace nothing
/// deletes it.
pub fn veth(a: End<'_>, b: End<'_>) -> anyhow::Result<()> {
    ip(&[
        "link", "add", a.ifname, "type", "veth", "peer", "name", b.ifname,
    ])?;
    for end in [a, b] {
        if let Some(ns) = end.netns {
            ip(&["link", "set", end.ifname, "netns", ns.name()])?;
        }
        let at = |args: &[&str]| match end.netns {
            Some(ns) => ns.ip(args),
            None => ip(args),
        };
        at(&["addr", "add", end.cidr, "dev", end.ifname])?;
        at(&["link", "set", end.ifname, "up"])?;
    }
    Ok(())
}

/// Makes `cmd`'s process start inside the network namespace whose file is `netns`.
pub fn enter_on_exec(netns: &Path, cmd: &mut Command) -> anyhow::Result<()> {
    let file = File::open(netns).with_context(|| format!("opening {}", netns.display()))?;
    // SAFETY: setns(2) is async-signal-safe; the descriptor stays open in the closure until
    // the command is dropped (it is close-on-exec, so the program does not inherit it).
    unsafe {
        cmd.pre_exec(move || {
            if libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    Ok(())
}

/// Runs `f` on a thread inside the network namespace whose file is `netns`: whatever sockets
/// it makes belong to that namespace, wherever they are used afterwards.
pub fn run_in<T: Send>(netns: &Path, f: impl FnOnce() -> T + Send) -> anyhow::Result<T> {
    std::thread::scope(|s| {
        s.spawn(|| {
            enter(netns)?;
            Ok(f())
        })
        .join()
        .expect("the thread in the namespace panicked")
    })
}

/// A TCP connection to `addr` made from inside the network namespace whose file is `netns`,
/// as a process there would make it.
pub fn connect_from(
    netns: &Path,
    addr: SocketAddr,
    timeout: Duration,
) -> anyhow::Result<TcpStream> {
    run_in(netns, || TcpStream::connect_timeout(&addr, timeout))?
        .with_context(|| format!("connecting to {addr} from {}", netns.display()))
}

/// Moves the calling thread into the network namespace whose file is `netns`.
fn enter(netns: &Path) -> anyhow::Result<()> {
    let file = File::open(netns).with_context(|| format!("opening {}", netns.display()))?;
    // SAFETY: plain setns(2) on an open descriptor; it changes this thread only.
    if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("entering {}", netns.display()));
    }
    Ok(())
}

/// Runs `ip ARGS` (iproute2), its stderr in the error.
pub(crate) fn ip(args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .context("running ip (iproute2)")?;
    if !out.status.success() {
        bail!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    /// Needs root, as the other tests of this crate that mount or make devices.
    #[test]
    fn a_namespace_reaches_only_what_its_links_reach() {
        let tag = std::process::id() % 100_000;
        let a = Netns::create(&format!("dpufs-ut-a{tag}")).unwrap();
        let b = Netns::create(&format!("dpufs-ut-b{tag}")).unwrap();
        veth(
            End {
                ifname: &format!("ut-a{tag}"),
                netns: Some(&a),
                cidr: "10.231.7.1/24",
            },
            End {
                ifname: &format!("ut-b{tag}"),
                netns: Some(&b),
                cidr: "10.231.7.2/24",
            },
        )
        .unwrap();
        // A listener in a, on its link's address.
        let listener = a
            .run(|| TcpListener::bind("10.231.7.1:0"))
            .unwrap()
            .unwrap();
        let addr = listener.local_addr().unwrap();
        b.connect(addr, Duration::from_secs(5)).unwrap();
        // The test's own namespace has no route there, and b has no loopback listener.
        assert!(TcpStream::connect_timeout(&addr, Duration::from_millis(500)).is_err());
        let lo = SocketAddr::from(([127, 0, 0, 1], addr.port()));
        assert!(b.connect(lo, Duration::from_millis(500)).is_err());
        // A process started in b reaches a too.
        let mut cmd = Command::new("cat");
        cmd.arg("/proc/self/net/dev");
        b.enter_on_exec(&mut cmd).unwrap();
        let dev = String::from_utf8(cmd.output().unwrap().stdout).unwrap();
        assert!(dev.contains(&format!("ut-b{tag}")), "{dev}");
        drop(a);
        assert!(
            !Path::new("/run/netns")
                .join(format!("dpufs-ut-a{tag}"))
                .exists()
        );
    }
}
