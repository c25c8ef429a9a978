//! The error shapes on the wire, both ways: what the engine encodes, the
//! client decodes, for every DER code and fault; and DAOS's version rules as a
//! raw client without dpufs's headers meets them.

use dpufs_daos::DaosError;
use dpufs_e2e::{EngineOpts, EngineProcess};
use dpufs_engine::error::{EngineError, der, fault};
use dpufs_proto::daos::der::Der;
use dpufs_proto::daos::fault::FaultCode;
use dpufs_proto::daos::{COMPONENT_HEADER, VERSION_HEADER};
use dpufs_proto::mgmt::{ListPoolsReq, mgmt_svc_client::MgmtSvcClient};
use tonic::Status;

#[test]
fn every_der_code_survives_the_round_trip() {
    for &d in Der::ALL {
        let decoded = DaosError::from_status(&Status::from(der(d, "detail")));
        assert_eq!(decoded.der(), Some(d), "{d:?} decoded as {decoded:?}");
        assert!(decoded.to_string().contains(d.name()), "{decoded}");
        assert!(decoded.to_string().contains("detail"), "{decoded}");
    }
}

#[test]
fn every_fault_survives_the_round_trip() {
    for &f in FaultCode::ALL {
        let decoded = DaosError::from_status(&Status::from(fault(f, "why")));
        match f {
            FaultCode::IncompatibleComponents | FaultCode::NoCompatibilityInsecure => {
                assert!(
                    matches!(decoded, DaosError::Incompatible { .. }),
                    "{decoded:?}"
                );
            }
            _ => {
                assert_eq!(decoded.fault(), Some(f));
                assert!(decoded.to_string().contains("why"));
                assert!(decoded.to_string().contains(f.resolution()), "{decoded}");
            }
        }
        assert_eq!(decoded.is_retryable(), f.is_retryable(), "{f:?}");
    }
}

#[test]
fn pool_not_found_and_plain_errors() {
    let e = DaosError::from_status(&Status::from(EngineError::PoolNotFound {
        id: "tank".into(),
    }));
    assert!(
        matches!(&e, DaosError::NotFound { message, der: None } if message.contains("tank")),
        "{e:?}"
    );
    let e = DaosError::from_status(&Status::from(EngineError::Store("disk gone".into())));
    assert_eq!(e.der(), Some(Der::Io));
    let replicas = vec!["10.0.0.1:10001".to_string(), "10.0.0.2:10001".to_string()];
    let e = DaosError::from_status(&Status::from(EngineError::NotLeader {
        hint: replicas[0].clone(),
        replicas: replicas.clone(),
    }));
    assert!(
        matches!(&e, DaosError::NotLeader { leader_hint, replicas: r } if *leader_hint == replicas[0] && *r == replicas),
        "{e:?}"
    );
}

async fn raw_list(
    addr: &str,
    headers: &[(&'static str, &str)],
    sys: &str,
) -> Result<(), DaosError> {
    let mut client = MgmtSvcClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    let mut req = tonic::Request::new(ListPoolsReq { sys: sys.into() });
    for (k, v) in headers {
        req.metadata_mut().insert(*k, v.parse().unwrap());
    }
    client
        .list_pools(req)
        .await
        .map(|_| ())
        .map_err(|s| DaosError::from_status(&s))
}

#[tokio::test]
async fn version_rules_on_the_wire() {
    let dir = tempfile::tempdir().unwrap();
    let e = EngineProcess::start(dir.path(), EngineOpts::default()).unwrap();
    let ok = [(COMPONENT_HEADER, "admin"), (VERSION_HEADER, "2.8.1")];
    raw_list(&e.addr, &ok, "daos_server").await.unwrap();
    // A DAOS 2.6 admin tool is refused clearly.
    let old = [(COMPONENT_HEADER, "admin"), (VERSION_HEADER, "2.6.5")];
    let err = raw_list(&e.addr, &old, "daos_server").await.unwrap_err();
    assert!(
        matches!(&err, DaosError::Incompatible { message } if message.contains("2.6.5")),
        "{err:?}"
    );
    // Insecure mode without headers needs the exact version in the system name.
    assert!(raw_list(&e.addr, &[], "daos_server").await.is_err());
    raw_list(&e.addr, &[], "daos_server-2.8.0").await.unwrap();
    let err = raw_list(&e.addr, &ok, "other_system").await.unwrap_err();
    assert_eq!(err.fault(), Some(FaultCode::WrongSystem), "{err:?}");
}
