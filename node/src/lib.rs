//! What dpufs's node processes say to each other, as types: the mount keeper's socket
//! protocol ([`keeper`]), the volume worker's control socket ([`control`]), the handover a
//! worker receives with a FUSE connection or a vhost-user-fs socket ([`handover`]), how a
//! volume is attached ([`transport`]), the keeper's per-volume record ([`record`]), the mount
//! table ([`mountinfo`]) and a volume's QoS limits ([`qos`]).
//!
//! The CSI driver, `dpufs up` and the tests all speak these; nothing here depends on the
//! driver. Every message is one line of JSON with its keys sorted at every level
//! ([`wire::encode`]), which is what the sockets have always carried: the round-trip tests
//! of each module pin that text.

pub mod control;
pub mod file;
pub mod handover;
pub mod keeper;
pub mod mountinfo;
pub mod qos;
pub mod record;
pub mod transport;
pub mod wire;
