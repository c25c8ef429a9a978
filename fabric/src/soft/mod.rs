//! The software provider: a software RDMA device with the NIC's checks.
//!
//! One device per node: a table file under the device directory that every process opening the
//! device maps (module `table`), so all protection domains and processes on the node share one
//! key index space, as they share one HCA. Each [`SoftDevice`] is one device context (one open,
//! like `ibv_open_device`). Registered memory lives in files beside the table (module `memory`)
//! so a responder can reach any registered page of its node, as DMA can. QPs are reliable
//! connected over TCP between nodes and over unix sockets within one (modules `cm`, `channel`,
//! `wire`); between two contexts of one device, payloads move by one copy between the
//! registered buffers, the way a NIC loops such a transfer back; the responder of each QP runs
//! the NIC's checks ([`crate::checks`]) in a thread of the process that owns the QP (module
//! `responder`), and responses to a QP's own requests are processed by its completion thread or
//! by a caller waiting on its send CQ (module `requester`).
//!
//! Not modelled: UC/UD/XRC/DC transports, atomics, type-1 windows, SRQs, fast-reg MRs,
//! `rereg_mr`, CQ overrun, per-packet re-checks of a READ in flight (step 7 of docs/fabric.md,
//! "The responder's checks"), and RNR limits (a SEND waits for a receive, as with
//! `rnr_retry = 7`).

mod channel;
pub(crate) mod cm;
mod cq;
mod memory;
mod mr;
mod qp;
mod requester;
mod responder;
mod table;
pub(crate) mod wire;

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, UdpSocket};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};
use std::time::Duration;

pub use cq::SoftCq;
pub use mr::{SoftMr, SoftMw};
pub use qp::SoftQp;

use crate::error::{DeregError, FabricError, Result};
use crate::keys::KeyGen;
use crate::provider::RdmaDevice;
use crate::verbs::{Access, AsyncEvent, DeviceCounters, QpCaps};
use crate::{NicChecks, checks::ObjectKind};
use memory::Memory;
use table::{DeviceTable, Geometry};

/// Environment variable naming NIC checks to switch off (comma-separated, see
/// [`NicChecks`]'s names). **Test-only**, and only in builds with the cargo feature `testing`:
/// it exists so the conformance suite can prove every check necessary. Whenever it disables
/// anything, opening the device says so on stderr. Without the feature nothing reads it.
#[cfg(feature = "testing")]
pub const DISABLE_CHECKS_ENV: &str = "DPUFS_FABRIC_DISABLE_CHECKS";

/// Environment variable overriding the default device directory.
pub const DEVICE_DIR_ENV: &str = "DPUFS_FABRIC_DIR";

/// Environment variable setting [`DeviceOptions::responder_poll`] in microseconds (for nodes
/// whose fabric processes have cores to themselves, such as a DPU's).
pub const RESPONDER_POLL_ENV: &str = "DPUFS_FABRIC_RESPONDER_POLL_US";

/// Default device directory: shared memory, so the table and registered buffers never touch disk.
pub const DEFAULT_DEVICE_DIR: &str = "/dev/shm/dpufs-fabric";

/// How to open (and, for the first opener, create) a software device.
#[derive(Clone, Debug)]
pub struct DeviceOptions {
    /// Directory holding the device files (`$DPUFS_FABRIC_DIR` or [`DEFAULT_DEVICE_DIR`]).
    pub dir: PathBuf,
    /// Device name: one per node, shared by every process on it.
    pub name: String,
    /// Key index space size, when creating the device (at most 2²⁴).
    pub table_entries: u32,
    /// Key generator, when creating the device.
    pub key_gen: KeyGen,
    /// **Test-only** (feature `testing`). Checks this context's responders skip (added to
    /// those recorded in the device and to [`DISABLE_CHECKS_ENV`]); recorded in the device
    /// when this open creates it.
    #[cfg(feature = "testing")]
    pub disabled_checks: NicChecks,
    /// Address QPs of this context accept connections on (TCP; port 0 picks one).
    pub listen: SocketAddr,
    /// How long this context's responders keep looking for the next request before they
    /// sleep (`$DPUFS_FABRIC_RESPONDER_POLL_US`; zero, the default: sleep at once). A NIC
    /// never sleeps; a software responder that sleeps must be woken for the next request,
    /// which on a VM costs about half a 4 KiB round trip. Polling buys that back with up to this much CPU after every request, so it pays
    /// where the responder has cores to itself (a DPU's) and costs where the application
    /// needs them: on a 2-core machine it halves the data path's 4 KiB random reads
    /// (docs/benchmarks.md §Fabric).
    pub responder_poll: Duration,
}

