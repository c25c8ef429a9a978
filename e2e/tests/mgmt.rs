//! The management client against a real `dpufs-engine` process over real TCP.

use dpufs_daos::{
    ClientConfig, ContainerAdmin, ContainerSpec, DaosError, EngineContainers, EngineRanks,
    MgmtClient, PoolSize, PoolSpec,
};
use dpufs_e2e::{EngineOpts, EngineProcess};
use dpufs_proto::daos::der::Der;
use dpufs_proto::daos::fault::FaultCode;
use dpufs_proto::daos::props::{self, PropValue};

const GIB: u64 = 1 << 30;

fn engine(opts: EngineOpts) -> (tempfile::TempDir, EngineProcess) {
    let dir = tempfile::tempdir().unwrap();
    let e = EngineProcess::start(dir.path(), opts).unwrap();
    (dir, e)
}

fn prop(name: &str) -> u32 {
    props::find_by_name(props::POOL_PROPS, name).unwrap().number
}

#[tokio::test]
async fn pool_lifecycle() {
    let (_d, e) = engine(EngineOpts::default());
    let c = e.client();
    let spec = PoolSpec::new("tank", PoolSize::total(GIB));
    let created = c.pool_create(&spec).await.unwrap();
    assert_eq!(created.uuid, spec.uuid.to_string());
    assert_eq!(created.target_ranks, vec![0]);
    assert_eq!(
        created.tier_bytes_per_rank,
        vec![(GIB as f64 * 0.06) as u64, (GIB as f64 * 0.94) as u64]
    );

    let info = c.pool_query("tank").await.unwrap();
    assert_eq!(info.uuid, spec.uuid.to_string());
    assert_eq!(info.state, "Ready");
    assert_eq!(
        info.tiers.iter().map(|t| t.total).sum::<u64>(),
        created.tier_bytes_per_rank.iter().sum::<u64>()
    );
    assert_eq!(
        c.list_pools()
            .await
            .unwrap()
            .iter()
            .map(|p| p.label.as_str())
            .collect::<Vec<_>>(),
        ["tank"]
    );

    c.pool_set_props(
        "tank",
        vec![
            (prop("reclaim"), PropValue::Num(4)),
            (prop("space_rb"), PropValue::Num(20)),
        ],
    )
    .await
    .unwrap();
    let got = c
        .pool_get_props(
            &spec.uuid.to_string(),
            &[prop("reclaim"), prop("space_rb"), prop("label")],
        )
        .await
        .unwrap();
    assert_eq!(
        got,
        vec![
            (prop("reclaim"), PropValue::Num(4)),
            (prop("space_rb"), PropValue::Num(20)),
            (prop("label"), PropValue::Str("tank".into()))
        ]
    );

    let acl = c
        .pool_update_acl("tank", vec!["A::bob@:r".into()])
        .await
        .unwrap();
    // DAOS's order: the owner, named users, the owner group.
    assert_eq!(acl.entries, ["A::OWNER@:rw", "A::bob@:r", "A:G:GROUP@:rw"]);
    let acl = c
        .pool_update_acl("tank", vec!["A::bob@:rw".into()])
        .await
        .unwrap();
    assert_eq!(acl.entries[1], "A::bob@:rw");
    let acl = c.pool_delete_acl("tank", "u:bob@").await.unwrap();
    assert_eq!(acl.entries, ["A::OWNER@:rw", "A:G:GROUP@:rw"]);
    assert_eq!(c.pool_get_acl("tank").await.unwrap(), acl);

    c.pool_destroy("tank", false, false).await.unwrap();
    assert!(c.list_pools().await.unwrap().is_empty());
    let gone = c.pool_query("tank").await.unwrap_err();
    assert!(matches!(gone, DaosError::NotFound { .. }), "{gone:?}");
}

