//! A simulated disk for tests: it remembers what was synced, so a "crash" can throw away
//! everything that was not — which is how the durability tests prove every acknowledged fsync
//! reaches the disk. It can also hold, fail or panic in data-file writes, to show who waits
//! for a queued write and what a failed one does.

use super::disk::{Disk, DiskFile};
use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// Contents of one simulated file: what the page cache holds, and what
/// the last sync made durable.
#[derive(Debug, Default)]
struct SimContents {
    volatile: Vec<u8>,
    durable: Vec<u8>,
}

/// A simulated disk. `crash()` returns the disk as it would be found
/// after power loss: every file reverted to its last synced contents.
#[derive(Debug, Default, Clone)]
pub struct SimDisk {
    files: Arc<Mutex<BTreeMap<PathBuf, Arc<Mutex<SimContents>>>>>,
    switch: Arc<WriteSwitch>,
}

/// What a test does to the writes of data files (not of the metadata store, `*.redb`):
/// hold them (to see who waits for a write still queued), fail them, or panic in them.
#[derive(Debug, Default)]
struct WriteSwitch {
    state: Mutex<SwitchState>,
    released: std::sync::Condvar,
    /// Syncs of data files so far.
    syncs: std::sync::atomic::AtomicU64,
    /// Data files opened or sized so far (each an `open` or `stat` on a real disk).
    probes: std::sync::atomic::AtomicU64,
}

#[derive(Debug, Default)]
struct SwitchState {
    held: bool,
    failing: bool,
    panicking: bool,
    /// Syncs of data files fail with EIO (and make nothing durable).
    failing_syncs: bool,
}

impl WriteSwitch {
    fn count_probe(&self) {
        self.probes
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// Waits while writes are held; EIO while they fail; panics while they panic.
    fn pass(&self) -> io::Result<()> {
        let st = self.state.lock().expect("write switch");
        let st = self
            .released
            .wait_while(st, |s| s.held)
            .expect("write switch");
        if st.panicking {
            drop(st);
            panic!("simulated panic in a data-file write");
        }
        match st.failing {
            true => Err(io::Error::from_raw_os_error(libc::EIO)),
            false => Ok(()),
        }
    }
}

#[derive(Debug)]
struct SimFile(Arc<Mutex<SimContents>>, Option<Arc<WriteSwitch>>);

impl DiskFile for SimFile {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        let c = self.0.lock().expect("sim file");
        let start = (offset as usize).min(c.volatile.len());
        let n = buf.len().min(c.volatile.len() - start);
        buf[..n].copy_from_slice(&c.volatile[start..start + n]);
        Ok(n)
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        if let Some(switch) = &self.1 {
            switch.pass()?;
        }
        let mut c = self.0.lock().expect("sim file");
        let end = offset as usize + data.len();
        if c.volatile.len() < end {
            c.volatile.resize(end, 0);
        }
        c.volatile[offset as usize..end].copy_from_slice(data);
        Ok(())
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.0
            .lock()
            .expect("sim file")
            .volatile
            .resize(len as usize, 0);
        Ok(())
    }
    fn allocate(&self, offset: u64, len: u64) -> io::Result<()> {
        let mut c = self.0.lock().expect("sim file");
        let end = (offset + len) as usize;
        if c.volatile.len() < end {
            c.volatile.resize(end, 0);
        }
        Ok(())
    }
    fn size(&self) -> io::Result<u64> {
        Ok(self.0.lock().expect("sim file").volatile.len() as u64)
    }
    fn sync(&self) -> io::Result<()> {
        if let Some(switch) = &self.1 {
            switch
                .syncs
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if switch.state.lock().expect("write switch").failing_syncs {
                return Err(io::Error::from_raw_os_error(libc::EIO));
            }
        }
        let mut c = self.0.lock().expect("sim file");
        c.durable = c.volatile.clone();
        Ok(())
    }
}

