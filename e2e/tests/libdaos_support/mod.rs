//! Containers through DAOS's own client libraries (`dpufs_daos::libdaos`, feature
//! `daos-ffi`) on a real DAOS system, checked against DAOS's own `daos` tool on the same
//! pool: what one makes, the other sees, with the same facts. One DAOS release per test
//! process (`libdaos_2_6.rs`, `libdaos_2_8.rs`): a process loads one DAOS installation.

use dpufs_daos::DaosError;
use dpufs_daos::libdaos::LibDaos;
use dpufs_e2e::daos_system::{self, DaosSystem};
use dpufs_proto::daos::props::{self, LAYOUT_POSIX, PropValue};
use serde_json::Value;

/// `daos -j ARGS`'s `response`.
fn daos_json(daos: &DaosSystem, args: &[&str]) -> Value {
    let mut all = vec!["-j"];
    all.extend_from_slice(args);
    let text = daos
        .daos(&all)
        .unwrap_or_else(|e| panic!("daos {args:?}: {e:#}"));
    let mut doc: Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("daos {args:?}: {e}: {text}"));
    assert!(doc["error"].is_null(), "daos {args:?}: {doc:#}");
    doc["response"].take()
}

/// `(uuid, label)` of every container `daos cont list` shows, sorted.
fn tool_list(daos: &DaosSystem, pool: &str) -> Vec<(String, String)> {
    let list = daos_json(daos, &["cont", "list", pool]);
    let mut out: Vec<(String, String)> = list
        .as_array()
        .map(|a| a.as_slice())
        .unwrap_or_default()
        .iter()
        .map(|c| {
            (
                c["uuid"].as_str().unwrap_or_default().to_string(),
                c["label"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    out.sort();
    out
}

pub fn containers_match_the_daos_tool(test: &str, version: &str) {
    let Some(prefix) = daos_system::prefix_of(version) else {
        daos_system::skip(test, version);
        return;
    };
    let mut daos = DaosSystem::start(&prefix).expect("starting DAOS");
    daos.start_agent().expect("starting daos_agent");
    daos.dmg_json(&["pool", "create", "--size", "1GiB", "tank"])
        .expect("dmg pool create");
    // SAFETY: set before libdaos starts and before this test starts any thread; the
    // process runs this one test.
    unsafe { std::env::set_var("DAOS_AGENT_DRPC_DIR", daos.agent_dir()) };
    let lib = LibDaos::load(&prefix.path.join("lib")).expect("loading libdaos");
    let pool = lib.connect("tank", true).expect("connecting to the pool");

    // Made through libdfs, seen by the tool; made by the tool, seen through libdaos.
    let ours = pool
        .create_posix("ours")
        .expect("creating a POSIX container");
    daos.daos(&["cont", "create", "tank", "theirs", "--type=POSIX"])
        .expect("daos cont create");
    let seen = tool_list(&daos, "tank");
    let mut listed: Vec<(String, String)> = pool
        .list()
        .expect("listing")
        .into_iter()
        .map(|(u, l)| (u.to_string(), l))
        .collect();
    listed.sort();
    assert_eq!(listed, seen, "libdaos's list vs daos cont list");
    assert!(
        seen.contains(&(ours.to_string(), "ours".into())),
        "{seen:?}"
    );

    // The same facts in both tools' queries, for both containers.
    for label in ["ours", "theirs"] {
        let info = pool.query(label).expect("querying");
        assert_eq!(info.label, label);
        assert_eq!(info.pool_uuid, pool.uuid().to_string());
        assert_eq!(
            info.properties.get(&props::CONT_LAYOUT_TYPE),
            Some(&PropValue::Num(LAYOUT_POSIX)),
            "{info:#?}"
        );
        let tool = daos_json(&daos, &["cont", "query", "tank", label]);
        assert_eq!(
            tool["container_uuid"].as_str(),
            Some(info.uuid.as_str()),
            "{tool:#}"
        );
        let acl = daos_json(&daos, &["cont", "get-acl", "tank", label]);
        let mut theirs: Vec<String> = serde_json::from_value(acl["entries"].clone()).unwrap();
        let mut entries = info.acl.entries.clone();
        theirs.sort();
        entries.sort();
        assert_eq!(entries, theirs, "ACL of {label}: {acl:#}");
        assert_eq!(info.acl.owner_user, acl["owner_user"], "{acl:#}");
        assert_eq!(info.acl.owner_group, acl["owner_group"], "{acl:#}");
        assert_ne!(info.acl.owner_user, "NOBODY@");
    }

    // Destroyed through libdaos: gone for the tool; a second destroy is NotFound.
    pool.destroy("ours", false).expect("destroying");
    let seen = tool_list(&daos, "tank");
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].1, "theirs");
    let again = pool.destroy("ours", false).unwrap_err();
    assert!(matches!(again, DaosError::NotFound { .. }), "{again:?}");
    let absent = pool.query("never-made").unwrap_err();
    assert!(matches!(absent, DaosError::NotFound { .. }), "{absent:?}");
    // A pool that does not exist is DAOS's NotFound too.
    let err = lib.connect("no-such-pool", false).unwrap_err();
    assert!(matches!(err, DaosError::NotFound { .. }), "{err:?}");
    drop(pool);
}
