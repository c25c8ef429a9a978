//! Containers through DAOS's own client libraries (`dpufs_daos::libdaos`, feature
//! `daos-ffi`) on a real DAOS system, checked against DAOS's own `daos` tool on the same
//! pool: what one makes, the other sees, with the same facts. One DAOS release per test
//! process (`libdaos_2_6.rs`, `libdaos_2_8.rs`): a process loads one DAOS installation.

use dpufs_daos::libdaos::{LibDaos, LibDaosContainers};
use dpufs_daos::{ContainerAdmin, ContainerSpec, DaosError, SnapshotRef};
use dpufs_e2e::daos_system::{self, DaosSystem};
use dpufs_proto::daos::props::{self, LAYOUT_POSIX, PropValue};
use serde_json::Value;
use std::collections::BTreeMap;

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
    let Some(daos) = daos_system::with_pool(test, version, "1GiB", &[]) else {
        return;
    };
    // SAFETY: set before libdaos starts and before this test starts any thread; the
    // process runs this one test.
    unsafe { std::env::set_var("DAOS_AGENT_DRPC_DIR", daos.agent_dir()) };
    let lib = LibDaos::load(&daos.prefix.lib_dir()).expect("loading libdaos");
    let pool = lib.connect("tank", true).expect("connecting to the pool");

    // Made through libdfs, seen by the tool; made by the tool, seen through libdaos.
    let ours = pool
        .create_posix("ours", &[], None)
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

    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(admin_matches_the_daos_tool(
        &daos,
        LibDaosContainers::new(lib),
    ));
}

/// `ACE strings` sorted.
fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
}

/// The tool's ACL entries of a container, sorted.
fn tool_acl(daos: &DaosSystem, cont: &str) -> Vec<String> {
    let acl = daos_json(daos, &["cont", "get-acl", "tank", cont]);
    sorted(serde_json::from_value(acl["entries"].clone()).unwrap())
}

/// `ContainerAdmin` over libdaos, each step checked with DAOS's `daos` tool.
async fn admin_matches_the_daos_tool(daos: &DaosSystem, admin: LibDaosContainers) {
    let spec = ContainerSpec {
        pool: "tank".into(),
        label: "vol".into(),
        properties: vec![
            (props::CONT_DPUFS_CHUNK_SIZE, PropValue::Num(2 << 20)),
            (props::CONT_DPUFS_QUOTA, PropValue::Num(1 << 30)),
        ],
        acl: vec![
            "A::OWNER@:rwdtTaAo".into(),
            "A:G:GROUP@:rwtT".into(),
            "A::bob@:r".into(),
        ],
        attributes: BTreeMap::from([("team".to_string(), b"ml".to_vec())]),
        ..Default::default()
    };
    let made = admin.create(&spec).await.expect("create");
    assert_eq!(made.label, "vol");
    assert_eq!(
        made.properties.get(&props::CONT_DPUFS_QUOTA),
        Some(&PropValue::Num(1 << 30))
    );
    assert_eq!(
        made.properties.get(&props::CONT_DPUFS_CHUNK_SIZE),
        Some(&PropValue::Num(2 << 20))
    );
    assert_eq!(tool_acl(daos, "vol"), sorted(spec.acl.clone()));
    // A retried create answers with the container the first one made.
    let again = admin.create(&spec).await.expect("create again");
    assert_eq!(again.uuid, made.uuid);
    // The user's attributes, without dpufs's bookkeeping; the tool sees the same.
    let attrs = admin.get_attributes("tank", "vol").await.unwrap();
    assert_eq!(attrs, spec.attributes);
    let tool = daos
        .daos(&["cont", "get-attr", "tank", "vol", "team"])
        .unwrap();
    assert!(tool.contains("ml"), "{tool}");

    // Relabelled: the tool lists the new label with the same UUID.
    let renamed = admin
        .set_properties(
            "tank",
            "vol",
            vec![(props::CONT_LABEL, PropValue::Str("vol2".into()))],
        )
        .await
        .expect("relabel");
    assert_eq!(
        (renamed.label.as_str(), &renamed.uuid),
        ("vol2", &made.uuid)
    );
    assert!(tool_list(daos, "tank").contains(&(made.uuid.clone(), "vol2".into())));

    // ACL edits, as the tool reads them.
    admin
        .update_acl("tank", "vol2", vec!["A::carol@:rw".into()])
        .await
        .unwrap();
    let acl = admin.delete_acl("tank", "vol2", "u:bob@").await.unwrap();
    assert_eq!(sorted(acl.entries.clone()), tool_acl(daos, "vol2"));
    assert!(acl.entries.contains(&"A::carol@:rw".to_string()), "{acl:?}");
    assert!(!acl.entries.iter().any(|e| e.contains("bob@")), "{acl:?}");
    let acl = admin
        .overwrite_acl("tank", "vol2", vec!["A::OWNER@:rwdtTaAo".into()])
        .await
        .unwrap();
    assert_eq!(acl.entries, ["A::OWNER@:rwdtTaAo"]);
    assert_eq!(tool_acl(daos, "vol2"), ["A::OWNER@:rwdtTaAo"]);

    // Attributes: set and delete in one call.
    let attrs = admin
        .set_attributes(
            "tank",
            "vol2",
            BTreeMap::from([
                ("team".into(), b"hpc".to_vec()),
                ("owner".into(), b"amy".to_vec()),
            ]),
        )
        .await
        .unwrap();
    assert_eq!(attrs.len(), 2, "{attrs:?}");
    let attrs = admin
        .set_attributes(
            "tank",
            "vol2",
            BTreeMap::from([("owner".into(), Vec::new())]),
        )
        .await
        .unwrap();
    assert_eq!(
        attrs,
        BTreeMap::from([("team".to_string(), b"hpc".to_vec())])
    );

    // Snapshots, named by dpufs, with the epochs the tool lists.
    let snap = admin
        .snapshot_create("tank", "vol2", "before")
        .await
        .expect("snapshot");
    assert!(snap.created_unix > 1_600_000_000, "{snap:?}");
    let listed = admin.snapshot_list("tank", "vol2").await.unwrap();
    assert_eq!(listed, std::slice::from_ref(&snap));
    let tool = daos.daos(&["cont", "list-snap", "tank", "vol2"]).unwrap();
    // The tool prints epochs in hexadecimal.
    assert!(tool.contains(&format!("{:#x}", snap.epoch)), "{tool}");
    let left = admin
        .snapshot_destroy("tank", "vol2", SnapshotRef::Name("before".into()))
        .await
        .unwrap();
    assert_eq!(left, []);
    let err = admin
        .clone_snapshot("tank", "vol2", SnapshotRef::Epoch(snap.epoch), &spec)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("no container clones"), "{err}");

    // List and destroy.
    let all = admin.list("tank").await.unwrap();
    let labels: Vec<&str> = all.iter().map(|c| c.label.as_str()).collect();
    assert_eq!(
        sorted(labels.iter().map(|l| l.to_string()).collect()),
        ["theirs", "vol2"]
    );
    admin.destroy("tank", "vol2", false).await.expect("destroy");
    let err = admin.query("tank", "vol2").await.unwrap_err();
    assert!(matches!(err, DaosError::NotFound { .. }), "{err:?}");
}
