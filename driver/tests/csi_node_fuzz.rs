//! Thousands of random and malformed volume ids and paths to the CSI Node service and the
//! Controller's id-taking RPCs, on the real processes of the CSI bed.

mod common;

use common::can_mount;
use common::csi_bed::bed;
use dpufs_e2e::csi_bed::{MIB, cap};
use dpufs_proto::csi::v1::volume_capability::access_mode;
use dpufs_proto::csi::v1::{self as csi};
use std::collections::HashMap;
use std::path::Path;
use tonic::Code;

/// Deterministic pseudo-random numbers (xorshift).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn pick<'a>(&mut self, from: &[&'a str]) -> &'a str {
        from[(self.next() % from.len() as u64) as usize]
    }

    /// A string of up to `max` characters drawn from ids' and paths' own alphabet and beyond.
    fn text(&mut self, max: usize) -> String {
        const PIECES: &[&str] = &[
            "v1",
            "/",
            "daos_server",
            "-",
            "0",
            "f",
            "..",
            ".",
            "\0",
            "é",
            "🦀",
            " ",
            "\n",
            "%2F",
            "v2",
            "6f1c2d1e",
            "x",
        ];
        let n = (self.next() % max as u64) as usize;
        (0..n).map(|_| self.pick(PIECES)).collect()
    }

    /// A volume id: random, or a real one with one piece changed.
    fn volume_id(&mut self, real: &str) -> String {
        match self.next() % 4 {
            0 => self.text(40),
            1 => {
                let mut s = real.to_string();
                let at = (self.next() % s.len() as u64) as usize;
                s.replace_range(at..=at, self.pick(&["/", "", "Z", "-", "\0", "0"]));
                s
            }
            2 => format!(
                "v1/{}/{}/{}",
                self.text(20),
                uuid::Uuid::new_v4(),
                self.text(10)
            ),
            _ => format!(
                "v1/daos_server/{}/{}",
                uuid::Uuid::new_v4(),
                uuid::Uuid::new_v4()
            ),
        }
    }

    /// A path: relative, with `..`, a real system path, or a made-up one under `base`.
    fn path(&mut self, base: &Path) -> String {
        match self.next() % 5 {
            0 => self.text(30),
            1 => format!("{}/../{}", base.display(), self.text(8)),
            2 => self
                .pick(&["/", "/proc", "/sys", "/tmp", "/dev", "/etc/passwd"])
                .to_string(),
            3 => base
                .join(self.text(12).replace('\0', ""))
                .display()
                .to_string(),
            _ => format!("/{}", "d".repeat((self.next() % 5000) as usize)),
        }
    }
}

/// Thousands of random and malformed volume ids and paths, to every Node RPC and the
/// Controller's id-taking RPCs: each gets a code that says what is wrong with the request
/// (or OK for an idempotent no-op), never INTERNAL, UNKNOWN or a dead plugin; and nothing
/// outside the bed was unmounted or removed.
#[tokio::test(flavor = "multi_thread")]
async fn random_ids_and_paths_get_client_codes_and_touch_nothing() {
    if !can_mount() {
        return;
    }
    let bed = bed().await;
    let real = bed.create("pvc-5", "ns-a").await.volume_id;
    let mounts_before = std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .count();
    let allowed = [
        Code::Ok,
        Code::InvalidArgument,
        Code::NotFound,
        Code::FailedPrecondition,
    ];
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut seen: HashMap<String, usize> = HashMap::new();
    let base = bed.path("fuzz");
    for round in 0..400 {
        let id = rng.volume_id(&real);
        let (p1, p2) = (rng.path(&base), rng.path(&base));
        let mode = if round % 2 == 0 {
            access_mode::Mode::MultiNodeMultiWriter
        } else {
            access_mode::Mode::SingleNodeReaderOnly
        };
        let mut node = bed.node.clone();
        let mut ctl = bed.ctl.clone();
        let results = [
            node.node_stage_volume(csi::NodeStageVolumeRequest {
                volume_id: id.clone(),
                staging_target_path: p1.clone(),
                volume_capability: Some(cap(mode)),
                ..Default::default()
            })
            .await
            .map(drop),
            node.node_publish_volume(csi::NodePublishVolumeRequest {
                volume_id: id.clone(),
                staging_target_path: p1.clone(),
                target_path: p2.clone(),
                volume_capability: Some(cap(mode)),
                ..Default::default()
            })
            .await
            .map(drop),
            node.node_get_volume_stats(csi::NodeGetVolumeStatsRequest {
                volume_id: id.clone(),
                volume_path: p2.clone(),
                staging_target_path: p1.clone(),
            })
            .await
            .map(drop),
            node.node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
                volume_id: id.clone(),
                target_path: p2.clone(),
            })
            .await
            .map(drop),
            node.node_unstage_volume(csi::NodeUnstageVolumeRequest {
                volume_id: id.clone(),
                staging_target_path: p1.clone(),
            })
            .await
            .map(drop),
            ctl.validate_volume_capabilities(csi::ValidateVolumeCapabilitiesRequest {
                volume_id: id.clone(),
                volume_capabilities: vec![cap(mode)],
                ..Default::default()
            })
            .await
            .map(drop),
            ctl.controller_expand_volume(csi::ControllerExpandVolumeRequest {
                volume_id: id.clone(),
                capacity_range: Some(csi::CapacityRange {
                    required_bytes: MIB,
                    limit_bytes: 0,
                }),
                ..Default::default()
            })
            .await
            .map(drop),
        ];
        for (rpc, r) in results.into_iter().enumerate() {
            let code = r.err().map_or(Code::Ok, |s| {
                assert!(
                    allowed.contains(&s.code()),
                    "call {rpc} with id {id:?}, paths {p1:?} {p2:?}: {s:?}"
                );
                s.code()
            });
            *seen.entry(format!("{rpc}:{code:?}")).or_default() += 1;
        }
    }
    eprintln!("codes seen (call:code → count): {seen:?}");
    assert!(seen.keys().any(|k| k.ends_with("InvalidArgument")));
    assert!(seen.keys().any(|k| k.ends_with("NotFound")));
    let mounts_after = std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .count();
    assert_eq!(mounts_before, mounts_after, "no mount made or removed");
    for p in [
        "/proc/self",
        "/sys/kernel",
        "/tmp",
        "/dev/null",
        "/etc/passwd",
    ] {
        assert!(Path::new(p).exists(), "{p} is still there");
    }
    assert!(bed.keeper_volumes().is_empty());
    let probe = bed.ident.clone().probe(csi::ProbeRequest {}).await.unwrap();
    assert_eq!(
        probe.into_inner().ready,
        Some(true),
        "the plugin still serves"
    );
}