impl SimDisk {
    /// How many times a data file (not the metadata store) was synced.
    pub fn data_file_syncs(&self) -> u64 {
        self.switch.syncs.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// How many times a data file was opened or sized, found or not.
    pub fn data_file_probes(&self) -> u64 {
        self.switch
            .probes
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Holds every file write until released (`false`).
    pub fn hold_writes(&self, held: bool) {
        self.switch.state.lock().expect("write switch").held = held;
        self.switch.released.notify_all();
    }

    /// Fails every file write with EIO until turned off.
    pub fn fail_writes(&self, failing: bool) {
        self.switch.state.lock().expect("write switch").failing = failing;
    }

    /// Panics in every file write until turned off (a bug in the write path).
    pub fn fail_syncs(&self, failing: bool) {
        self.switch
            .state
            .lock()
            .expect("write switch")
            .failing_syncs = failing;
    }

    pub fn panic_in_writes(&self, panicking: bool) {
        self.switch.state.lock().expect("write switch").panicking = panicking;
    }

    /// The disk after a power loss: unsynced bytes are gone.
    pub fn crash(&self) -> SimDisk {
        let files = self.files.lock().expect("sim disk");
        let survived = files
            .iter()
            .map(|(p, c)| {
                let durable = c.lock().expect("sim file").durable.clone();
                (
                    p.clone(),
                    Arc::new(Mutex::new(SimContents {
                        volatile: durable.clone(),
                        durable,
                    })),
                )
            })
            .collect();
        SimDisk {
            files: Arc::new(Mutex::new(survived)),
            switch: Arc::default(),
        }
    }
}

impl Disk for SimDisk {
    fn open(&self, path: &Path, create: bool) -> io::Result<Arc<dyn DiskFile>> {
        let switch = (path.extension() != Some("redb".as_ref())).then(|| self.switch.clone());
        if let Some(switch) = &switch {
            switch.count_probe();
        }
        let mut files = self.files.lock().expect("sim disk");
        match files.get(path) {
            Some(c) => Ok(Arc::new(SimFile(c.clone(), switch))),
            None if create => {
                let c = Arc::new(Mutex::new(SimContents::default()));
                files.insert(path.to_path_buf(), c.clone());
                Ok(Arc::new(SimFile(c, switch)))
            }
            None => Err(io::ErrorKind::NotFound.into()),
        }
    }
    fn remove(&self, path: &Path) -> io::Result<()> {
        self.files.lock().expect("sim disk").remove(path);
        Ok(())
    }
    fn remove_tree(&self, path: &Path) -> io::Result<()> {
        self.files
            .lock()
            .expect("sim disk")
            .retain(|p, _| !p.starts_with(path));
        Ok(())
    }
    fn link(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut files = self.files.lock().expect("sim disk");
        let c = files.get(from).cloned().ok_or(io::ErrorKind::NotFound)?;
        files.insert(to.to_path_buf(), c);
        Ok(())
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut files = self.files.lock().expect("sim disk");
        let c = files.remove(from).ok_or(io::ErrorKind::NotFound)?;
        files.insert(to.to_path_buf(), c);
        Ok(())
    }
    fn is_shared(&self, path: &Path) -> io::Result<bool> {
        let files = self.files.lock().expect("sim disk");
        let c = files.get(path).ok_or(io::ErrorKind::NotFound)?;
        Ok(files.values().filter(|o| Arc::ptr_eq(o, c)).count() > 1)
    }
    fn size_of(&self, path: &Path) -> io::Result<Option<u64>> {
        self.switch.count_probe();
        let files = self.files.lock().expect("sim disk");
        Ok(files
            .get(path)
            .map(|c| c.lock().expect("sim file").volatile.len() as u64))
    }
    fn list(&self, dir: &Path) -> io::Result<Vec<PathBuf>> {
        let files = self.files.lock().expect("sim disk");
        Ok(files
            .keys()
            .filter(|p| p.parent() == Some(dir))
            .cloned()
            .collect())
    }
    /// The simulation keeps names durable from creation (it models file contents,
    /// not directory entries), so there is nothing to do.
    fn sync_dir(&self, _dir: &Path) -> io::Result<()> {
        Ok(())
    }
}
