//! The handover: what a worker taking over a volume is told with its descriptor (a live FUSE
//! connection, or the listening socket of a vhost-user-fs export). Versioned; a worker accepts
//! every version up to its own and refuses newer ones (a keeper is upgraded after its workers,
//! never before).
//!
//! Version 1 (JSON), a FUSE connection:
//! `{"version":1,"volume":"…","mountpoint":"/…","session":{…}|null}`, where `session` is what
//! the connection's INIT negotiated ([`SessionRecord`], the `session.json` the first worker
//! wrote), or null when no worker has answered INIT yet.
//!
//! Version 2 adds exports: `{"version":2,"volume":"…","transport":"vhost-user-fs",
//! "socket":"/…","session":{…}|null}`, where `session` is what the guest's INIT negotiated
//! (a guest, too, sends INIT once per mount). A FUSE handover is still sent as version 1,
//! byte for byte, so workers of either version take it ([`Handover::new`]).

use crate::transport::Attachment;
use serde::{Deserialize, Serialize};

/// The newest handover version this build speaks.
pub const HANDOVER_VERSION: u32 = 2;
/// The version that introduced the vhost-user-fs transport.
const VHOST_USER_VERSION: u32 = 2;
/// The version of [`SessionRecord`] (unchanged since version 1 of the handover).
pub const SESSION_VERSION: u32 = 1;

/// Errors decoding a handover or taking over its session.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum HandoverError {
    #[error(
        "handover version {0} is newer than this worker's ({HANDOVER_VERSION}): upgrade the worker binary before the keeper"
    )]
    TooNew(u32),
    #[error("malformed handover: {0}")]
    Malformed(String),
    #[error(
        "the connection was negotiated {negotiated}, this worker is configured {configured}: \
         start it with the same caching flags"
    )]
    Mismatch {
        negotiated: String,
        configured: String,
    },
}

/// What a taking-over worker is told.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Handover {
    pub version: u32,
    pub volume: String,
    /// The mountpoint of a FUSE connection, or the socket of an export.
    #[serde(flatten)]
    pub attachment: Attachment,
    pub session: Option<SessionRecord>,
}

/// What INIT negotiated on a connection, and the caching the kernel was promised.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionRecord {
    pub version: u32,
    /// FUSE flags the kernel offered, and those in use.
    pub offered: u64,
    pub enabled: u64,
    /// The same flags by name, for people reading the record (ignored when decoding).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub offered_names: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub enabled_names: String,
    pub max_write: u32,
    pub config: SessionConfig,
}

/// The caching settings in effect on the connection.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionConfig {
    pub attr_ttl_secs: f64,
    pub entry_ttl_secs: f64,
    pub negative_ttl_secs: f64,
    pub data_cache: bool,
    pub access: AccessMode,
    pub writeback_cache: bool,
}

/// Who may change the volume's data, which decides what the kernel may cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AccessMode {
    /// Writers on several nodes (RWX): close-to-open consistency. The page cache of a file
    /// is dropped at every open and whenever its size or mtime is seen to change.
    #[default]
    MultiWriter,
    /// This node is the only writer (RWO/RWOP): cached pages are kept across opens, and the
    /// writeback cache may be enabled.
    SingleWriter,
    /// Nobody writes through this mount (ROX): cached pages are kept across opens; every
    /// modification fails with EROFS.
    ReadOnly,
}

impl AccessMode {
    /// Every mode, in the order messages list them.
    pub const ALL: [AccessMode; 3] = [
        AccessMode::MultiWriter,
        AccessMode::SingleWriter,
        AccessMode::ReadOnly,
    ];

    /// The name `--access` takes (and [`std::str::FromStr`] reads).
    pub fn as_str(self) -> &'static str {
        match self {
            AccessMode::MultiWriter => "multi-writer",
            AccessMode::SingleWriter => "single-writer",
            AccessMode::ReadOnly => "read-only",
        }
    }
}

impl std::str::FromStr for AccessMode {
    type Err = String;
    fn from_str(s: &str) -> Result<AccessMode, String> {
        AccessMode::ALL
            .into_iter()
            .find(|m| m.as_str() == s)
            .ok_or_else(|| {
                let names = AccessMode::ALL.map(AccessMode::as_str).join(", ");
                format!("unknown access mode {s:?} ({names})")
            })
    }
}

impl SessionRecord {
    /// A successor configured as `configured` must keep what the kernel relies on: the
    /// writeback cache (dirty pages are flushed by the kernel on its own schedule) and
    /// read-only-ness.
    pub fn check(&self, configured: &SessionConfig) -> Result<(), HandoverError> {
        let key = |c: &SessionConfig| {
            format!(
                "with writeback cache {}, access {:?}",
                if c.writeback_cache { "on" } else { "off" },
                c.access
            )
        };
        if key(configured) != key(&self.config) {
            return Err(HandoverError::Mismatch {
                negotiated: key(&self.config),
                configured: key(configured),
            });
        }
        Ok(())
    }
}

