//! `DfsRequest` messages served by an engine's data service, as a tenant's worker sends them
//! over its connection. The first input byte picks the direction of the request's buffer
//! (the engine pulls from it, or pushes into it); the rest is the encoded request.
//!
//! The engine keeps its state from input to input (files made by one are there for the
//! next), as it does between a worker's requests.

use crate::engine::FuzzEngine;
use dpufs_daos::dfs::ROOT_OID as ROOT;
use dpufs_e2e::in_process::{InProcess, SliceBulk};
use dpufs_fabric::session::MAX_CONTROL_MESSAGE;
use dpufs_proto::engine::v1::{self as eng, dfs_request::Op};
use prost::Message;

/// The bulk buffer's size: a fuzzed request may name any part of it, or beyond.
const BULK: usize = 64 << 10;

pub struct DfsHarness {
    connection: InProcess,
    _engine: FuzzEngine,
}

impl DfsHarness {
    pub fn new() -> DfsHarness {
        let engine = FuzzEngine::start();
        DfsHarness {
            connection: engine.connection(),
            _engine: engine,
        }
    }

    /// Whether the engine served the request (errno 0).
    pub fn run(&self, data: &[u8]) -> bool {
        let Some((&direction, request)) = data.split_first() else {
            return false;
        };
        let InProcess { service, ctx } = &self.connection;
        let reply = if direction & 1 == 0 {
            let staged = [0x5a; BULK];
            service.handle(ctx, request, &mut SliceBulk::ToServer(&staged))
        } else {
            let mut landing = vec![0; BULK];
            service.handle(ctx, request, &mut SliceBulk::FromServer(&mut landing, 0))
        };
        // Every request gets an answer, and it fits the connection's message size.
        assert!(
            reply.len() <= MAX_CONTROL_MESSAGE,
            "a reply of {} bytes",
            reply.len()
        );
        let reply = eng::DfsReply::decode(&reply[..]).expect("the engine's reply decodes");
        reply.errno == 0
    }
}

fn request(direction: u8, op: Op) -> Vec<u8> {
    let mut out = vec![direction];
    eng::DfsRequest {
        id: 1,
        op: Some(op),
    }
    .encode(&mut out)
    .expect("to memory");
    out
}

fn create(name: &str, mode: u32) -> eng::Create {
    eng::Create {
        parent: ROOT,
        name: name.into(),
        mode,
        uid: 1000,
        gid: 1000,
    }
}

pub fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    // The first file created in a new container is object 2.
    let file = 2;
    vec![
        ("mount", request(0, Op::Mount(eng::Mount {}))),
        ("create", request(0, Op::Create(create("f", 0o100644)))),
        ("mkdir", request(0, Op::Mkdir(create("d", 0o40755)))),
        (
            "write-inline",
            request(
                0,
                Op::Write(eng::Write {
                    oid: file,
                    offset: 0,
                    len: 5,
                    data: b"hello".to_vec(),
                    ..Default::default()
                }),
            ),
        ),
        (
            "write-bulk",
            request(
                0,
                Op::Write(eng::Write {
                    oid: file,
                    offset: 4096,
                    len: 32768,
                    ..Default::default()
                }),
            ),
        ),
        (
            "read-bulk",
            request(
                1,
                Op::Read(eng::Read {
                    oid: file,
                    offset: 0,
                    len: 65536,
                    inline: false,
                }),
            ),
        ),
        (
            "readdir-plus",
            request(
                0,
                Op::Readdir(eng::ReadDir {
                    dir: ROOT,
                    cookie: 0,
                    max: 150,
                    plus: true,
                }),
            ),
        ),
        (
            "setxattr",
            request(
                0,
                Op::Setxattr(eng::SetXattr {
                    oid: file,
                    name: "user.k".into(),
                    value: b"v".to_vec(),
                    create: true,
                    replace: false,
                }),
            ),
        ),
        (
            "rename",
            request(
                0,
                Op::Rename(eng::Rename {
                    parent: ROOT,
                    name: "f".into(),
                    new_parent: ROOT,
                    new_name: "g".into(),
                    noreplace: false,
                }),
            ),
        ),
        (
            "setattr-truncate",
            request(
                0,
                Op::Setattr(eng::SetAttr {
                    oid: file,
                    size: Some(1),
                    ..Default::default()
                }),
            ),
        ),
        (
            "punch",
            request(
                0,
                Op::Punch(eng::Punch {
                    oid: file,
                    offset: 1,
                    len: 1 << 40,
                }),
            ),
        ),
        (
            "unlink",
            request(
                0,
                Op::Unlink(eng::Remove {
                    parent: ROOT,
                    name: "g".into(),
                }),
            ),
        ),
        ("statfs", request(0, Op::Statfs(eng::StatFs {}))),
        ("syncfs", request(0, Op::Syncfs(eng::Syncfs {}))),
    ]
}
