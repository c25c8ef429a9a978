use super::*;
use crate::dfs::transport::TransportReply;
use crate::dfs::{Dfs, DfsError, Errno, XATTR_VALUE_MAX, XattrMode};
use std::sync::atomic::{AtomicU64, AtomicUsize};
use std::time::Duration;

/// One file in memory behind a fake data service, counting requests in flight.
#[derive(Debug, Default)]
struct FakeEngine {
    file: Mutex<Vec<u8>>,
    in_flight: AtomicUsize,
    most_in_flight: AtomicUsize,
    requests: AtomicUsize,
    fail_with: Mutex<Option<DfsError>>,
    wrong_id: std::sync::atomic::AtomicBool,
    /// What the fake offers at mount as `max_inline`.
    max_inline: usize,
    /// Reads and writes that came inline (no bulk).
    inline_calls: AtomicUsize,
    /// The write verifier of every reply: a test changes it to restart the engine.
    verifier: AtomicU64,
    /// Syncfs requests served.
    syncfs_calls: AtomicUsize,
    /// The engine restarts just before it serves the next Syncfs.
    restart_at_syncfs: std::sync::atomic::AtomicBool,
}

const MAX_IO: usize = 1000;

impl DfsTransport for FakeEngine {
    fn call(&self, request: &[u8], bulk: Bulk<'_>) -> DfsResult<TransportReply> {
        if let Some(e) = self.fail_with.lock().unwrap().clone() {
            return Err(e);
        }
        self.requests.fetch_add(1, Ordering::SeqCst);
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.most_in_flight.fetch_max(now, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(5));
        let req = proto::DfsRequest::decode(request).unwrap();
        let mut reply = proto::DfsReply {
            id: if self.wrong_id.load(Ordering::SeqCst) {
                0
            } else {
                req.id
            },
            verifier: self.verifier.load(Ordering::SeqCst),
            ..Default::default()
        };
        let mut moved = 0;
        match (req.op.unwrap(), bulk) {
            (Op::Mount(_), _) => {
                reply.result = Some(Res::Mount(proto::MountInfo {
                    root: ROOT_OID,
                    chunk_size: 4096,
                    read_only: false,
                    max_io: MAX_IO as u32,
                    max_inline: self.max_inline as u32,
                }))
            }
            (Op::Read(r), Bulk::None) if r.inline => {
                self.inline_calls.fetch_add(1, Ordering::SeqCst);
                let file = self.file.lock().unwrap();
                let start = (r.offset as usize).min(file.len());
                let end = (start + r.len as usize).min(file.len());
                reply.result = Some(Res::Data(file[start..end].to_vec()));
            }
            (Op::Write(w), Bulk::None) if !w.data.is_empty() => {
                self.inline_calls.fetch_add(1, Ordering::SeqCst);
                assert_eq!(w.len as usize, w.data.len());
                self.store(w.offset as usize, &w.data);
                reply.result = Some(Res::Bytes(w.len));
            }
            (Op::Read(r), Bulk::FromServer(buf)) => {
                assert!(r.len as usize <= MAX_IO && r.len as usize == buf.len());
                let file = self.file.lock().unwrap();
                let start = (r.offset as usize).min(file.len());
                let n = buf.len().min(file.len() - start);
                buf[..n].copy_from_slice(&file[start..start + n]);
                moved = n;
                reply.result = Some(Res::Bytes(n as u32));
            }
            (Op::Write(w), Bulk::ToServer(data)) => {
                assert!(w.len as usize <= MAX_IO && w.len as usize == data.len());
                assert!(w.data.is_empty(), "inline bytes and a bulk buffer");
                self.store(w.offset as usize, data);
                moved = data.len();
                reply.result = Some(Res::Bytes(data.len() as u32));
            }
            (Op::Fsync(_), _) => {}
            (Op::Syncfs(_), _) => {
                self.syncfs_calls.fetch_add(1, Ordering::SeqCst);
                if self.restart_at_syncfs.swap(false, Ordering::SeqCst) {
                    reply.verifier = self.verifier.fetch_add(1, Ordering::SeqCst) + 1;
                }
            }
            (Op::Getattr(_), _) => {
                reply.errno = libc::ENOENT;
                reply.detail = "no such object".into();
            }
            (op, _) => panic!("unexpected {op:?}"),
        }
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        Ok(TransportReply {
            message: reply.encode_to_vec(),
            bulk_bytes: moved,
        })
    }
}

impl FakeEngine {
    fn store(&self, offset: usize, data: &[u8]) {
        let mut file = self.file.lock().unwrap();
        let end = offset + data.len();
        if file.len() < end {
            file.resize(end, 0);
        }
        file[offset..end].copy_from_slice(data);
    }
}

fn mounted() -> (Arc<FakeEngine>, EngineDfs) {
    let fake = Arc::new(FakeEngine::default());
    let dfs = EngineDfs::mount(fake.clone()).unwrap();
    (fake, dfs)
}