impl DeviceOptions {
    /// Defaults for device `name`: 64Ki keys, mlx5-like keys, all checks on, loopback listener.
    pub fn new(name: impl Into<String>) -> DeviceOptions {
        DeviceOptions {
            dir: std::env::var_os(DEVICE_DIR_ENV)
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from(DEFAULT_DEVICE_DIR)),
            name: name.into(),
            table_entries: 1 << 16,
            key_gen: KeyGen::default(),
            #[cfg(feature = "testing")]
            disabled_checks: NicChecks::NONE,
            listen: SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
            responder_poll: responder_poll_from_env(),
        }
    }

    /// Same options in another directory.
    pub fn in_dir(mut self, dir: impl Into<PathBuf>) -> DeviceOptions {
        self.dir = dir.into();
        self
    }

    /// Same options, QPs accepting connections on `ip` (any port). A QP's endpoint names this
    /// address, and a peer on another node connects back to it when its QP goes RTS: it must
    /// be an address that peer reaches, not the loopback default.
    pub fn listening_on(mut self, ip: IpAddr) -> DeviceOptions {
        self.listen = SocketAddr::new(ip, 0);
        self
    }

    /// Same options, QPs accepting connections on this machine's address on its route to
    /// `peer`: the source address the kernel gives a connection to `peer`, so the peer can
    /// connect back over the same network (loopback for a peer on loopback).
    pub fn facing(self, peer: SocketAddr) -> Result<DeviceOptions> {
        let any: IpAddr = match peer {
            SocketAddr::V4(_) => Ipv4Addr::UNSPECIFIED.into(),
            SocketAddr::V6(_) => Ipv6Addr::UNSPECIFIED.into(),
        };
        let route =
            |e| FabricError::io(format!("finding this machine's address towards {peer}"), e);
        // Connecting a UDP socket sends nothing: it only picks the route and the source address.
        let probe = UdpSocket::bind((any, 0)).map_err(route)?;
        probe.connect(peer).map_err(route)?;
        let local = probe.local_addr().map_err(route)?;
        Ok(self.listening_on(local.ip()))
    }
}

/// `$DPUFS_FABRIC_RESPONDER_POLL_US`, or zero. A value that is not a number of microseconds
/// is reported and ignored rather than guessed at.
fn responder_poll_from_env() -> Duration {
    let Ok(v) = std::env::var(RESPONDER_POLL_ENV) else {
        return Duration::ZERO;
    };
    match v.trim().parse() {
        Ok(us) => Duration::from_micros(us),
        Err(_) => {
            tracing::warn!("{RESPONDER_POLL_ENV}={v:?} is not a number of microseconds; ignored");
            Duration::ZERO
        }
    }
}

/// A protection domain: a device-wide id, valid only in the context that allocated it.
#[derive(Debug)]
pub struct SoftPd {
    ctx: u64,
    id: u32,
}

/// An opened software device (one device context). Cloning shares the context.
#[derive(Clone, Debug)]
pub struct SoftDevice {
    ctx: Arc<Context>,
}

/// Process-unique id of each context, to refuse objects of another context or device.
static NEXT_CONTEXT_UID: AtomicU64 = AtomicU64::new(1);

