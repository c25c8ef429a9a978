//! Prometheus metrics: reconciles, durations and errors per kind, pool capacity.

use crate::error::Error;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabels {
    kind: String,
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TierLabels {
    pool: String,
    tier: String,
}

/// The operator's metrics and their registry.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    reconciles: Family<KindLabels, Counter>,
    errors: Family<ErrorLabels, Counter>,
    durations: Family<KindLabels, Histogram>,
    total_bytes: Family<TierLabels, Gauge<u64, AtomicU64>>,
    free_bytes: Family<TierLabels, Gauge<u64, AtomicU64>>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("dpufs_operator");
        let reconciles = Family::<KindLabels, Counter>::default();
        let errors = Family::<ErrorLabels, Counter>::default();
        let durations = Family::<KindLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.005, 2.0, 14))
        });
        let total_bytes = Family::<TierLabels, Gauge<u64, AtomicU64>>::default();
        let free_bytes = Family::<TierLabels, Gauge<u64, AtomicU64>>::default();
        registry.register("reconciles", "Reconciles per kind", reconciles.clone());
        registry.register(
            "reconcile_errors",
            "Failed reconciles per kind and reason",
            errors.clone(),
        );
        registry.register(
            "reconcile_duration_seconds",
            "Reconcile durations per kind",
            durations.clone(),
        );
        registry.register(
            "pool_total_bytes",
            "Pool capacity per tier",
            total_bytes.clone(),
        );
        registry.register(
            "pool_free_bytes",
            "Pool free space per tier",
            free_bytes.clone(),
        );
        Metrics {
            registry,
            reconciles,
            errors,
            durations,
            total_bytes,
            free_bytes,
        }
    }
}

impl Metrics {
    /// Records one reconcile.
    pub fn observe(&self, kind: &str, took: Duration, err: Option<&Error>) {
        let k = KindLabels { kind: kind.into() };
        self.reconciles.get_or_create(&k).inc();
        self.durations.get_or_create(&k).observe(took.as_secs_f64());
        if let Some(e) = err {
            self.errors
                .get_or_create(&ErrorLabels {
                    kind: kind.into(),
                    reason: e.metric_label(kind).into(),
                })
                .inc();
        }
    }

    /// Sets a pool's capacity gauges.
    pub fn pool_capacity(&self, pool: &str, tiers: &[dpufs_api::TierUsage]) {
        for t in tiers {
            let l = TierLabels {
                pool: pool.into(),
                tier: t.media_type.clone(),
            };
            self.total_bytes.get_or_create(&l).set(t.total_bytes);
            self.free_bytes.get_or_create(&l).set(t.free_bytes);
        }
    }

    /// The OpenMetrics text of all metrics.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry).expect("encoding");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_reconciles_errors_and_capacity() {
        let m = Metrics::default();
        m.observe("DaosPool", Duration::from_millis(3), None);
        m.observe(
            "DaosPool",
            Duration::from_millis(3),
            Some(&Error::MissingUid),
        );
        m.pool_capacity(
            "p",
            &[dpufs_api::TierUsage {
                media_type: "NVME".into(),
                total_bytes: 100,
                free_bytes: 40,
            }],
        );
        let down = Error::Daos(dpufs_daos::DaosError::Unreachable {
            endpoints: "e:1".into(),
            cause: "refused".into(),
        });
        m.observe("DaosSystem", Duration::from_millis(3), Some(&down));
        m.observe("DaosPool", Duration::from_millis(3), Some(&down));
        let text = m.encode();
        assert!(
            text.contains("dpufs_operator_reconciles_total{kind=\"DaosPool\"} 3"),
            "{text}"
        );
        assert!(
            text.contains("{kind=\"DaosSystem\",reason=\"Unreachable\"} 1"),
            "a system's errors count under its own reasons: {text}"
        );
        assert!(
            text.contains("{kind=\"DaosPool\",reason=\"DaosUnavailable\"} 1"),
            "{text}"
        );
        assert!(text.contains("reason=\"KubernetesError\""), "{text}");
        assert!(
            text.contains("dpufs_operator_pool_free_bytes{pool=\"p\",tier=\"NVME\"} 40"),
            "{text}"
        );
    }
}

/// Serves `GET /metrics` (OpenMetrics text) and `GET /healthz` (200, or 503 with the
/// reason `liveness` gives) on `listener` with a minimal HTTP/1.1 responder, until the
/// task is dropped.
pub async fn serve(
    listener: tokio::net::TcpListener,
    metrics: std::sync::Arc<Metrics>,
    liveness: std::sync::Arc<crate::health::Liveness>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    loop {
        let Ok((mut sock, _)) = listener.accept().await else {
            continue;
        };
        let (metrics, liveness) = (metrics.clone(), liveness.clone());
        tokio::spawn(async move {
            let mut buf = vec![0u8; 4096];
            let mut n = 0;
            while n < buf.len() && !buf[..n].windows(4).any(|w| w == b"\r\n\r\n") {
                match tokio::time::timeout(Duration::from_secs(5), sock.read(&mut buf[n..])).await {
                    Ok(Ok(0)) | Ok(Err(_)) | Err(_) => return,
                    Ok(Ok(m)) => n += m,
                }
            }
            let head = String::from_utf8_lossy(&buf[..n]);
            let path = head.split_whitespace().nth(1).unwrap_or("/");
            let (status, ctype, body) = match path {
                "/metrics" => (
                    "200 OK",
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    metrics.encode(),
                ),
                "/healthz" => match liveness.check() {
                    Ok(()) => ("200 OK", "text/plain", "ok\n".to_string()),
                    Err(why) => ("503 Service Unavailable", "text/plain", format!("{why}\n")),
                },
                _ => ("404 Not Found", "text/plain", "not found\n".to_string()),
            };
            let resp = format!(
                "HTTP/1.1 {status}\r\ncontent-type: {ctype}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = sock.write_all(resp.as_bytes()).await;
        });
    }
}

#[cfg(test)]
mod serve_tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// `GET path` on `addr`: the whole response.
    async fn get(addr: std::net::SocketAddr, path: &str) -> String {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(format!("GET {path} HTTP/1.1\r\nhost: x\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let mut out = String::new();
        tokio::time::timeout(Duration::from_secs(5), s.read_to_string(&mut out))
            .await
            .unwrap()
            .unwrap();
        out
    }

    #[tokio::test]
    async fn serves_metrics_and_health_over_http() {
        let m = std::sync::Arc::new(Metrics::default());
        m.observe("DaosPool", Duration::from_millis(1), None);
        let liveness =
            std::sync::Arc::new(crate::health::Liveness::new(Duration::from_millis(300)));
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let server = tokio::spawn(serve(l, m, liveness.clone()));
        assert!(get(addr, "/healthz").await.starts_with("HTTP/1.1 200 OK"));
        tokio::time::sleep(Duration::from_millis(400)).await;
        let sick = get(addr, "/healthz").await;
        assert!(sick.starts_with("HTTP/1.1 503"), "{sick}");
        assert!(sick.contains("no answer from the Kubernetes API"), "{sick}");
        liveness.beat();
        assert!(get(addr, "/healthz").await.starts_with("HTTP/1.1 200 OK"));
        let out = get(addr, "/metrics").await;
        assert!(out.starts_with("HTTP/1.1 200 OK"), "{out}");
        assert!(
            out.contains("dpufs_operator_reconciles_total{kind=\"DaosPool\"} 1"),
            "{out}"
        );
        server.abort();
    }
}
