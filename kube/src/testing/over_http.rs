//! The fake served over plain HTTP/1.1, for processes under test: a kubeconfig whose
//! server is `http://127.0.0.1:<port>` points a real binary at it.

use super::FakeApiServer;
use http_body_util::BodyExt;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::task::{JoinHandle, JoinSet};

impl FakeApiServer {
    /// Serves this fake's state on `listener`, each connection (watches stay open) in a
    /// task of its own, until the returned task is aborted, which closes them all.
    pub fn serve_http(&self, listener: TcpListener) -> JoinHandle<()> {
        let fake = self.clone();
        tokio::spawn(async move {
            // Owned by the accept loop: aborting it drops the set and its connections.
            let mut connections = JoinSet::new();
            while let Ok((stream, _)) = listener.accept().await {
                let fake = fake.clone();
                let service = hyper::service::service_fn(move |req| {
                    let fake = fake.clone();
                    async move { fake.answer_http(req).await }
                });
                connections.spawn(async move {
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
                // Reap finished connections so the set does not grow with every request.
                while connections.try_join_next().is_some() {}
            }
        })
    }

    async fn answer_http(
        &self,
        req: http::Request<hyper::body::Incoming>,
    ) -> Result<http::Response<super::FakeBody>, hyper::Error> {
        let (parts, body) = req.into_parts();
        let content_type = parts
            .headers
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        let bytes = body.collect().await?.to_bytes();
        Ok(self.handle(parts.method, parts.uri, &content_type, bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::{Api, PostParams};
    use kube::runtime::watcher;

    /// A kube client of a process would reach the fake this way: over TCP, with a watch
    /// that streams what an in-process client writes.
    #[tokio::test]
    async fn a_client_over_http_sees_the_same_objects_and_watches() {
        use futures::StreamExt;
        let fake = FakeApiServer::new();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let server = fake.serve_http(listener);
        let config = kube::Config::new(url.parse().unwrap());
        let remote = kube::Client::try_from(config).unwrap();
        let local: Api<ConfigMap> = Api::namespaced(fake.client(), "ns");
        let remote: Api<ConfigMap> = Api::namespaced(remote, "ns");
        let mut cm = ConfigMap::default();
        cm.metadata.name = Some("first".into());
        local.create(&PostParams::default(), &cm).await.unwrap();
        assert_eq!(
            remote.list(&Default::default()).await.unwrap().items.len(),
            1
        );
        let mut events = std::pin::pin!(watcher(remote, watcher::Config::default()));
        let mut seen = Vec::new();
        while !seen.contains(&"second".to_string()) {
            match events.next().await.unwrap().unwrap() {
                watcher::Event::InitDone => {
                    cm.metadata.name = Some("second".into());
                    local.create(&PostParams::default(), &cm).await.unwrap();
                }
                watcher::Event::Apply(o) | watcher::Event::InitApply(o) => {
                    seen.push(o.metadata.name.unwrap());
                }
                _ => {}
            }
        }
        assert_eq!(seen, ["first", "second"]);
        server.abort();
    }
}
