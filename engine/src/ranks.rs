//! The engine's simulated ranks. Each rank is a real endpoint (its own TCP
//! listener, later the fabric data service) with its own data directory, and
//! can be stopped and started, so that pools really lose and regain targets.

use crate::layout::Layout;
use std::net::{IpAddr, SocketAddr};
use std::sync::Mutex;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// Member state names as DAOS puts them on the wire (its member states' JSON form,
/// lower case), with their `state_mask` bits.
pub const JOINED: (&str, u32) = ("joined", 0x8);
pub const STOPPED: (&str, u32) = ("stopped", 0x20);

/// One rank as SystemQuery reports it.
#[derive(Debug, Clone)]
pub struct Member {
    pub rank: u32,
    pub uuid: String,
    pub incarnation: u64,
    pub joined: bool,
    /// Data-plane endpoint while the rank runs; the last one when stopped.
    pub endpoint: SocketAddr,
    pub last_update_unix: u64,
}

struct RankSlot {
    member: Member,
    listener: Option<JoinHandle<()>>,
}

/// All ranks of this engine.
pub struct RankSet {
    slots: Vec<Mutex<RankSlot>>,
}

impl std::fmt::Debug for RankSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RankSet")
            .field("ranks", &self.slots.len())
            .finish()
    }
}

impl RankSet {
    /// Starts `count` ranks listening on `host`, each with its directory in `layout`.
    pub async fn start(
        count: u32,
        host: IpAddr,
        layout: &Layout,
        system: &str,
    ) -> std::io::Result<RankSet> {
        let mut slots = Vec::new();
        for rank in 0..count {
            std::fs::create_dir_all(layout.rank_dir(rank))?;
            let uuid = uuid::Uuid::new_v5(
                &uuid::Uuid::NAMESPACE_OID,
                format!("{system}/rank/{rank}").as_bytes(),
            );
            let (endpoint, task) = listen(rank, SocketAddr::new(host, 0)).await?;
            slots.push(Mutex::new(RankSlot {
                member: Member {
                    rank,
                    uuid: uuid.to_string(),
                    incarnation: incarnation(),
                    joined: true,
                    endpoint,
                    last_update_unix: crate::records::now_unix(),
                },
                listener: Some(task),
            }));
        }
        Ok(RankSet { slots })
    }

    /// Number of ranks, running or not.
    pub fn count(&self) -> u32 {
        self.slots.len() as u32
    }

    /// Snapshot of every member.
    pub fn members(&self) -> Vec<Member> {
        self.slots.iter().map(|s| lock(s).member.clone()).collect()
    }

    /// Whether `rank` exists and runs.
    pub fn is_joined(&self, rank: u32) -> bool {
        self.slots
            .get(rank as usize)
            .is_some_and(|s| lock(s).member.joined)
    }

    /// Ranks that run now.
    pub fn joined(&self) -> Vec<u32> {
        self.members()
            .into_iter()
            .filter(|m| m.joined)
            .map(|m| m.rank)
            .collect()
    }

    /// Stops a rank: its endpoint closes. Returns None for an unknown rank.
    pub fn stop(&self, rank: u32) -> Option<Member> {
        let mut slot = lock(self.slots.get(rank as usize)?);
        if let Some(task) = slot.listener.take() {
            task.abort();
        }
        slot.member.joined = false;
        slot.member.last_update_unix = crate::records::now_unix();
        Some(slot.member.clone())
    }

    /// Starts a stopped rank on its previous endpoint if it is still free.
    pub async fn start_rank(&self, rank: u32) -> std::io::Result<Option<Member>> {
        let Some(cell) = self.slots.get(rank as usize) else {
            return Ok(None);
        };
        let previous = {
            let slot = lock(cell);
            if slot.member.joined {
                return Ok(Some(slot.member.clone()));
            }
            slot.member.endpoint
        };
        let (endpoint, task) = match listen(rank, previous).await {
            Ok(bound) => bound,
            Err(_) => listen(rank, SocketAddr::new(previous.ip(), 0)).await?,
        };
        let mut slot = lock(cell);
        slot.listener = Some(task);
        slot.member.joined = true;
        slot.member.endpoint = endpoint;
        slot.member.incarnation = incarnation();
        slot.member.last_update_unix = crate::records::now_unix();
        Ok(Some(slot.member.clone()))
    }
}

impl Drop for RankSet {
    fn drop(&mut self) {
        for slot in &self.slots {
            if let Some(task) = lock(slot).listener.take() {
                task.abort();
            }
        }
    }
}

fn lock(slot: &Mutex<RankSlot>) -> std::sync::MutexGuard<'_, RankSlot> {
    slot.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn incarnation() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64)
}

/// Binds the rank's endpoint. Until the fabric data service arrives it greets
/// each connection with `dpufs-rank <rank>` so that liveness can be probed.
async fn listen(rank: u32, addr: SocketAddr) -> std::io::Result<(SocketAddr, JoinHandle<()>)> {
    let listener = TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    let task = tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let _ = conn
                .write_all(format!("dpufs-rank {rank}\n").as_bytes())
                .await;
        }
    });
    Ok((local, task))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    async fn greet(addr: SocketAddr) -> std::io::Result<String> {
        let mut conn = tokio::net::TcpStream::connect(addr).await?;
        let mut s = String::new();
        conn.read_to_string(&mut s).await?;
        Ok(s)
    }

    #[tokio::test]
    async fn stopped_ranks_close_their_endpoint() {
        let dir = tempfile::tempdir().unwrap();
        let layout = Layout::new(dir.path().into());
        let ranks = RankSet::start(2, "127.0.0.1".parse().unwrap(), &layout, "t")
            .await
            .unwrap();
        let m1 = ranks.members()[1].clone();
        assert_eq!(greet(m1.endpoint).await.unwrap(), "dpufs-rank 1\n");
        ranks.stop(1).unwrap();
        tokio::task::yield_now().await;
        assert!(greet(m1.endpoint).await.is_err(), "endpoint still answers");
        assert_eq!(ranks.joined(), vec![0]);
        let back = ranks.start_rank(1).await.unwrap().unwrap();
        assert!(back.incarnation > m1.incarnation);
        assert_eq!(greet(back.endpoint).await.unwrap(), "dpufs-rank 1\n");
        assert!(ranks.stop(7).is_none());
    }
}
