//! The node's own protocols, as one process of a node reads another's bytes: the keeper's
//! request and reply lines, the worker control socket's, the handover record a taking-over
//! worker reads, a volume's QoS file and mountinfo lines.

use dpufs_node_api::handover::Handover;
use dpufs_node_api::qos::QosLimits;
use dpufs_node_api::transport::Attachment;
use dpufs_node_api::{control, keeper, mountinfo};

pub fn run(data: &[u8]) -> bool {
    let limits = QosLimits::decode(data);
    if let Ok(limits) = &limits {
        let again = QosLimits::decode(limits.encode().as_bytes()).expect("encoded limits decode");
        assert_eq!(again, *limits);
    }
    let Ok(text) = std::str::from_utf8(data) else {
        return limits.is_ok();
    };
    let handover = Handover::decode(text);
    if let Ok(h) = &handover {
        let json = serde_json::to_string(h).expect("a handover encodes");
        let again = Handover::decode(&json).expect("an encoded handover decodes");
        assert_eq!(again, *h);
    }
    let mounts = mountinfo::parse(text);
    for m in &mounts {
        assert!(!m.fstype.contains(' '), "a field holds a separator");
    }
    [
        keeper_line(text),
        control_line(text),
        limits.is_ok(),
        handover.is_ok(),
        !mounts.is_empty(),
    ]
    .contains(&true)
}

/// A line protocol of the node: requests, and replies read against the request they answer.
trait LineProtocol: Sized + PartialEq + std::fmt::Debug {
    type Reply: PartialEq + std::fmt::Debug;
    fn decode(text: &str) -> Option<Self>;
    fn encode(&self) -> String;
    fn decode_reply(&self, text: &str) -> Option<Self::Reply>;
    fn encode_reply(reply: &Self::Reply) -> String;
}

impl LineProtocol for keeper::Request {
    type Reply = keeper::Reply;
    fn decode(text: &str) -> Option<Self> {
        keeper::Request::decode(text).ok()
    }
    fn encode(&self) -> String {
        keeper::Request::encode(self)
    }
    fn decode_reply(&self, text: &str) -> Option<keeper::Reply> {
        keeper::Request::decode_reply(self, text).ok()
    }
    fn encode_reply(reply: &keeper::Reply) -> String {
        reply.encode()
    }
}

impl LineProtocol for control::Request {
    type Reply = control::Reply;
    fn decode(text: &str) -> Option<Self> {
        control::Request::decode(text).ok()
    }
    fn encode(&self) -> String {
        control::Request::encode(self)
    }
    fn decode_reply(&self, text: &str) -> Option<control::Reply> {
        control::Request::decode_reply(self, text).ok()
    }
    fn encode_reply(reply: &control::Reply) -> String {
        reply.encode()
    }
}

/// Whether the line is a request of `P`, or an answer to one of `asked`; whatever it reads as
/// encodes back to the same.
fn line<P: LineProtocol>(text: &str, asked: &[P]) -> bool {
    let request = P::decode(text);
    if let Some(req) = &request {
        assert_eq!(P::decode(&req.encode()).as_ref(), Some(req));
    }
    let mut replies = 0;
    for req in asked {
        if let Some(reply) = req.decode_reply(text) {
            assert_eq!(req.decode_reply(&P::encode_reply(&reply)), Some(reply));
            replies += 1;
        }
    }
    request.is_some() || replies > 0
}

fn keeper_line(text: &str) -> bool {
    let asked = [
        keeper::Request::List,
        keeper::Request::Unmount { volume: "v".into() },
        keeper::Request::Handover { volume: "v".into() },
    ];
    line(text, &asked)
}

fn control_line(text: &str) -> bool {
    let asked = [
        control::Request::Health,
        control::Request::Stats,
        control::Request::Statfs,
        control::Request::Stop,
    ];
    line(text, &asked)
}

pub fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    let mount = keeper::Request::Mount {
        volume: "pvc-1".into(),
        mountpoint: "/var/lib/dpufs/mnt/pvc-1".into(),
        fsname: Some("dpufs".into()),
        read_only: Some(false),
        allow_other: None,
    };
    let handover = Handover::new(
        "pvc-1",
        Attachment::Mount("/var/lib/dpufs/mnt/pvc-1".into()),
        None,
    );
    let statfs = control::Reply::Statfs(control::FsUsage {
        block_size: 4096,
        blocks: 1024,
        blocks_free: 512,
        blocks_available: 512,
        files: 3,
        files_free: 1 << 32,
    });
    let line = |s: String| s.into_bytes();
    vec![
        ("keeper-mount", line(mount.encode())),
        ("keeper-list", line(keeper::Request::List.encode())),
        (
            "keeper-reply-unmounted",
            line(keeper::Reply::Unmounted.encode()),
        ),
        (
            "keeper-refusal",
            line(keeper::Reply::Refused("no such volume".into()).encode()),
        ),
        ("handover", line(keeper::Reply::Handover(handover).encode())),
        ("control-stats", line(control::Request::Stats.encode())),
        ("control-reply-statfs", line(statfs.encode())),
        ("qos", line(QosLimits::UNLIMITED.encode())),
        (
            "mountinfo",
            b"36 35 0:42 / /var/lib/dpufs/mnt/v rw,nosuid - fuse.dpufs dpufs rw,user_id=0\n"
                .to_vec(),
        ),
    ]
}