/// Everything one device open owns.
#[derive(Debug)]
pub(crate) struct Context {
    pub table: DeviceTable,
    /// Context id in the device (its slot).
    pub id: u32,
    /// Process-unique id.
    pub uid: u64,
    /// Checks this context's responders make (see [`Context::checks`]).
    #[cfg(feature = "testing")]
    checks: NicChecks,
    pub key_gen: KeyGen,
    pub mem_dir: PathBuf,
    /// Registered memory by id: this context's own buffers, plus buffers of other contexts a
    /// responder mapped (reachable only with checks switched off).
    memory: RwLock<HashMap<u64, (Arc<Memory>, bool)>>,
    pub qps: Arc<cm::QpRegistry>,
    events: Mutex<VecDeque<AsyncEvent>>,
    pub listen_addr: SocketAddr,
    /// See [`DeviceOptions::responder_poll`].
    pub responder_poll: Duration,
    /// Where same-device peers find this device's contexts (see [`cm::local_socket`]).
    pub qp_dir: PathBuf,
    /// TCP, and the same-device socket unless it could not be bound.
    listeners: Vec<cm::Listener>,
}

/// Foreign mappings kept before the cache is emptied.
const FOREIGN_MAPPINGS: usize = 64;

/// Locks a mutex, ignoring poisoning: every critical section here leaves its data consistent
/// before anything that could panic.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl SoftDevice {
    /// Opens device `opts.name` in `opts.dir`, creating it if this is the first open on the node.
    pub fn open(opts: &DeviceOptions) -> Result<SoftDevice> {
        std::fs::create_dir_all(&opts.dir)
            .map_err(|e| FabricError::io(format!("create {}", opts.dir.display()), e))?;
        let switches = Switches::read(opts)?;
        let path = opts.dir.join(&opts.name);
        let table = DeviceTable::open(
            &path,
            Geometry {
                entries: opts.table_entries,
                key_gen: opts.key_gen,
                disabled_checks: switches.to_record(),
            },
        )?;
        #[cfg_attr(not(feature = "testing"), allow(unused_variables))]
        let checks = switches.checks(&table, &path);
        let mem_dir = opts.dir.join(format!("{}.mem", opts.name));
        std::fs::create_dir_all(&mem_dir)
            .map_err(|e| FabricError::io(format!("create {}", mem_dir.display()), e))?;
        let qp_dir = opts.dir.join(format!("{}.qp", opts.name));
        reap_dead_contexts(&table, &mem_dir, &qp_dir);
        let id = table.register_context(std::process::id())?;
        let listener = TcpListener::bind(opts.listen)
            .map_err(|e| FabricError::io(format!("listen on {}", opts.listen), e))?;
        let listen_addr = listener
            .local_addr()
            .map_err(|e| FabricError::io("listener address", e))?;
        let mut listeners = vec![cm::Listener::Tcp(listener)];
        match cm::Listener::local(&qp_dir, id) {
            Ok(l) => listeners.push(l),
            // Same-device peers then connect over TCP, which always works.
            Err(e) => tracing::warn!(dir = %qp_dir.display(), error = %e, "no same-device socket"),
        }
        let qps = Arc::new(cm::QpRegistry::default());
        let ctx = Arc::new(Context {
            key_gen: table.key_gen(),
            table,
            id,
            uid: NEXT_CONTEXT_UID.fetch_add(1, Ordering::Relaxed),
            #[cfg(feature = "testing")]
            checks,
            mem_dir,
            memory: RwLock::new(HashMap::new()),
            qps: qps.clone(),
            events: Mutex::new(VecDeque::new()),
            listen_addr,
            responder_poll: opts.responder_poll,
            qp_dir,
            listeners,
        });
        for l in &ctx.listeners {
            let accept = l
                .try_clone()
                .map_err(|e| FabricError::io("clone listener", e))?;
            cm::spawn_listener(accept, qps.clone())
                .map_err(|e| FabricError::io("spawn listener", e))?;
        }
        Ok(SoftDevice { ctx })
    }

    /// Checks this context's responders make: all of them, except in a test build (feature
    /// `testing`) told otherwise.
    pub fn enabled_checks(&self) -> NicChecks {
        self.ctx.checks()
    }

    /// Key generator of the device.
    pub fn key_gen(&self) -> KeyGen {
        self.ctx.key_gen
    }

    fn check_pd(&self, pd: &SoftPd) -> Result<u32> {
        if pd.ctx == self.ctx.uid {
            Ok(pd.id)
        } else {
            Err(FabricError::InvalidArgument(
                "protection domain of another device context".into(),
            ))
        }
    }
}