#[test]
fn pieces_of_a_transfer_near_the_last_offset_stay_there() {
    // Found by the fuzzer: the second piece's offset overflowed.
    let parts = pieces(u64::MAX - 10, 3 * MAX_IO, MAX_IO);
    let offsets: Vec<_> = parts.iter().map(|p| p.file_offset).collect();
    assert_eq!(offsets, [u64::MAX - 10, u64::MAX, u64::MAX]);
    assert!(parts.iter().all(|p| p.len == MAX_IO));
}

#[test]
fn large_transfers_are_split_and_pipelined() {
    let (fake, dfs) = mounted();
    assert_eq!(dfs.mount_info().max_io, MAX_IO);
    let data: Vec<u8> = (0..10_500u32).map(|i| (i % 253) as u8).collect();
    fake.requests.store(0, Ordering::SeqCst);
    dfs.write(ROOT_OID + 1, 7, &data).unwrap();
    assert_eq!(
        fake.requests.load(Ordering::SeqCst),
        11,
        "10.5 pieces of max_io"
    );
    assert!(
        fake.most_in_flight.load(Ordering::SeqCst) > 1,
        "pieces overlap"
    );
    assert!(fake.most_in_flight.load(Ordering::SeqCst) <= DEFAULT_PIPELINE_DEPTH);
    let mut back = vec![0u8; 10_500];
    assert_eq!(dfs.read(ROOT_OID + 1, 7, &mut back).unwrap(), 10_500);
    assert_eq!(back, data);
}

#[test]
fn reads_stop_at_the_end_of_the_file() {
    let (fake, dfs) = mounted();
    fake.file
        .lock()
        .unwrap()
        .extend((0..2500u32).map(|i| i as u8));
    let mut buf = vec![0xAAu8; 5000];
    assert_eq!(dfs.read(2, 100, &mut buf).unwrap(), 2400);
    assert_eq!(buf[0], 100);
    assert_eq!(dfs.read(2, 9000, &mut buf).unwrap(), 0);
}

#[test]
fn depth_one_is_sequential() {
    let fake = Arc::new(FakeEngine::default());
    let dfs = EngineDfs::mount(fake.clone())
        .unwrap()
        .with_pipeline_depth(1);
    dfs.write(2, 0, &[1; 5000]).unwrap();
    assert_eq!(fake.most_in_flight.load(Ordering::SeqCst), 1);
}

#[test]
fn failures_map_to_errnos() {
    let (fake, dfs) = mounted();
    let e = dfs.getattr(5).unwrap_err();
    assert_eq!(
        (e.errno, e.detail.as_str()),
        (Errno::NOENT, "no such object")
    );
    *fake.fail_with.lock().unwrap() = Some(DfsError::new(Errno::TIMEDOUT, "no reply in 5s"));
    assert_eq!(dfs.getattr(5).unwrap_err().errno, Errno::TIMEDOUT);
    *fake.fail_with.lock().unwrap() = Some(DfsError::new(Errno::IO, "QP in error"));
    let e = dfs.read(2, 0, &mut [0; 10]).unwrap_err();
    assert_eq!(e.errno, Errno::IO);
    assert!(e.detail.contains("QP in error"));
    *fake.fail_with.lock().unwrap() = None;
    fake.wrong_id.store(true, Ordering::SeqCst);
    assert_eq!(dfs.read(2, 0, &mut [0; 10]).unwrap_err().errno, Errno::IO);
}

#[test]
fn oversized_xattrs_are_refused_before_sending() {
    let (fake, dfs) = mounted();
    let before = fake.requests.load(Ordering::SeqCst);
    let e = dfs.setxattr(2, "user.x", &vec![0; XATTR_VALUE_MAX + 1], XattrMode::Any);
    assert_eq!(e.unwrap_err().errno, Errno(libc::E2BIG));
    assert_eq!(fake.requests.load(Ordering::SeqCst), before);
}

/// The engine refuses a name outside the user, trusted and security namespaces before it looks
/// at the object (`cp -a` sets `system.posix_acl_access` on every file it copies): the client
/// gives the same answer without the round trip.
#[test]
fn xattr_names_the_engine_refuses_are_refused_before_sending() {
    let (fake, dfs) = mounted();
    let before = fake.requests.load(Ordering::SeqCst);
    let acl = "system.posix_acl_access";
    let refused = [
        dfs.setxattr(2, acl, b"x", XattrMode::Any).unwrap_err(),
        dfs.getxattr(2, acl).unwrap_err(),
        dfs.removexattr(2, acl).unwrap_err(),
    ];
    for e in refused {
        assert_eq!(e.errno, Errno::OPNOTSUPP, "{e}");
    }
    let too_long = "user.".to_string() + &"n".repeat(300);
    assert_eq!(dfs.getxattr(2, &too_long).unwrap_err().errno, Errno::RANGE);
    assert_eq!(fake.requests.load(Ordering::SeqCst), before);
}