impl Handover {
    /// The handover of `volume`, in the oldest version that can say it: version 1 for a FUSE
    /// connection (what every worker reads), version 2 for an export.
    pub fn new(volume: &str, attachment: Attachment, session: Option<SessionRecord>) -> Handover {
        let version = match attachment {
            Attachment::Mount(_) => 1,
            Attachment::VhostUser { .. } => VHOST_USER_VERSION,
        };
        Handover {
            version,
            volume: volume.to_string(),
            attachment,
            session,
        }
    }

    /// Decodes any version up to [`HANDOVER_VERSION`].
    pub fn decode(text: &str) -> Result<Handover, HandoverError> {
        #[derive(Deserialize)]
        struct Version {
            version: u32,
        }
        let v: Version =
            serde_json::from_str(text).map_err(|e| HandoverError::Malformed(e.to_string()))?;
        if v.version > HANDOVER_VERSION {
            return Err(HandoverError::TooNew(v.version));
        }
        serde_json::from_str(text).map_err(|e| HandoverError::Malformed(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The version-1 message as a keeper of that version sent it (kept byte for byte).
    const V1_FIXTURE: &str = include_str!("../tests/fixtures/handover-v1.json");

    fn configured() -> SessionConfig {
        SessionConfig {
            attr_ttl_secs: 1.0,
            entry_ttl_secs: 1.0,
            negative_ttl_secs: 0.0,
            data_cache: true,
            access: AccessMode::MultiWriter,
            writeback_cache: false,
        }
    }

    #[test]
    fn the_version_1_fixture_is_accepted() {
        let h = Handover::decode(V1_FIXTURE).unwrap();
        assert_eq!(h.version, 1);
        assert_eq!(h.volume, "vol-1");
        let s = h.session.expect("a negotiated session");
        assert_eq!(s.max_write, 1 << 20);
        assert!(s.enabled != 0 && s.enabled & !s.offered == 0);
        s.check(&configured()).unwrap();
    }

    #[test]
    fn the_version_1_fixture_is_what_this_build_sends() {
        let h = Handover::decode(V1_FIXTURE).unwrap();
        let compact: serde_json::Value = serde_json::from_str(V1_FIXTURE).unwrap();
        assert_eq!(crate::wire::encode(&h), compact.to_string());
    }

    #[test]
    fn a_fuse_handover_is_still_sent_as_version_1() {
        let h = Handover::decode(V1_FIXTURE).unwrap();
        let again = Handover::new(&h.volume, h.attachment.clone(), h.session.clone());
        assert_eq!(again, h);
    }

    #[test]
    fn an_export_is_handed_over_as_version_2() {
        let h = Handover::new(
            "vol-2",
            Attachment::VhostUser {
                socket: "/run/dpufs/vol-2.sock".into(),
            },
            None,
        );
        let text = concat!(
            r#"{"session":null,"socket":"/run/dpufs/vol-2.sock","#,
            r#""transport":"vhost-user-fs","version":2,"volume":"vol-2"}"#
        );
        assert_eq!(crate::wire::encode(&h), text);
        assert_eq!(Handover::decode(text).unwrap(), h);
    }

    #[test]
    fn newer_versions_and_garbage_are_refused() {
        let newer = V1_FIXTURE.replacen("\"version\": 1", "\"version\": 3", 1);
        assert_eq!(Handover::decode(&newer), Err(HandoverError::TooNew(3)));
        assert!(matches!(
            Handover::decode("{"),
            Err(HandoverError::Malformed(_))
        ));
    }

    #[test]
    fn a_successor_must_keep_the_writeback_cache_setting() {
        let s = Handover::decode(V1_FIXTURE).unwrap().session.unwrap();
        let mut cfg = configured();
        cfg.writeback_cache = true;
        cfg.access = AccessMode::SingleWriter;
        assert!(matches!(s.check(&cfg), Err(HandoverError::Mismatch { .. })));
        // The TTLs and the data cache may change.
        let mut cfg = configured();
        cfg.attr_ttl_secs = 5.0;
        cfg.data_cache = false;
        s.check(&cfg).unwrap();
    }

    #[test]
    fn encoding_round_trips() {
        let h = Handover::decode(V1_FIXTURE).unwrap();
        let text = serde_json::to_string(&h).unwrap();
        assert_eq!(Handover::decode(&text).unwrap(), h);
    }

    #[test]
    fn access_modes_parse_from_their_flag_names() {
        assert_eq!("read-only".parse(), Ok(AccessMode::ReadOnly));
        assert_eq!("single-writer".parse(), Ok(AccessMode::SingleWriter));
        assert!("rw".parse::<AccessMode>().is_err());
        assert_eq!("multi-writer".parse(), Ok(AccessMode::MultiWriter));
        let err = "rw".parse::<AccessMode>().unwrap_err();
        assert!(
            err.contains("multi-writer, single-writer, read-only"),
            "{err}"
        );
        for mode in AccessMode::ALL {
            assert_eq!(mode.as_str().parse(), Ok(mode));
        }
    }
}