impl Context {
    /// Checks this context's responders make (test build: as the switches said).
    #[cfg(feature = "testing")]
    #[inline]
    pub fn checks(&self) -> NicChecks {
        self.checks
    }

    /// Checks this context's responders make: without the feature `testing`, the constant
    /// [`NicChecks::ALL`], so no responder check can be switched off at all.
    #[cfg(not(feature = "testing"))]
    #[inline]
    pub fn checks(&self) -> NicChecks {
        NicChecks::ALL
    }

    /// Memory registered as `mem_id`: this context's own, or (with checks off) another context's
    /// buffer on the same device, mapped on demand.
    pub fn memory(&self, mem_id: u64) -> Option<Arc<Memory>> {
        let read = self.memory.read().unwrap_or_else(PoisonError::into_inner);
        if let Some((mem, _)) = read.get(&mem_id) {
            return Some(mem.clone());
        }
        drop(read);
        let mem = Arc::new(Memory::open(&self.mem_dir, mem_id).ok()?);
        let mut map = self.memory.write().unwrap_or_else(PoisonError::into_inner);
        if map.values().filter(|(_, own)| !own).count() >= FOREIGN_MAPPINGS {
            map.retain(|_, (_, own)| *own);
        }
        map.insert(mem_id, (mem.clone(), false));
        Some(mem)
    }

    fn add_memory(&self, mem_id: u64, mem: Arc<Memory>) {
        self.memory
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(mem_id, (mem, true));
    }

    fn remove_memory(&self, mem_id: u64) {
        self.memory
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&mem_id);
    }

    /// Queues an asynchronous event.
    pub fn post_event(&self, event: AsyncEvent) {
        lock(&self.events).push_back(event);
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // Every object holds the context, so nothing of ours should be left; free whatever is
        // (e.g. after a panic) so the indexes return to the device.
        for index in self.table.owned_by(self.id) {
            self.table.free(index);
        }
        self.table.release_context(self.id);
        self.qps.close();
        for l in &self.listeners {
            l.shut();
        }
    }
}

/// The test-only check switches of a device open: the options' and the environment's, and
/// those recorded in the device file by the test that created it (feature `testing`).
#[cfg(feature = "testing")]
struct Switches {
    options: NicChecks,
    env: NicChecks,
}

#[cfg(feature = "testing")]
impl Switches {
    /// The options' switches and [`DISABLE_CHECKS_ENV`]'s (an unknown name is an error).
    fn read(opts: &DeviceOptions) -> Result<Switches> {
        let env = match std::env::var(DISABLE_CHECKS_ENV) {
            Ok(v) => v
                .parse::<NicChecks>()
                .map_err(FabricError::InvalidArgument)?,
            Err(_) => NicChecks::NONE,
        };
        Ok(Switches {
            options: opts.disabled_checks,
            env,
        })
    }

    /// What a device this open creates records (the options', not the environment's).
    fn to_record(&self) -> NicChecks {
        self.options
    }

    /// The checks the context's responders make; says so loudly if any is off.
    fn checks(&self, table: &DeviceTable, path: &Path) -> NicChecks {
        let disabled = table.disabled_checks().union(self.options).union(self.env);
        if !disabled.is_empty() {
            // Loud on purpose: a device with checks off gives no isolation at all. Both
            // channels, so it shows with or without a tracing subscriber.
            eprintln!(
                "dpufs-fabric: WARNING: NIC checks DISABLED on device {} ({disabled}); \
                 test-only setting, no isolation",
                path.display()
            );
            tracing::error!(device = %path.display(), checks = %disabled, "NIC checks disabled (test-only)");
        }
        NicChecks::ALL.without(disabled)
    }
}

