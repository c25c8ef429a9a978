//! DAOS's pinned mutual TLS between the client and a real engine process,
//! with certificates generated at test time.

use dpufs_daos::certs::{self, CertAuthority};
use dpufs_daos::{ClientConfig, DaosError, MgmtClient, PoolSize, PoolSpec, TlsFiles};
use dpufs_e2e::percentile::p99;
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

/// A client configuration with the admin certificate, the offer changed by `tweak`.
fn admin_tls(
    dir: &Path,
    tweak: impl FnOnce(&mut openssl::ssl::SslConnectorBuilder),
) -> openssl::ssl::ConnectConfiguration {
    let mut b = SslConnector::builder(SslMethod::tls_client()).unwrap();
    b.set_ca_file(dir.join("daosCA.crt")).unwrap();
    b.set_certificate_chain_file(dir.join("admin.crt")).unwrap();
    b.set_private_key_file(dir.join("admin.key"), SslFiletype::PEM)
        .unwrap();
    b.set_verify(SslVerifyMode::PEER);
    tweak(&mut b);
    let mut config = b.build().configure().unwrap();
    config.set_verify_hostname(false);
    config
}

/// A raw TLS handshake with the admin certificate and a custom offer.
fn raw_handshake(
    addr: &str,
    dir: &Path,
    tweak: impl FnOnce(&mut openssl::ssl::SslConnectorBuilder),
) -> bool {
    let tcp = std::net::TcpStream::connect(addr).unwrap();
    admin_tls(dir, tweak).connect("daos", tcp).is_ok()
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

/// The engine's open descriptors.
fn fd_count(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// How long each of `n` pool listings takes, sorted.
async fn listing_latencies(admin: &MgmtClient, n: usize) -> Vec<std::time::Duration> {
    let mut all = Vec::with_capacity(n);
    for _ in 0..n {
        let t = std::time::Instant::now();
        admin
            .list_pools()
            .await
            .expect("an admin call while others misbehave");
        all.push(t.elapsed());
    }
    all.sort();
    all
}

/// Whether the peer closed `conn` (EOF or an error other than a timeout) within its read
/// timeout.
fn closed(mut conn: impl std::io::Read) -> bool {
    let mut buf = [0u8; 256];
    loop {
        match conn.read(&mut buf) {
            Ok(0) => return true,
            // A GOAWAY or a TLS alert before the close.
            Ok(_) => continue,
            Err(e) => {
                return !matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                );
            }
        }
    }
}

/// A TLS connection as the admin, finished, that has said nothing yet.
fn tls_connection(addr: &str, dir: &Path) -> openssl::ssl::SslStream<std::net::TcpStream> {
    let config = admin_tls(dir, |b| b.set_alpn_protos(b"\x02h2").unwrap());
    let tcp = std::net::TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    config.connect("daos", tcp).expect("the TLS handshake")
}

/// Slow and silent management clients (docs/reliability.md): connections that send nothing,
/// half a TLS ClientHello, a finished handshake and no HTTP/2, or HTTP/2 with a frame
/// claiming 16 MiB are all closed within the engine's setup bound (1 s here), the engine's
/// descriptors come back, and an admin client is served throughout.
#[tokio::test(flavor = "multi_thread")]
async fn silent_and_slow_clients_are_closed_at_the_bound_while_others_are_served() {
    use std::io::Write;
    let tmp = tempfile::tempdir().unwrap();
    let certs = tmp.path().join("certs");
    certs::generate(&certs).unwrap();
    let opts = EngineOpts {
        tls_dir: Some(certs.clone()),
        setup_timeout_ms: Some(1000),
        ..Default::default()
    };
    let engine = EngineProcess::start(&tmp.path().join("data"), opts).unwrap();
    let admin = client(&engine.addr, &certs, "admin").unwrap();
    let before = listing_latencies(&admin, 100).await;
    let fds_before = fd_count(engine.pid());

    let addr = engine.addr.clone();
    let connect = || {
        let c = std::net::TcpStream::connect(&addr).unwrap();
        c.set_read_timeout(Some(std::time::Duration::from_secs(10)))
            .unwrap();
        c
    };
    let silent: Vec<_> = (0..40).map(|_| connect()).collect();
    // A handshake record header announcing 512 bytes, and 5 of them.
    let half_hello: Vec<_> = (0..20)
        .map(|_| {
            let mut c = connect();
            c.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03])
                .unwrap();
            c
        })
        .collect();
    let started = std::time::Instant::now();
    let no_http2: Vec<_> = (0..20).map(|_| tls_connection(&addr, &certs)).collect();
    // HTTP/2 begun, then a frame header claiming 16 MiB (the largest a header can say).
    let huge_frame: Vec<_> = (0..5)
        .map(|_| {
            let mut c = tls_connection(&addr, &certs);
            c.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").unwrap();
            c.write_all(&[0xff, 0xff, 0xff, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01])
                .unwrap();
            c
        })
        .collect();
    let during = listing_latencies(&admin, 100).await;

    let all_closed = silent.into_iter().all(closed)
        && half_hello.into_iter().all(closed)
        && no_http2.into_iter().all(closed)
        && huge_frame.into_iter().all(closed);
    let waited = started.elapsed();
    assert!(all_closed, "every misbehaving connection is closed");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while fd_count(engine.pid()) > fds_before && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let fds_after = fd_count(engine.pid());
    eprintln!(
        "85 misbehaving connections closed within {waited:?}; admin list_pools p99 {:?} \
         before, {:?} during; engine descriptors {fds_before} before, {fds_after} after",
        p99(&before),
        p99(&during)
    );
    assert!(
        fds_after <= fds_before,
        "descriptors {fds_before} before, {fds_after} after"
    );
    // Closed at the bound, not at some later clean-up: 1 s, and the time to connect them all.
    assert!(waited < std::time::Duration::from_secs(8), "{waited:?}");
}
