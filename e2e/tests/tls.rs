//! DAOS's pinned mutual TLS between the client and a real engine process,
//! with certificates generated at test time.

use dpufs_daos::certs::{self, CertAuthority};
use dpufs_daos::{ClientConfig, DaosError, MgmtClient, PoolSize, PoolSpec, TlsFiles};
use dpufs_e2e::{EngineOpts, EngineProcess};
use openssl::ssl::{SslConnector, SslFiletype, SslMethod, SslVerifyMode, SslVersion};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

struct Setup {
    _tmp: tempfile::TempDir,
    certs: std::path::PathBuf,
    engine: EngineProcess,
}

fn secure_engine() -> Setup {
    let tmp = tempfile::tempdir().unwrap();
    let certs = tmp.path().join("certs");
    certs::generate(&certs).unwrap();
    let data = tmp.path().join("data");
    let opts = EngineOpts {
        tls_dir: Some(certs.clone()),
        ..Default::default()
    };
    let engine = EngineProcess::start(&data, opts).unwrap();
    Setup {
        _tmp: tmp,
        certs,
        engine,
    }
}

fn client(addr: &str, dir: &Path, component: &str) -> Result<MgmtClient, DaosError> {
    MgmtClient::new(ClientConfig::new(vec![addr.into()]).with_tls(TlsFiles::in_dir(dir, component)))
}

/// A raw TLS handshake with the admin certificate and a custom offer.
fn raw_handshake(
    addr: &str,
    dir: &Path,
    tweak: impl FnOnce(&mut openssl::ssl::SslConnectorBuilder),
) -> bool {
    let mut b = SslConnector::builder(SslMethod::tls_client()).unwrap();
    b.set_ca_file(dir.join("daosCA.crt")).unwrap();
    b.set_certificate_chain_file(dir.join("admin.crt")).unwrap();
    b.set_private_key_file(dir.join("admin.key"), SslFiletype::PEM)
        .unwrap();
    b.set_verify(SslVerifyMode::PEER);
    tweak(&mut b);
    let mut config = b.build().configure().unwrap();
    config.set_verify_hostname(false);
    let tcp = std::net::TcpStream::connect(addr).unwrap();
    config.connect("daos", tcp).is_ok()
}

#[tokio::test]
async fn admin_may_create_pools_and_agent_may_not() {
    let s = secure_engine();
    let admin = client(&s.engine.addr, &s.certs, "admin").unwrap();
    admin
        .pool_create(&PoolSpec::new("tank", PoolSize::total(1 << 30)))
        .await
        .unwrap();
    assert_eq!(admin.list_pools().await.unwrap().len(), 1);

    let agent = client(&s.engine.addr, &s.certs, "agent").unwrap();
    let err = agent
        .pool_create(&PoolSpec::new("sneaky", PoolSize::total(1 << 30)))
        .await
        .unwrap_err();
    assert!(matches!(err, DaosError::PermissionDenied { .. }), "{err:?}");
    assert!(matches!(
        agent.list_pools().await.unwrap_err(),
        DaosError::PermissionDenied { .. }
    ));
    // Agents may evict handles, as in DAOS.
    assert_eq!(agent.pool_evict("tank").await.unwrap(), 0);
    assert_eq!(
        admin.list_pools().await.unwrap().len(),
        1,
        "the agent created nothing"
    );
}

#[tokio::test]
async fn certificates_of_another_ca_are_refused() {
    let s = secure_engine();
    let other = tempfile::tempdir().unwrap();
    certs::generate(other.path()).unwrap();
    let stranger = client(&s.engine.addr, other.path(), "admin").unwrap();
    let err = stranger.list_pools().await.unwrap_err();
    assert!(matches!(err, DaosError::Unreachable { .. }), "{err:?}");
}

#[test]
fn only_tls12_with_the_daos_cipher_is_accepted() {
    let s = secure_engine();
    let addr = &s.engine.addr;
    assert!(
        raw_handshake(addr, &s.certs, |b| {
            b.set_max_proto_version(Some(SslVersion::TLS1_2)).unwrap();
            b.set_cipher_list("AES256-GCM-SHA384").unwrap();
        }),
        "the DAOS offer itself must work"
    );
    assert!(!raw_handshake(addr, &s.certs, |b| {
        b.set_min_proto_version(Some(SslVersion::TLS1_3)).unwrap();
    }));
    assert!(!raw_handshake(addr, &s.certs, |b| {
        b.set_max_proto_version(Some(SslVersion::TLS1_2)).unwrap();
        b.set_cipher_list(
            "ECDHE-RSA-AES256-GCM-SHA384:ECDHE-RSA-AES128-GCM-SHA256:AES128-GCM-SHA256",
        )
        .unwrap();
    }));
}

#[tokio::test]
async fn the_client_checks_the_server_cn() {
    let tmp = tempfile::tempdir().unwrap();
    let (dir, impostor) = (tmp.path().join("certs"), tmp.path().join("impostor"));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::create_dir_all(&impostor).unwrap();
    // One CA; the engine's serving certificate is valid for servers but its
    // CN is not "server".
    let ca = CertAuthority::new("DAOS CA").unwrap();
    ca.write(&dir).unwrap();
    ca.write(&impostor).unwrap();
    ca.write_component(&dir, "admin").unwrap();
    let (cert, key) = ca.issue_for("impostor", true).unwrap();
    certs::write_pair(&impostor, "server", &cert, &key).unwrap();
    let opts = EngineOpts {
        tls_dir: Some(impostor),
        ..Default::default()
    };
    let engine = EngineProcess::start(&tmp.path().join("data"), opts).unwrap();
    let err = client(&engine.addr, &dir, "admin")
        .unwrap()
        .list_pools()
        .await
        .unwrap_err();
    assert!(err.to_string().contains("not for \"server\""), "{err}");
}

#[tokio::test]
async fn insecure_clients_cannot_talk_to_a_secure_engine_but_insecure_mode_works() {
    let s = secure_engine();
    let plain = MgmtClient::new(ClientConfig::new(vec![s.engine.addr.clone()])).unwrap();
    assert!(plain.list_pools().await.is_err());

    let tmp = tempfile::tempdir().unwrap();
    let insecure = EngineProcess::start(tmp.path(), EngineOpts::default()).unwrap();
    insecure.client().list_pools().await.unwrap();
}

#[test]
fn loose_key_permissions_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    certs::generate(tmp.path()).unwrap();
    let key = tmp.path().join("admin.key");
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let err = client("127.0.0.1:1", tmp.path(), "admin").unwrap_err();
    assert!(
        matches!(&err, DaosError::Config(m) if m.contains("mode 644")),
        "{err:?}"
    );
}

#[test]
fn generated_certificates_have_daos_names() {
    let tmp = tempfile::tempdir().unwrap();
    let ca = CertAuthority::new("DAOS CA").unwrap();
    for component in ["admin", "agent", "server"] {
        let (cert, _) = ca.issue(component).unwrap();
        assert_eq!(
            dpufs_daos::tls::common_name(&cert).as_deref(),
            Some(component)
        );
        assert!(cert.verify(&ca.cert.public_key().unwrap()).unwrap());
    }
    certs::generate(tmp.path()).unwrap();
    let mode = |f: &str| {
        std::fs::metadata(tmp.path().join(f))
            .unwrap()
            .permissions()
            .mode()
            & 0o777
    };
    assert_eq!(
        (mode("admin.key"), mode("agent.key"), mode("server.key")),
        (0o440, 0o400, 0o400)
    );
    assert!(tmp.path().join("clients/agent.crt").exists());
}
