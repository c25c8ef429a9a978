//! What the Kubernetes directory answers, decided from the objects its caches hold (pure:
//! the caches' contents in, an answer out, so every rule is unit-tested here).
//!
//! - DaosSystem: its object name is the system's name in volume ids, topology and
//!   DaosPool `systemRef`; `spec.backend` says how nodes serve its volumes: at
//!   `spec.dataEndpoint` (the engine) or through DAOS's libdfs.
//! - DaosPool: its name and `status.uuid` (written by the operator); a pool without a
//!   UUID yet is not known.
//! - DaosTenant: the tenant of a namespace is the one tenant that claims it
//!   ([`dpufs_kube::tenant_claims`], the operator's rules); with its `principal` and
//!   `allowedPools`.

use super::{DirectoryError, PoolRef, Tenant, VolumeAccess};
use crate::csi::volume_id::valid_system_name;
use dpufs_api::{DaosBackend, DaosPool, DaosSystem, DaosTenant};
use dpufs_kube::{NamespaceView, principal_problem, tenant_claims};
use k8s_openapi::api::core::v1::Namespace;
use kube::ResourceExt;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

/// The system of requests that name none: the only DaosSystem there is.
pub fn default_system(systems: &[Arc<DaosSystem>]) -> Result<String, DirectoryError> {
    let mut names: Vec<String> = systems.iter().map(|s| s.name_any()).collect();
    names.sort();
    match names.as_slice() {
        [] => Err(DirectoryError::NoSystem),
        [name] => usable_name(name).map(|()| name.clone()),
        _ => Err(DirectoryError::SeveralSystems(names)),
    }
}

/// A DaosSystem name fits a volume id (1–15 characters; a Kubernetes object name may be
/// longer): such a system cannot carry volumes, and the administrator must rename it.
fn usable_name(name: &str) -> Result<(), DirectoryError> {
    if valid_system_name(name) {
        Ok(())
    } else {
        Err(DirectoryError::Unavailable(format!(
            "DaosSystem {name:?}: volume ids carry the DaosSystem's name, which must be 1 to 15 characters; give the DaosSystem a shorter name"
        )))
    }
}

/// The DaosSystem named `name`.
pub fn system<'a>(
    systems: &'a [Arc<DaosSystem>],
    name: &str,
) -> Result<&'a DaosSystem, DirectoryError> {
    systems
        .iter()
        .find(|s| s.name_any() == name)
        .map(|s| &**s)
        .ok_or_else(|| DirectoryError::UnknownSystem(name.to_string()))
}

/// `spec.dataEndpoint` as an address; the API server checks its form, so one that does
/// not parse is from before that rule and is ignored (the node then refuses to stage, as
/// for a system without one).
pub fn data_endpoint(sys: &DaosSystem) -> Option<SocketAddr> {
    let text = sys.spec.data_endpoint.as_deref()?;
    match text.parse() {
        Ok(addr) => Some(addr),
        Err(e) => {
            tracing::warn!(system = %sys.name_any(), data_endpoint = text, "ignoring a data endpoint that is not ip:port: {e}");
            None
        }
    }
}

/// How nodes serve the DaosSystem's volumes: its `backend`, with the engine's data endpoint
/// or DAOS's client libraries in `daos_lib` (the plugin's `--daos-lib`).
pub fn volume_access(
    sys: &DaosSystem,
    daos_lib: Option<&Path>,
) -> Result<VolumeAccess, DirectoryError> {
    match sys.spec.backend {
        DaosBackend::Engine => Ok(VolumeAccess::Engine {
            data_endpoint: data_endpoint(sys),
        }),
        DaosBackend::Daos => daos_lib
            .map(|lib| VolumeAccess::Daos {
                lib: lib.to_path_buf(),
            })
            .ok_or_else(|| {
                DirectoryError::Unavailable(format!(
                    "DaosSystem {:?} has backend: daos: start this plugin with --daos-lib DIR \
                     (the directory of DAOS's libdfs.so)",
                    sys.name_any()
                ))
            }),
    }
}

/// The pool of a DaosPool, if it is in `system` and has a UUID.
fn pool_ref(pool: &DaosPool, system: &str) -> Option<PoolRef> {
    if pool.spec.system_ref != system {
        return None;
    }
    let text = pool.status.as_ref()?.uuid.as_deref()?;
    match text.parse() {
        Ok(uuid) => Some(PoolRef {
            name: pool.name_any(),
            uuid,
        }),
        Err(e) => {
            tracing::warn!(pool = %pool.name_any(), uuid = text, "ignoring a DaosPool whose status.uuid is not a UUID: {e}");
            None
        }
    }
}

