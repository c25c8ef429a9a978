"""What the docs ask of the chart's node DaemonSets, checked on a rendering by tools/chart/check.py.

The host-mode node plugin (`dpufs-csi node`; docs/csi.md, docs/keeper.md) and, in DPU mode
(docs/dpu.md), the agent on each DPU (`dpufs-csi dpu-agent`) and the CSI shim on each host
(`dpufs-csi node --mode dpu-host`). Besides each pod's settings it checks what DPU mode promises
the host: the shim holds no key (neither the node agent's signing key nor the control channel's
agent key), no DAOS certificate, no fabric, and reads no Secret.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

Expect = Callable[[bool, str], None]

# The files each side of the control channel mounts from its Secret, and nothing else.
AGENT_TLS_FILES = {"ca.crt", "agent.crt", "agent.key"}
HOST_TLS_FILES = {"ca.crt", "host.crt", "host.key"}
DPF_SOCKET = "/var/lib/nvidia/storage/snap/plugins/dfs.dpufs.io/dpu.sock"


@dataclass
class NodePod:
    """A node DaemonSet: its role (node, agent or shim), pod spec and main container."""

    role: str
    ds: dict
    spec: dict
    main: dict

    @property
    def name(self) -> str:
        meta = self.ds["metadata"]
        return f"DaemonSet/{meta.get('namespace')}/{meta['name']}"

    @property
    def args(self) -> dict[str, str]:
        """--flag -> value ("" for a flag without one)."""
        out = {}
        for a in map(str, self.main.get("args") or []):
            flag, _, value = a.partition("=")
            out[flag] = value
        return out

    def volumes(self) -> dict[str, dict]:
        return {v["name"]: v for v in self.spec.get("volumes") or []}

    def mounts(self) -> dict[str, dict]:
        return {m["mountPath"]: m for m in self.main.get("volumeMounts") or []}

    def host_path(self, path: str) -> dict | None:
        """The hostPath volume of `path` when the main container mounts it at the same path."""
        for v in self.volumes().values():
            if (v.get("hostPath") or {}).get("path") == path and path in self.mounts():
                return v
        return None

    def secret_files(self) -> dict[str, tuple[str, set[str]]]:
        """Volume name -> (Secret, the keys it projects) of every Secret volume."""
        out = {}
        for name, v in self.volumes().items():
            if "secret" in v:
                items = v["secret"].get("items")
                keys = {i["key"] for i in items} if items else {"(every key)"}
                out[name] = (v["secret"]["secretName"], keys)
        return out

    def env_field(self, name: str) -> str | None:
        env = {e["name"]: e for e in self.main.get("env") or []}
        return (((env.get(name) or {}).get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath")


def node_pods(objs: list[dict]) -> list[NodePod]:
    pods = []
    for ds in (o for o in objs if o["kind"] == "DaemonSet"):
        spec = ds["spec"]["template"]["spec"]
        for c in spec.get("containers") or []:
            args = [str(a) for a in c.get("args") or []]
            if args[:1] == ["dpu-agent"]:
                pods.append(NodePod("agent", ds, spec, c))
            elif args[:1] == ["node"]:
                pods.append(NodePod("shim" if "--mode=dpu-host" in args else "node", ds, spec, c))
    return pods


def check(expect: Expect, objs: list[dict], values: dict) -> None:
    node = values["node"]
    dpu = node["mode"] == "dpu"
    dpu_service = dpu and node["dpu"]["dpf"]["dpuServiceOnly"]
    pods = node_pods(objs)
    roles = sorted(p.role for p in pods)
    want = ["node"] if not dpu else ["agent"] if dpu_service else ["agent", "shim"]
    expect(roles == want, f"node DaemonSets with node.mode={node['mode']}: {want} (rendered: {roles})")
    if dpu_service:
        workloads = sorted(f"{o['kind']}/{o['metadata']['name']}" for o in objs
                           if o["kind"] in ("DaemonSet", "Deployment", "StatefulSet", "Job", "Pod"))
        expect(len(workloads) == 1, f"DPF's DPUService is a chart with exactly one DaemonSet (rendered: {workloads})")
        follows_service_daemonset(expect, [p for p in pods if p.role == "agent"], values["serviceDaemonSet"])
        for p in (p for p in pods if p.role == "agent"):
            account = p.spec["serviceAccountName"]
            got = bindings_of(objs, account)
            expect(got == {"dpu-agent-node"}, f"ServiceAccount {account}: in the DPU cluster bound only to "
                                              f"dpu-agent-node, its own Node (got {sorted(got)})")
    for p in pods:
        common(expect, p)
        {"node": host_mode_node, "agent": agent, "shim": shim}[p.role](expect, p, values)
    if dpu and not dpu_service:
        shim_reads_nothing(expect, objs, values)
        hook_makes_the_channel(expect, objs, pods, values)


def follows_service_daemonset(expect: Expect, agents: list[NodePod], sds: dict) -> None:
    """DPF's spec.serviceDaemonSet values reach the DaemonSet: where it runs, its update strategy,
    labels, annotations and resources."""
    for p in agents:
        pod_meta = p.ds["spec"]["template"]["metadata"]
        required = (((p.spec.get("affinity") or {}).get("nodeAffinity") or {})
                    .get("requiredDuringSchedulingIgnoredDuringExecution"))
        res = p.main.get("resources") or {}
        checks = {
            "nodeSelector": lambda v: required == v,
            "updateStrategy": lambda v: p.ds["spec"].get("updateStrategy") == v,
            "labels": lambda v: v.items() <= (pod_meta.get("labels") or {}).items()
            and v.items() <= (p.ds["metadata"].get("labels") or {}).items(),
            "annotations": lambda v: v.items() <= (pod_meta.get("annotations") or {}).items(),
            "resources": lambda v: v.items() <= (res.get("requests") or {}).items()
            and v.items() <= (res.get("limits") or {}).items(),
        }
        for key, value in sds.items():
            expect(checks[key](value), f"{p.name}: DPF's serviceDaemonSet.{key} is applied")


def common(expect: Expect, p: NodePod) -> None:
    expect((p.main.get("securityContext") or {}).get("privileged") is True, f"{p.name}: privileged (mount(2))")
    expect(p.spec.get("priorityClassName") == "system-node-critical", f"{p.name}: priorityClassName system-node-critical")
    expect(p.env_field("NODE_ID") == "spec.nodeName", f"{p.name}: NODE_ID from spec.nodeName")
    expect(p.spec.get("hostNetwork") is True, f"{p.name}: the host's network")


def staging(expect: Expect, p: NodePod) -> None:
    """What the host-mode node plugin and the DPU agent need alike: they run the keeper and the
    workers."""
    a = p.args
    keeper = a.get("--keeper-start", "auto")
    expect(keeper not in ("auto", "detach") or p.spec.get("hostPID") is True,
           f"{p.name}: hostPID with --keeper-start {keeper} (docs/keeper.md)")
    state = a.get("--state-dir", "/var/lib/dpufs")
    expect(bool(p.host_path(state)), f"{p.name}: the state directory {state} is a hostPath")
    expect(bool(p.host_path("/sys/fs/cgroup")), f"{p.name}: /sys/fs/cgroup from the host")
    fabric = a.get("--fabric-dir")
    expect(fabric is not None and bool(p.host_path(fabric)), f"{p.name}: the software fabric directory is a hostPath")
    expect(a.get("--directory") == "kubernetes", f"{p.name}: --directory=kubernetes")
    key = a.get("--agent-key")
    if key is not None:
        mount = p.mounts().get(key.rsplit("/", 1)[0]) or {}
        _, keys = p.secret_files().get(mount.get("name"), ("", set()))
        expect(keys == {"agent.key"}, f"{p.name}: --agent-key {key} is the agent key Secret's agent.key alone")


def kubelet_facing(expect: Expect, p: NodePod) -> None:
    """What a CSI node plugin kubelet talks to needs: the host-mode node plugin and the shim."""
    root = p.args.get("--mount-root", "/var/lib/kubelet")
    expect((p.mounts().get(root) or {}).get("mountPropagation") == "Bidirectional",
           f"{p.name}: kubelet's directory {root} mounted with Bidirectional propagation")
    sidecars = {c["name"]: c for c in p.spec.get("containers") or []}
    registrar = [str(a) for a in (sidecars.get("node-driver-registrar") or {}).get("args") or []]
    expect(f"--kubelet-registration-path={root}/plugins/dfs.dpufs.io/csi.sock" in registrar,
           f"{p.name}: node-driver-registrar registers {root}/plugins/dfs.dpufs.io/csi.sock with kubelet")


def host_mode_node(expect: Expect, p: NodePod, values: dict) -> None:
    staging(expect, p)
    kubelet_facing(expect, p)
    fuse = p.host_path("/dev/fuse")
    expect(bool(fuse) and fuse["hostPath"].get("type") == "CharDevice", f"{p.name}: /dev/fuse as a CharDevice hostPath")


def agent(expect: Expect, p: NodePod, values: dict) -> None:
    d = values["node"]["dpu"]
    a = p.args
    staging(expect, p)
    port = str(d["agent"]["port"])
    ports = {c.get("name"): c.get("containerPort") for c in p.main.get("ports") or []}
    expect(a.get("--listen", "").rsplit(":", 1)[-1] == port and ports.get("control") == d["agent"]["port"],
           f"{p.name}: --listen and the control port are node.dpu.agent.port {port}")
    if "$(NODE_IP)" in a.get("--listen", ""):
        expect(p.env_field("NODE_IP") == "status.hostIP", f"{p.name}: --listen on NODE_IP from status.hostIP")
    expect(a.get("--attach") == d["agent"]["attach"], f"{p.name}: --attach={d['agent']['attach']}")
    files = channel_files(p)
    expect(files == AGENT_TLS_FILES, f"{p.name}: the control channel's Secret gives it {sorted(AGENT_TLS_FILES)} only (got {sorted(files)})")
    expect([a.get(f) for f in ("--tls-ca", "--tls-cert", "--tls-key")] ==
           ["/etc/dpufs/dpu/ca.crt", "/etc/dpufs/dpu/agent.crt", "/etc/dpufs/dpu/agent.key"],
           f"{p.name}: --tls-ca/--tls-cert/--tls-key are the channel's CA and the agent's pair")
    dpf = d["dpf"]["enabled"]
    sock = a.get("--dpf-socket")
    expect((sock == DPF_SOCKET) if dpf else sock is None,
           f"{p.name}: --dpf-socket {DPF_SOCKET} exactly when node.dpu.dpf.enabled ({dpf})")
    if dpf:
        expect(bool(p.host_path(DPF_SOCKET.rsplit("/", 1)[0])), f"{p.name}: the DPF plugin directory is a hostPath")
    kube = d["agent"]["kubeconfigSecret"]["name"]
    host_cluster = a.get("--host-cluster-kubeconfig")
    if kube:
        mounted = {m["mountPath"] for m in p.mounts().values()
                   if p.secret_files().get(m["name"], ("",))[0] == kube}
        expect(a.get("--directory") == "kubernetes" and host_cluster is not None
               and host_cluster.rsplit("/", 1)[0] in mounted
               and not any(e["name"] == "KUBECONFIG" for e in p.main.get("env") or [])
               and p.spec.get("automountServiceAccountToken") is not False,
               f"{p.name}: the pod checks and the directory go to the host cluster through "
               f"--host-cluster-kubeconfig (Secret {kube}); its own Node through its ServiceAccount here")
    else:
        expect(host_cluster is None,
               f"{p.name}: no --host-cluster-kubeconfig without node.dpu.agent.kubeconfigSecret: one cluster")
    expect(not any(m.get("mountPropagation") for m in p.mounts().values()),
           f"{p.name}: no kubelet directory (the DPU runs no pods of the host)")


def shim(expect: Expect, p: NodePod, values: dict) -> None:
    d = values["node"]["dpu"]
    a = p.args
    kubelet_facing(expect, p)
    expect(p.spec.get("hostPID") is not True, f"{p.name}: no hostPID (no keeper on the host)")
    files = channel_files(p)
    expect(files == HOST_TLS_FILES, f"{p.name}: the control channel's Secret gives it {sorted(HOST_TLS_FILES)} only (got {sorted(files)})")
    keys = {k for _, ks in p.secret_files().values() for k in ks}
    expect(not keys & {"agent.key", "admin.key", "server.key", "(every key)"},
           f"{p.name}: holds no agent key (the node agent's or the channel's) and no DAOS key (mounted: {sorted(keys)})")
    expect(not p.host_path("/dev/fuse") and not p.host_path(values["node"]["fabric"]["hostDir"]),
           f"{p.name}: no /dev/fuse and no fabric directory")
    expect(not {"--agent-key", "--directory", "--fabric-dir", "--tls-dir"} & set(a),
           f"{p.name}: no staging flags (--agent-key, --directory, --fabric-dir, --tls-dir)")
    expect(a.get("--tls-server-name") == d["tls"]["serverName"],
           f"{p.name}: --tls-server-name is node.dpu.tls.serverName {d['tls']['serverName']}")
    address = d["shim"]["agentAddress"]
    if address:
        expect(a.get("--dpu-agent") == address and p.spec.get("automountServiceAccountToken") is False,
               f"{p.name}: --dpu-agent={address}, and no API token (it calls no API)")
    else:
        expect("--dpu-agent" not in a and a.get("--dpu-agent-port") == str(d["agent"]["port"]),
               f"{p.name}: finds its DPU through the API server, --dpu-agent-port {d['agent']['port']}")


def channel_secrets(p: NodePod) -> dict[str, set[str]]:
    """The control channel's Secrets a pod mounts (those giving it the channel's ca.crt; the node
    agent's key Secret also has an agent.key), with the keys it takes from each."""
    return {s: keys for s, keys in p.secret_files().values() if "ca.crt" in keys}