#[tokio::test]
async fn create_is_idempotent_by_uuid_and_labels_are_unique() {
    let (_d, e) = engine(EngineOpts::default());
    let c = e.client();
    let spec = PoolSpec::new("tank", PoolSize::total(GIB));
    let first = c.pool_create(&spec).await.unwrap();
    let again = c.pool_create(&spec).await.unwrap();
    assert_eq!(first, again);
    assert_eq!(c.list_pools().await.unwrap().len(), 1);

    let other = PoolSpec::new("tank", PoolSize::total(GIB));
    let err = c.pool_create(&other).await.unwrap_err();
    assert_eq!(err.fault(), Some(FaultCode::PoolDuplicateLabel), "{err}");
    assert!(err.to_string().contains("tank"), "{err}");
    assert_eq!(c.list_pools().await.unwrap().len(), 1);
}

/// What a bad-input case must fail with.
type Expect = Box<dyn Fn(&DaosError) -> bool>;

#[tokio::test]
async fn bad_input_gets_daos_errors_and_leaves_nothing() {
    let (_d, e) = engine(EngineOpts::default());
    let c = e.client();
    let mut cases: Vec<(&str, PoolSpec, Expect)> = Vec::new();

    let mut no_label = PoolSpec::new("", PoolSize::total(GIB));
    no_label.label.clear();
    cases.push((
        "missing label",
        no_label,
        Box::new(|e| e.fault() == Some(FaultCode::PoolNoLabel)),
    ));
    cases.push((
        "uuid label",
        PoolSpec::new("6f1c2d1e-3a4b-4c5d-8e9f-0a1b2c3d4e5f", PoolSize::total(GIB)),
        Box::new(|e| e.der() == Some(Der::Inval)),
    ));
    let mut unknown_prop = PoolSpec::new("p1", PoolSize::total(GIB));
    unknown_prop.properties.push((999, PropValue::Num(1)));
    cases.push((
        "unknown property",
        unknown_prop,
        Box::new(|e| e.der() == Some(Der::Inval)),
    ));
    let mut out_of_range = PoolSpec::new("p2", PoolSize::total(GIB));
    out_of_range
        .properties
        .push((prop("space_rb"), PropValue::Num(101)));
    cases.push((
        "property out of range",
        out_of_range,
        Box::new(|e| e.der() == Some(Der::Inval)),
    ));
    let mut bad_ace = PoolSpec::new("p3", PoolSize::total(GIB));
    bad_ace.acl = vec!["A::OWNER@:rw".into(), "X:bogus".into()];
    cases.push((
        "malformed ACE",
        bad_ace,
        Box::new(|e| e.der() == Some(Der::Inval)),
    ));
    cases.push((
        "zero tier sizes",
        PoolSpec::new("p4", PoolSize::PerRank { tier_bytes: [0, 0] }),
        Box::new(|e| e.fault() == Some(FaultCode::PoolScmTooSmall)),
    ));
    cases.push((
        "zero total",
        PoolSpec::new("p5", PoolSize::total(0)),
        Box::new(|e| matches!(e, DaosError::Invalid { .. })),
    ));
    cases.push((
        "beyond capacity",
        PoolSpec::new("p6", PoolSize::total(64 * GIB)),
        Box::new(|e| matches!(e, DaosError::NoSpace { .. })),
    ));
    let mut bad_ranks = PoolSpec::new("p7", PoolSize::total(GIB));
    bad_ranks.ranks = vec![5];
    cases.push((
        "unknown rank",
        bad_ranks,
        Box::new(|e| e.fault() == Some(FaultCode::PoolInvalidRanks)),
    ));
    let mut ro_prop = PoolSpec::new("p8", PoolSize::total(GIB));
    ro_prop
        .properties
        .push((prop("global_version"), PropValue::Num(9)));
    cases.push((
        "read-only property",
        ro_prop,
        Box::new(|e| e.der() == Some(Der::NoPerm)),
    ));

    for (name, spec, expected) in cases {
        let err = c.pool_create(&spec).await.expect_err(name);
        assert!(expected(&err), "{name}: unexpected error {err:?}");
        assert!(!err.to_string().is_empty());
    }
    assert!(
        c.list_pools().await.unwrap().is_empty(),
        "a failed create left a pool behind"
    );
    let leftovers: Vec<_> = std::fs::read_dir(e.data_dir.join("ranks/0/pools"))
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(
        leftovers.is_empty(),
        "pool directories left behind: {leftovers:?}"
    );

    // Set-prop is all or nothing: a bad second property keeps the first unset.
    c.pool_create(&PoolSpec::new("ok", PoolSize::total(GIB)))
        .await
        .unwrap();
    let err = c
        .pool_set_props(
            "ok",
            vec![
                (prop("reclaim"), PropValue::Num(4)),
                (prop("svc_rf"), PropValue::Num(1)),
            ],
        )
        .await
        .unwrap_err();
    assert_eq!(err.der(), Some(Der::NoPerm), "{err}");
    let got = c.pool_get_props("ok", &[prop("reclaim")]).await.unwrap();
    assert_eq!(got, vec![(prop("reclaim"), PropValue::Num(1))]);
    let err = c.pool_get_props("ok", &[]).await.unwrap_err();
    assert_eq!(err.der(), Some(Der::Inval));
}