#[test]
fn small_transfers_go_inline_when_the_engine_offers_it() {
    let fake = Arc::new(FakeEngine {
        max_inline: 300,
        ..Default::default()
    });
    let dfs = EngineDfs::mount(fake.clone()).unwrap();
    assert_eq!(dfs.mount_info().max_inline, 300);
    dfs.write(2, 10, &[7; 300]).unwrap();
    assert_eq!(fake.inline_calls.load(Ordering::SeqCst), 1);
    // One byte over the limit goes by bulk, as does every piece of a large transfer.
    dfs.write(2, 310, &[8; 301]).unwrap();
    dfs.write(2, 611, &[9; 2500]).unwrap();
    assert_eq!(fake.inline_calls.load(Ordering::SeqCst), 1);
    let mut back = vec![0xAA; 200];
    // The file ends 111 bytes in: a short inline read fills only those.
    assert_eq!(dfs.read(2, 3000, &mut back).unwrap(), 111);
    assert_eq!((back[0], back[110], back[111]), (9, 9, 0xAA));
    assert_eq!(fake.inline_calls.load(Ordering::SeqCst), 2);
    let mut all = vec![0; 3111];
    assert_eq!(dfs.read(2, 0, &mut all).unwrap(), 3111);
    assert_eq!(
        (all[9], all[10], all[309], all[310], all[611]),
        (0, 7, 7, 8, 9)
    );
}

#[test]
fn no_inline_transfers_without_the_engine_offering_them() {
    let (fake, dfs) = mounted();
    dfs.write(2, 0, &[1; 10]).unwrap();
    dfs.read(2, 0, &mut [0; 10]).unwrap();
    assert_eq!(fake.inline_calls.load(Ordering::SeqCst), 0);
}

#[test]
fn a_directory_keeps_the_attributes_of_its_latest_change_until_taken() {
    let dirs = super::ChangedDirs::default();
    let at = |secs, mode| proto::DfsAttr {
        oid: 7,
        mode,
        ctime: Some(proto::DfsTime { secs, nanos: 0 }),
        ..Default::default()
    };
    // Replies to two changes arrive in the opposite order.
    dirs.record(vec![at(20, 0o40755)]);
    dirs.record(vec![at(10, 0o40700)]);
    let (attr, _) = dirs.take(7).expect("recorded");
    assert_eq!((attr.ctime.secs, attr.mode), (20, 0o40755));
    assert!(dirs.take(7).is_none(), "answered once");
    assert!(dirs.take(8).is_none());
}

#[test]
fn an_fsync_fails_once_when_the_engine_that_took_the_writes_restarted() {
    let (fake, dfs) = mounted();
    fake.verifier.store(0x100, Ordering::SeqCst);
    dfs.write(2, 0, &[1; 10]).unwrap();
    dfs.write(3, 0, &[1; 10]).unwrap();
    dfs.fsync(3, false).expect("the same engine: durable");
    fake.verifier.store(0x200, Ordering::SeqCst);
    dfs.write(2, 10, &[2; 10]).unwrap();
    let e = dfs.fsync(2, false).unwrap_err();
    assert_eq!(e.errno, Errno::IO);
    assert!(e.detail.contains("restarted"), "{e:?}");
    dfs.fsync(2, false).expect("reported once");
    dfs.fsync(3, false)
        .expect("object 3 was synced before the restart");
    // A change after the restart is the new engine's.
    dfs.write(3, 0, &[3; 10]).unwrap();
    dfs.fsync(3, true)
        .expect("the new engine's change, synced by it");
}

#[test]
fn a_full_table_of_unsynced_objects_syncs_the_container() {
    let (fake, mut dfs) = mounted();
    dfs.unstable = Unstable::new(2);
    fake.verifier.store(0x100, Ordering::SeqCst);
    dfs.write(2, 0, &[1; 10]).unwrap();
    dfs.write(3, 0, &[1; 10]).unwrap();
    assert_eq!(fake.syncfs_calls.load(Ordering::SeqCst), 0);
    dfs.write(4, 0, &[1; 10]).unwrap();
    assert_eq!(fake.syncfs_calls.load(Ordering::SeqCst), 1);
    // The sync emptied the table: two more objects fit without another.
    dfs.write(5, 0, &[1; 10]).unwrap();
    dfs.write(6, 0, &[1; 10]).unwrap();
    assert_eq!(fake.syncfs_calls.load(Ordering::SeqCst), 1);
    // A restart between a change and the sync it forced fails that change.
    fake.restart_at_syncfs.store(true, Ordering::SeqCst);
    dfs.unstable = Unstable::new(0);
    let e = dfs.write(7, 0, &[1; 10]).unwrap_err();
    assert_eq!(e.errno, Errno::IO);
}