/// The DaosPool `name` of `system`; unknown when it does not exist, is in another system,
/// or has no UUID yet (the operator has not created it).
pub fn pool(pools: &[Arc<DaosPool>], system: &str, name: &str) -> Result<PoolRef, DirectoryError> {
    pools
        .iter()
        .filter(|p| p.name_any() == name)
        .find_map(|p| pool_ref(p, system))
        .ok_or_else(|| DirectoryError::UnknownPool {
            system: system.to_string(),
            pool: name.to_string(),
        })
}

/// Every DaosPool of `system` that has a UUID, by name.
pub fn pools(pools: &[Arc<DaosPool>], system: &str) -> Vec<PoolRef> {
    let mut out: Vec<PoolRef> = pools.iter().filter_map(|p| pool_ref(p, system)).collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// What the directory knows of a namespace: the cached Namespace, or (one the watch has
/// not delivered yet) a namespace without labels, which tenants naming it claim.
pub fn namespace_view(cached: Option<&Namespace>, name: &str) -> NamespaceView {
    match cached {
        Some(ns) => NamespaceView::from(ns),
        None => NamespaceView {
            name: name.to_string(),
            ..NamespaceView::default()
        },
    }
}

/// The tenant of `ns`: the one DaosTenant that claims it. Tenants whose selector
/// Kubernetes would refuse claim nothing (the operator reports them `InvalidSelector`).
/// Two tenants claiming the namespace, or its tenant's principal being unusable, is a
/// configuration error the administrator must fix: no volume is granted to either.
pub fn tenant_of(
    tenants: &[Arc<DaosTenant>],
    ns: &NamespaceView,
) -> Result<Tenant, DirectoryError> {
    let mut claiming: Vec<&DaosTenant> = tenants
        .iter()
        .filter(|t| match tenant_claims(&t.spec, ns) {
            Ok(claims) => claims,
            Err(e) => {
                tracing::debug!(tenant = %t.name_any(), "a tenant with an invalid selector claims nothing: {e}");
                false
            }
        })
        .map(|t| &**t)
        .collect();
    claiming.sort_by_key(|t| t.name_any());
    match claiming.as_slice() {
        [] => Err(DirectoryError::NoTenant(ns.name.clone())),
        [t] => usable_tenant(t),
        several => Err(DirectoryError::Unavailable(format!(
            "namespace {:?} is claimed by several DaosTenants ({}); a namespace must belong to one tenant",
            ns.name,
            several
                .iter()
                .map(|t| t.name_any())
                .collect::<Vec<_>>()
                .join(", ")
        ))),
    }
}

/// The default tenant (`--default-tenant`): for requests that name no namespace.
pub fn default_tenant(
    tenants: &[Arc<DaosTenant>],
    configured: Option<&str>,
) -> Result<Tenant, DirectoryError> {
    let name = configured.ok_or(DirectoryError::NoDefaultTenant)?;
    match tenants.iter().find(|t| t.name_any() == name) {
        Some(t) => usable_tenant(t),
        None => {
            tracing::warn!(
                tenant = name,
                "the default tenant has no DaosTenant; requests without a namespace are refused"
            );
            Err(DirectoryError::NoDefaultTenant)
        }
    }
}

fn usable_tenant(t: &DaosTenant) -> Result<Tenant, DirectoryError> {
    if let Some(problem) = principal_problem(&t.spec.principal) {
        return Err(DirectoryError::Unavailable(format!(
            "DaosTenant {:?}: {problem}",
            t.name_any()
        )));
    }
    Ok(Tenant {
        name: t.name_any(),
        principal: t.spec.principal.clone(),
        allowed_pools: t.spec.allowed_pools.clone(),
        uid: t.spec.uid,
    })
}

/// The DaosTenant named `name`, if there is one.
pub fn tenant_named(
    tenants: &[Arc<DaosTenant>],
    name: &str,
) -> Result<Option<Tenant>, DirectoryError> {
    tenants
        .iter()
        .find(|t| t.name_any() == name)
        .map(|t| usable_tenant(t))
        .transpose()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const P1: &str = "6f1c2d1e-3a4b-4c5d-8e9f-0a1b2c3d4e5f";
    const P2: &str = "0b8a9c55-1d2e-4f60-9a7b-8c9d0e1f2a3b";

    fn object<K: serde::de::DeserializeOwned>(v: serde_json::Value) -> Arc<K> {
        Arc::new(serde_json::from_value(v).unwrap())
    }

    fn system_named(name: &str, data_endpoint: Option<&str>) -> Arc<DaosSystem> {
        let mut spec =
            json!({"endpoints": ["10.0.0.1:10001"], "version": "2.8.0", "insecure": true});
        if let Some(d) = data_endpoint {
            spec["dataEndpoint"] = json!(d);
        }
        object(json!({"metadata": {"name": name}, "spec": spec}))
    }

    fn pool_obj(name: &str, system: &str, uuid: Option<&str>) -> Arc<DaosPool> {
        let mut v = json!({
            "metadata": {"name": name},
            "spec": {"systemRef": system, "size": {"totalBytes": "1Ti"}}
        });
        if let Some(u) = uuid {
            v["status"] = json!({"uuid": u});
        }
        object(v)
    }

    fn tenant_obj(name: &str, spec: serde_json::Value) -> Arc<DaosTenant> {
        object(json!({"metadata": {"name": name}, "spec": spec}))
    }

    fn ns(name: &str, labels: serde_json::Value) -> Namespace {
        serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}})).unwrap()
    }

    fn tenants() -> Vec<Arc<DaosTenant>> {
        vec![
            tenant_obj(
                "team-a",
                json!({"namespaces": ["ns-a", "ns-a2"], "principal": "team-a@", "allowedPools": ["fast"]}),
            ),
            tenant_obj(
                "team-r",
                json!({"namespaceSelector": {"matchLabels": {"dpufs.io/tenant": "r"}},
                       "principal": "team-r@", "allowedPools": ["fast", "bulk"], "uid": 30001}),
            ),
            tenant_obj(
                "broken-selector",
                json!({"namespaceSelector": {"matchExpressions": [{"key": "k", "operator": "In"}]},
                       "principal": "broken@", "allowedPools": ["fast"]}),
            ),
        ]
    }

    #[test]
    fn tenants_are_found_by_name_with_their_uid() {
        let t = tenants();
        assert_eq!(
            tenant_named(&t, "team-r").unwrap().unwrap().uid,
            Some(30001)
        );
        assert_eq!(tenant_named(&t, "team-a").unwrap().unwrap().uid, None);
        assert_eq!(tenant_named(&t, "gone").unwrap(), None);
    }

    #[test]
    fn the_default_system_is_the_only_one() {
        assert_eq!(default_system(&[]), Err(DirectoryError::NoSystem));
        let one = [system_named("daos", None)];
        assert_eq!(default_system(&one).unwrap(), "daos");
        let two = [system_named("zeta", None), system_named("alpha", None)];
        assert_eq!(
            default_system(&two),
            Err(DirectoryError::SeveralSystems(vec![
                "alpha".into(),
                "zeta".into()
            ]))
        );
        let long = [system_named("a-very-long-system-name", None)];
        assert!(matches!(
            default_system(&long),
            Err(DirectoryError::Unavailable(m)) if m.contains("1 to 15 characters")
        ));
        assert_eq!(system(&two, "alpha").unwrap().name_any(), "alpha");
        assert_eq!(
            system(&two, "daos").unwrap_err(),
            DirectoryError::UnknownSystem("daos".into())
        );
    }

    #[test]
    fn data_endpoints_are_addresses() {
        let sys = system_named("daos", Some("10.0.0.5:7000"));
        assert_eq!(data_endpoint(&sys), Some("10.0.0.5:7000".parse().unwrap()));
        let v6 = system_named("daos", Some("[fd00::5]:7000"));
        assert_eq!(data_endpoint(&v6), Some("[fd00::5]:7000".parse().unwrap()));
        assert_eq!(data_endpoint(&system_named("daos", None)), None);
        assert_eq!(
            data_endpoint(&system_named("daos", Some("engine-0:7000"))),
            None,
            "a host name from before the schema rule"
        );
    }

    #[test]
    fn the_backend_decides_how_nodes_serve_volumes() {
        let engine = system_named("daos", Some("10.0.0.5:7000"));
        let endpoint = Some("10.0.0.5:7000".parse().unwrap());
        for lib in [None, Some(Path::new("/opt/daos/lib"))] {
            assert_eq!(
                volume_access(&engine, lib).unwrap(),
                VolumeAccess::Engine {
                    data_endpoint: endpoint
                }
            );
        }
        let mut daos = (*engine).clone();
        daos.spec.backend = DaosBackend::Daos;
        assert_eq!(
            volume_access(&daos, Some(Path::new("/opt/daos/lib"))).unwrap(),
            VolumeAccess::Daos {
                lib: "/opt/daos/lib".into()
            }
        );
        let err = volume_access(&daos, None).unwrap_err();
        assert!(err.to_string().contains("--daos-lib"), "{err}");
    }

    #[test]
    fn pools_are_known_once_they_have_a_uuid() {
        let all = [
            pool_obj("fast", "daos", Some(P1)),
            pool_obj("bulk", "daos", Some(P2)),
            pool_obj("pending", "daos", None),
            pool_obj("elsewhere", "other", Some(P1)),
            pool_obj("garbled", "daos", Some("not-a-uuid")),
        ];
        assert_eq!(
            pool(&all, "daos", "fast").unwrap(),
            PoolRef {
                name: "fast".into(),
                uuid: P1.parse().unwrap()
            }
        );
        for name in ["pending", "elsewhere", "garbled", "missing"] {
            assert_eq!(
                pool(&all, "daos", name),
                Err(DirectoryError::UnknownPool {
                    system: "daos".into(),
                    pool: name.into()
                }),
                "{name}"
            );
        }
        let names: Vec<String> = pools(&all, "daos").into_iter().map(|p| p.name).collect();
        assert_eq!(names, ["bulk", "fast"]);
        assert_eq!(pools(&all, "other").len(), 1);
        assert!(pools(&all, "none").is_empty());
    }

    #[test]
    fn a_namespace_belongs_to_the_tenant_that_names_or_selects_it() {
        let t = tenants();
        let named = namespace_view(Some(&ns("ns-a2", json!({}))), "ns-a2");
        let tenant = tenant_of(&t, &named).unwrap();
        assert_eq!(
            tenant,
            Tenant {
                name: "team-a".into(),
                principal: "team-a@".into(),
                allowed_pools: vec!["fast".into()],
                uid: None,
            }
        );
        let labelled = namespace_view(Some(&ns("ml", json!({"dpufs.io/tenant": "r"}))), "ml");
        assert_eq!(tenant_of(&t, &labelled).unwrap().principal, "team-r@");
        let other = namespace_view(Some(&ns("ml", json!({"dpufs.io/tenant": "s"}))), "ml");
        assert_eq!(
            tenant_of(&t, &other),
            Err(DirectoryError::NoTenant("ml".into()))
        );
        // Not in the cache yet: names match, labels are not known.
        assert_eq!(
            tenant_of(&t, &namespace_view(None, "ns-a")).unwrap().name,
            "team-a"
        );
        assert_eq!(
            tenant_of(&t, &namespace_view(None, "ml")),
            Err(DirectoryError::NoTenant("ml".into()))
        );
        // Going away: no new volumes, no new pods.
        let mut dying = ns("ns-a", json!({}));
        dying.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::now(),
            ));
        assert_eq!(
            tenant_of(&t, &namespace_view(Some(&dying), "ns-a")),
            Err(DirectoryError::NoTenant("ns-a".into()))
        );
    }

    #[test]
    fn conflicts_and_unusable_principals_grant_nothing() {
        let mut t = tenants();
        t.push(tenant_obj(
            "team-a-too",
            json!({"namespaces": ["ns-a"], "principal": "intruder@", "allowedPools": ["fast"]}),
        ));
        let e = tenant_of(&t, &namespace_view(None, "ns-a")).unwrap_err();
        assert!(
            matches!(&e, DirectoryError::Unavailable(m) if m.contains("\"ns-a\"") && m.contains("team-a, team-a-too")),
            "{e}"
        );
        assert_eq!(
            tenant_of(&t, &namespace_view(None, "ns-a2")).unwrap().name,
            "team-a",
            "the other namespace is still team-a's alone"
        );
        let special = [tenant_obj(
            "everyone",
            json!({"namespaces": ["ns-e"], "principal": "EVERYONE@", "allowedPools": ["fast"]}),
        )];
        let e = tenant_of(&special, &namespace_view(None, "ns-e")).unwrap_err();
        assert!(
            matches!(&e, DirectoryError::Unavailable(m) if m.contains("special DAOS principal")),
            "{e}"
        );
    }

    #[test]
    fn the_default_tenant_is_configured_by_name() {
        let t = tenants();
        assert_eq!(default_tenant(&t, Some("team-r")).unwrap().name, "team-r");
        assert_eq!(
            default_tenant(&t, None),
            Err(DirectoryError::NoDefaultTenant)
        );
        assert_eq!(
            default_tenant(&t, Some("gone")),
            Err(DirectoryError::NoDefaultTenant)
        );
    }
}