#[tokio::test]
async fn state_survives_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let mut e = EngineProcess::start(dir.path(), EngineOpts::default()).unwrap();
    let c = e.client();
    let spec = PoolSpec::new("durable", PoolSize::total(GIB));
    c.pool_create(&spec).await.unwrap();
    c.pool_set_props("durable", vec![(prop("scrub"), PropValue::Num(2))])
        .await
        .unwrap();
    c.pool_update_acl("durable", vec!["A:G:ml@:rw".into()])
        .await
        .unwrap();
    let conts = EngineContainers::new(&c);
    let cont = conts
        .create(&ContainerSpec {
            pool: "durable".into(),
            label: "vol".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    conts
        .snapshot_create("durable", "vol", "before")
        .await
        .unwrap();

    e.crash_and_restart().unwrap();
    let c = e.client();
    let conts = EngineContainers::new(&c);
    assert_eq!(
        c.pool_query("durable").await.unwrap().uuid,
        spec.uuid.to_string()
    );
    assert_eq!(
        c.pool_get_props("durable", &[prop("scrub")]).await.unwrap(),
        vec![(prop("scrub"), PropValue::Num(2))]
    );
    assert!(
        c.pool_get_acl("durable")
            .await
            .unwrap()
            .entries
            .contains(&"A:G:ml@:rw".to_string())
    );
    let again = conts.query("durable", "vol").await.unwrap();
    assert_eq!(again, cont_with_snapshots(cont, 1));
    assert_eq!(
        conts.snapshot_list("durable", "vol").await.unwrap()[0].name,
        "before"
    );
}

fn cont_with_snapshots(mut c: dpufs_daos::ContainerInfo, n: u32) -> dpufs_daos::ContainerInfo {
    c.snapshot_count = n;
    c
}

#[tokio::test]
async fn a_stopped_rank_disables_its_targets() {
    let (_d, e) = engine(EngineOpts {
        ranks: 2,
        ..Default::default()
    });
    let c = e.client();
    let ranks = EngineRanks::new(&c);
    c.pool_create(&PoolSpec::new("wide", PoolSize::total(2 * GIB)))
        .await
        .unwrap();
    let before = c.pool_query("wide").await.unwrap();
    assert_eq!((before.total_targets, before.disabled_targets), (8, 0));

    let member = c
        .system_query()
        .await
        .unwrap()
        .into_iter()
        .find(|m| m.rank == 1)
        .unwrap();
    let rank_addr = member.fabric_uri.rsplit("://").next().unwrap().to_string();
    assert!(std::net::TcpStream::connect(&rank_addr).is_ok());

    assert_eq!(ranks.stop(1).await.unwrap(), "stopped");
    let degraded = c.pool_query("wide").await.unwrap();
    assert_eq!((degraded.disabled_targets, degraded.active_targets), (4, 4));
    assert_eq!(degraded.state, "TargetsExcluded");
    assert_eq!(degraded.disabled_ranks, "[1]");
    assert!(
        std::net::TcpStream::connect(&rank_addr).is_err(),
        "stopped rank still listens"
    );
    let states: Vec<_> = c
        .system_query()
        .await
        .unwrap()
        .into_iter()
        .map(|m| m.state)
        .collect();
    assert_eq!(states, ["joined", "stopped"]);
    // New pools cannot be placed on a stopped rank.
    let mut pinned = PoolSpec::new("pinned", PoolSize::total(GIB));
    pinned.ranks = vec![1];
    assert_eq!(
        c.pool_create(&pinned).await.unwrap_err().fault(),
        Some(FaultCode::PoolInvalidRanks)
    );

    assert_eq!(ranks.start(1).await.unwrap(), "joined");
    let healed = c.pool_query("wide").await.unwrap();
    assert_eq!(
        (healed.disabled_targets, healed.state.as_str()),
        (0, "Ready")
    );
}

#[tokio::test]
async fn containers_follow_daos_rules() {
    let (_d, e) = engine(EngineOpts {
        ranks: 3,
        ..Default::default()
    });
    let c = e.client();
    let conts = EngineContainers::new(&c);
    c.pool_create(&PoolSpec::new("tank", PoolSize::total(3 * GIB)))
        .await
        .unwrap();
    let id = uuid::Uuid::new_v4();
    let spec = ContainerSpec {
        pool: "tank".into(),
        uuid: Some(id),
        label: "vol".into(),
        properties: vec![(props::CONT_LAYOUT_TYPE, PropValue::Num(props::LAYOUT_POSIX))],
        attributes: [("csi.name".to_string(), b"pvc-1".to_vec())].into(),
        ..Default::default()
    };
    let made = conts.create(&spec).await.unwrap();
    assert_eq!(made.uuid, id.to_string());
    assert_eq!(made.properties[&props::CONT_LAYOUT_TYPE], PropValue::Num(1));
    // rd_fac defaults to the pool's, which is clamped to the 3 fault domains.
    assert_eq!(made.properties[&props::CONT_RD_FAC], PropValue::Num(2));
    assert_eq!(made.acl.entries, ["A::OWNER@:rwdtTaAo", "A:G:GROUP@:rwtT"]);
    assert_eq!(
        conts.create(&spec).await.unwrap(),
        made,
        "retry returns the same container"
    );

    let clash = ContainerSpec {
        uuid: None,
        ..spec.clone()
    };
    assert!(matches!(
        conts.create(&clash).await.unwrap_err(),
        DaosError::Exists { .. }
    ));
    let immutable = conts
        .set_properties(
            "tank",
            "vol",
            vec![(props::CONT_LAYOUT_TYPE, PropValue::Num(2))],
        )
        .await;
    assert_eq!(immutable.unwrap_err().der(), Some(Der::NoPerm));
    let relabeled = conts
        .set_properties(
            "tank",
            "vol",
            vec![(props::CONT_LABEL, PropValue::Str("vol2".into()))],
        )
        .await
        .unwrap();
    assert_eq!(relabeled.label, "vol2");
    assert!(matches!(
        conts.query("tank", "vol").await.unwrap_err(),
        DaosError::NotFound { .. }
    ));

    assert_eq!(
        c.list_containers("tank").await.unwrap(),
        vec![id.to_string()]
    );
    c.cont_set_owner("tank", "vol2", "carol@", "")
        .await
        .unwrap();
    assert_eq!(
        conts
            .query("tank", &id.to_string())
            .await
            .unwrap()
            .acl
            .owner_user,
        "carol@"
    );
    let attrs = conts.get_attributes("tank", "vol2").await.unwrap();
    assert_eq!(attrs["csi.name"], b"pvc-1");

    let s1 = conts.snapshot_create("tank", "vol2", "a").await.unwrap();
    let s2 = conts.snapshot_create("tank", "vol2", "").await.unwrap();
    assert!(s2.epoch > s1.epoch);
    assert!(matches!(
        conts
            .snapshot_create("tank", "vol2", "a")
            .await
            .unwrap_err(),
        DaosError::Exists { .. }
    ));
    let left = conts
        .snapshot_destroy("tank", "vol2", dpufs_daos::SnapshotRef::Name("a".into()))
        .await
        .unwrap();
    assert_eq!(left, vec![s2]);

    let blocked = c.pool_destroy("tank", false, false).await.unwrap_err();
    assert_eq!(
        blocked.fault(),
        Some(FaultCode::PoolHasContainers),
        "{blocked}"
    );
    conts.destroy("tank", "vol2", false).await.unwrap();
    c.pool_destroy("tank", false, false).await.unwrap();

    c.pool_create(&PoolSpec::new("tank2", PoolSize::total(3 * GIB)))
        .await
        .unwrap();
    conts
        .create(&ContainerSpec {
            pool: "tank2".into(),
            label: "x".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    c.pool_destroy("tank2", false, true).await.unwrap();
    assert!(c.list_pools().await.unwrap().is_empty());
}

#[tokio::test]
async fn unreachable_engine_fails_fast() {
    let (_d, mut e) = engine(EngineOpts::default());
    let c = e.client();
    c.list_pools().await.unwrap();
    e.kill();
    let started = std::time::Instant::now();
    let err = c.list_pools().await.unwrap_err();
    assert!(matches!(err, DaosError::Unreachable { .. }), "{err:?}");
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
}

#[tokio::test]
async fn the_client_follows_leadership() {
    let (_d1, leader) = engine(EngineOpts::default());
    let (_d2, mut first) = engine(EngineOpts::default());
    // Given only a replica that does not lead, its NotLeader hint leads on.
    let follower_opts = EngineOpts {
        follow: Some(leader.addr.clone()),
        ..Default::default()
    };
    let (_d3, follower) = engine(follower_opts.clone());
    let via_follower = MgmtClient::new(ClientConfig::new(vec![follower.addr.clone()])).unwrap();
    via_follower
        .pool_create(&PoolSpec::new("led", PoolSize::total(GIB)))
        .await
        .unwrap();
    assert_eq!(leader.client().list_pools().await.unwrap()[0].label, "led");
    // Given several endpoints, some dead, LeaderQuery discovery finds it.
    let endpoints = vec!["127.0.0.1:1".to_string(), follower.addr.clone()];
    let discovering = MgmtClient::new(ClientConfig::new(endpoints)).unwrap();
    assert_eq!(discovering.list_pools().await.unwrap()[0].label, "led");

    // A client that knows `first` as leader is redirected by NotLeader once
    // `first` steps down in favour of `leader`.
    let client = first.client();
    assert!(client.list_pools().await.unwrap().is_empty());
    first.restart_with(follower_opts).unwrap();
    let pools = client.list_pools().await.unwrap();
    assert_eq!(
        pools.iter().map(|p| p.label.as_str()).collect::<Vec<_>>(),
        ["led"]
    );
}

#[tokio::test]
async fn retryable_faults_are_retried_until_the_deadline() {
    let (_d, e) = engine(EngineOpts::default());
    let ranks = EngineRanks::new(&e.client());
    ranks.stop(0).await.unwrap();
    // With no rank running the engine answers DataPlaneNotStarted (611),
    // which DAOS clients retry with backoff...
    let mut cfg = ClientConfig::new(vec![e.addr.clone()]);
    cfg.create_timeout = std::time::Duration::from_secs(1);
    let impatient = MgmtClient::new(cfg).unwrap();
    let err = impatient
        .pool_create(&PoolSpec::new("late", PoolSize::total(GIB)))
        .await
        .unwrap_err();
    match &err {
        DaosError::Timeout(_, inner) => {
            assert_eq!(inner.fault(), Some(FaultCode::DataPlaneNotStarted))
        }
        other => panic!("expected a timeout after retries, got {other:?}"),
    }
    // ...so a create issued while the rank is down completes once it is back.
    let patient = e.client();
    let create = tokio::spawn(async move {
        patient
            .pool_create(&PoolSpec::new("late", PoolSize::total(GIB)))
            .await
    });
    tokio::time::sleep(std::time::Duration::from_millis(700)).await;
    ranks.start(0).await.unwrap();
    create.await.unwrap().unwrap();
    assert_eq!(e.client().list_pools().await.unwrap().len(), 1);
}