def channel_files(p: NodePod) -> set[str]:
    return {k for keys in channel_secrets(p).values() for k in keys}


def bindings_of(objs: list[dict], account: str) -> set[str]:
    """The rbac-for labels of the roles bound to the ServiceAccount `account`."""
    roles = {(o["kind"], o["metadata"]["name"]): o for o in objs if o["kind"] in ("ClusterRole", "Role")}
    out = set()
    for b in (o for o in objs if o["kind"] in ("ClusterRoleBinding", "RoleBinding")):
        if any(s.get("name") == account for s in b.get("subjects") or []):
            role = roles.get((b["roleRef"]["kind"], b["roleRef"]["name"])) or {}
            out.add((role.get("metadata", {}).get("labels") or {}).get("dpufs.io/rbac-for", "?"))
    return out


def shim_reads_nothing(expect: Expect, objs: list[dict], values: dict) -> None:
    pods = {p.role: p for p in node_pods(objs)}
    shim_sa = pods["shim"].spec["serviceAccountName"]
    agent_sa = pods["agent"].spec["serviceAccountName"]
    want = set() if values["node"]["dpu"]["shim"]["agentAddress"] else {"dpu-shim"}
    got = bindings_of(objs, shim_sa)
    expect(got == want, f"ServiceAccount {shim_sa}: bound to {sorted(want)} only, no driver role (no Secret, no directory; got {sorted(got)})")
    got = bindings_of(objs, agent_sa)
    want = {"driver", "dpu-agent", "dpu-agent-node"}
    expect(got == want, f"ServiceAccount {agent_sa}: bound to the driver's and the agent's roles, "
                        f"{sorted(want)} (got {sorted(got)})")


def hook_makes_the_channel(expect: Expect, objs: list[dict], pods: list[NodePod], values: dict) -> None:
    """With node.dpu.tls.generate, the install hook makes the Secret the pods mount, its agent
    certificate for the name the shims check."""
    tls = values["node"]["dpu"]["tls"]
    secrets = {s for p in pods for s in channel_secrets(p)}
    expect(len(secrets) == 1, f"the agent and the shim mount one control-channel Secret (got {sorted(secrets)})")
    if tls["existingSecret"] or not tls["generate"]:
        return
    args = [str(a) for o in objs if o["kind"] == "Job"
            for c in o["spec"]["template"]["spec"]["containers"] for a in c.get("args") or []]
    expect({f"--dpu-secret={s}" for s in secrets} <= set(args) and f"--dpu-agent-host={tls['serverName']}" in args,
           f"the install hook makes the Secret {sorted(secrets)} with an agent certificate for {tls['serverName']}")