/// Without the feature `testing` there are no switches: nothing is read from the
/// environment, nothing recorded, and a switch a test build recorded in the device file is
/// ignored (every responder of this build makes every check).
#[cfg(not(feature = "testing"))]
struct Switches;

#[cfg(not(feature = "testing"))]
impl Switches {
    fn read(_: &DeviceOptions) -> Result<Switches> {
        Ok(Switches)
    }

    fn to_record(&self) -> NicChecks {
        NicChecks::NONE
    }

    fn checks(&self, table: &DeviceTable, path: &Path) -> NicChecks {
        let recorded = table.disabled_checks();
        if !recorded.is_empty() {
            tracing::warn!(
                device = %path.display(),
                checks = %recorded,
                "device created by a test build with NIC checks off; ignored, this build makes every check"
            );
        }
        NicChecks::ALL
    }
}

/// Frees the entries and buffers of contexts whose process died without closing the device,
/// as the kernel cleans up after a process that held an HCA context.
fn reap_dead_contexts(table: &DeviceTable, mem_dir: &Path, qp_dir: &Path) {
    let alive = |pid: u32| {
        // SAFETY: kill with signal 0 only checks whether the process exists.
        let rc = unsafe { libc::kill(pid as libc::pid_t, 0) };
        rc == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
    };
    for (ctx, pid) in table.dead_contexts(alive) {
        if !table.claim_dead_context(ctx, pid) {
            continue;
        }
        for index in table.owned_by(ctx) {
            table.force_unlock(index);
            if let Some(f) = table.read(index)
                && f.kind == Some(ObjectKind::Mr)
            {
                let _ = std::fs::remove_file(mem_dir.join(f.mem_id.to_string()));
            }
            table.free(index);
        }
        let _ = std::fs::remove_file(cm::local_socket(qp_dir, ctx));
        table.release_context(ctx);
        tracing::info!(ctx, pid, "reaped device context of a dead process");
    }
}

impl RdmaDevice for SoftDevice {
    type Pd = SoftPd;
    type Mr = SoftMr;
    type Mw = SoftMw;
    type Cq = SoftCq;
    type Qp = SoftQp;

    fn alloc_pd(&self) -> Result<SoftPd> {
        Ok(SoftPd {
            ctx: self.ctx.uid,
            id: self.ctx.table.new_pd_id(),
        })
    }

    fn reg_mr(&self, pd: &SoftPd, len: usize, access: Access) -> Result<SoftMr> {
        let pd = self.check_pd(pd)?;
        SoftMr::register(&self.ctx, pd, len, access)
    }

    fn dereg_mr(&self, mr: SoftMr) -> std::result::Result<(), DeregError<SoftMr>> {
        mr.deregister()
    }

    fn alloc_mw(&self, pd: &SoftPd) -> Result<SoftMw> {
        let pd = self.check_pd(pd)?;
        SoftMw::allocate(&self.ctx, pd)
    }

    fn dealloc_mw(&self, mw: SoftMw) -> Result<()> {
        drop(mw);
        Ok(())
    }

    fn create_cq(&self, depth: u32) -> Result<SoftCq> {
        Ok(SoftCq::new(depth))
    }

    fn create_qp(
        &self,
        pd: &SoftPd,
        send_cq: &SoftCq,
        recv_cq: &SoftCq,
        caps: QpCaps,
    ) -> Result<SoftQp> {
        let pd = self.check_pd(pd)?;
        Ok(SoftQp::create(&self.ctx, pd, send_cq, recv_cq, caps))
    }

    fn poll_async_event(&self) -> Option<AsyncEvent> {
        lock(&self.ctx.events).pop_front()
    }

    fn counters(&self) -> DeviceCounters {
        self.ctx.table.counters()
    }
}
