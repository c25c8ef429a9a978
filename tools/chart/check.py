#!/usr/bin/env python3
"""Checks the Helm chart charts/dpufs; CI runs `python3 tools/chart/check.py`.

For every values file in charts/dpufs/ci/ it lints the chart, renders it for Kubernetes 1.33 and
1.36, and checks what comes out:

- every object against the Kubernetes API schemas (kubernetes-validate, strict: unknown fields are
  errors); dpufs.io objects against the openAPIV3Schema of the chart's CRDs (jsonschema, unknown
  fields refused, and the CRDs' `self.matches(...)` CEL rules as regular expressions);
- every flag the chart passes to a dpufs binary against that binary's `--help` (binaries from
  --bin-dir, default target/debug), and the sidecars' flags against a table of their flags;
- the RBAC: the rules of each ServiceAccount are printed, and the driver's and the operator's
  roles must grant exactly the calls in tools/chart/api-calls.yaml;
- what docs/csi.md, docs/keeper.md and docs/dpu.md ask of the objects (the CSIDriver, the node
  DaemonSets: the host-mode node plugin, DPU mode's agent and shim; tools/chart/node_pods.py).

It also checks that charts/dpufs/crds/ equals manifests/crds/, that the values schema refuses
bad values with a message naming them, and that the chart refuses values that do not fit
together. Exit status 0 when everything passes; otherwise 1, with what to fix.

Needs the PyPI packages helm-python-sdk, kubernetes-validate, jsonschema and PyYAML.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import yaml

import node_pods

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "dpufs"
API_CALLS = Path(__file__).resolve().parent / "api-calls.yaml"
NAMESPACE = "dpufs-system"
RELEASE = "dpufs"
KUBE_VERSIONS = ["1.33.0", "1.36.0"]
SNAPSHOT_CLASS_API = "snapshot.storage.k8s.io/v1/VolumeSnapshotClass"

# Kinds kubernetes-validate has no schema for and that no CRD of this repository describes.
SKIPPED_KINDS = {
    "VolumeSnapshotClass": "snapshot.storage.k8s.io is a CRD of the external-snapshotter project, "
    "not part of Kubernetes' API schemas and not in this repository",
}

# The dpufs image's entrypoint (docs/deploy.md), used when a container sets no command.
ENTRYPOINT = "dpufs-csi"
DPUFS_BINARIES = {"dpufs", "dpufs-csi", "dpufs-engine", "dpufs-operator"}
# Commands of the dpufs image that are not dpufs binaries, and why the chart runs them.
OTHER_COMMANDS = {
    "install": "coreutils install: copies the engine's TLS files with DAOS's file modes",
    "sh": "the helm test's shell script (write and read back a volume)",
    "chown": "coreutils chown: gives the engine's host directory to the engine's user",
}

# Flags of the kubernetes-csi sidecars, which cannot be run here. From their sources at the
# releases named (cmd/*/main.go, csi-lib-utils standardflags, k8s.io/component-base logs).
_STD = {
    "csi-address", "http-endpoint", "kube-api-burst", "kube-api-qps", "kubeconfig",
    "leader-election", "leader-election-labels", "leader-election-lease-duration",
    "leader-election-namespace", "leader-election-renew-deadline", "leader-election-retry-period",
    "metrics-address", "metrics-path", "version",
}
_LOGS = {
    "v", "vmodule", "logging-format", "log-flush-frequency", "log-json-info-buffer-size",
    "log-json-split-stream", "log-text-info-buffer-size", "log-text-split-stream", "automaxprocs",
}
_LOG_GATES = {"LoggingAlphaOptions", "LoggingBetaOptions", "ContextualLogging"}


@dataclass
class Sidecar:
    major: str  # the release line the table describes (the image tag must start with it)
    flags: set[str]
    gates: set[str] = field(default_factory=set)
    required: tuple[str, ...] = ("csi-address",)


SIDECARS = {
    "csi-provisioner": Sidecar(
        "v6",
        _STD | _LOGS | {
            "master", "volume-name-prefix", "volume-name-uuid-length", "retry-interval-start",
            "retry-interval-max", "worker-threads", "cloning-protection-threads",
            "snapshot-orphan-sweep-interval", "capacity-threads", "timeout", "strict-topology",
            "immediate-topology", "extra-create-metadata", "enable-pprof", "default-fstype",
            "kube-api-capacity-qps", "kube-api-capacity-burst", "enable-capacity",
            "capacity-for-immediate-binding", "capacity-poll-interval", "capacity-ownerref-level",
            "node-deployment", "node-deployment-immediate-binding", "node-deployment-base-delay",
            "node-deployment-max-delay", "controller-publish-readonly",
            "prevent-volume-mode-conversion", "feature-gates",
        },
        {"Topology", "CrossNamespaceVolumeDataSource", "VolumeAttributesClass",
         "ReleaseLeaderElectionOnExit"} | _LOG_GATES,
        ("csi-address", "leader-election"),
    ),
    "csi-snapshotter": Sidecar(
        "v8",
        _STD | _LOGS | {
            "resync-period", "snapshot-name-prefix", "snapshot-name-uuid-length", "worker-threads",
            "timeout", "extra-create-metadata", "retry-interval-start", "retry-interval-max",
            "node-deployment", "groupsnapshot-name-prefix", "groupsnapshot-name-uuid-length",
            "feature-gates",
        },
        {"CSIVolumeGroupSnapshot", "ReleaseLeaderElectionOnExit"} | _LOG_GATES,
        ("csi-address", "leader-election"),
    ),
    "csi-resizer": Sidecar(
        "v2",
        _STD | _LOGS | {
            "master", "resync-period", "workers", "extra-modify-metadata", "timeout",
            "retry-interval-start", "retry-interval-max", "handle-volume-inuse-error",
            "feature-gates",
        },
        {"AnnotateFsResize", "RecoverVolumeExpansionFailure", "VolumeAttributesClass",
         "ReleaseLeaderElectionOnExit"} | _LOG_GATES,
        ("csi-address", "leader-election"),
    ),
    "livenessprobe": Sidecar(
        "v2",
        _LOGS | {"csi-address", "health-port", "http-endpoint", "metrics-address", "metrics-path",
                 "probe-timeout"},
    ),
    "csi-node-driver-registrar": Sidecar(
        "v2",
        _LOGS | {"connection-timeout", "timeout", "csi-address", "plugin-registration-path",
                 "kubelet-registration-path", "health-port", "http-endpoint", "version", "mode",
                 "enable-pprof"},
        set(),
        ("csi-address", "kubelet-registration-path"),
    ),
}


# --- reporting -----------------------------------------------------------------------------------

class Report:
    def __init__(self) -> None:
        self.failures: list[str] = []
        self.passed = 0
        self.skipped: list[str] = []

    def ok(self, what: str, quiet: bool = True) -> None:
        self.passed += 1
        if not quiet:
            print(f"  ok    {what}")

    def fail(self, what: str) -> None:
        self.failures.append(what)
        print(f"  FAIL  {what}")

    def skip(self, what: str) -> None:
        self.skipped.append(what)
        print(f"  SKIP  {what}")


def section(title: str) -> None:
    print(f"\n=== {title}")


def loud(lines: list[str]) -> None:
    bar = "!" * 78
    print(bar)
    for line in lines:
        print(f"!!! {line}")
    print(bar)


# --- rendering -----------------------------------------------------------------------------------

def import_helm():
    try:
        import helm_python  # noqa: PLC0415
    except ImportError:
        sys.exit("tools/chart/check.py needs the PyPI package helm-python-sdk "
                 "(python3 -m pip install helm-python-sdk)")
    return helm_python


def render(helm, chart, values: dict, kube_version: str | None, api_versions: list[str]) -> dict[str, str]:
    """Renders offline. helm-python-sdk's Chart.render has no Capabilities options, but the library
    under it takes kube_version and api_versions; they are passed through its native call."""
    opts: dict[str, Any] = {"name": RELEASE, "namespace": NAMESPACE, "is_install": True}
    if kube_version:
        opts["kube_version"] = f"v{kube_version}"
    if api_versions:
        opts["api_versions"] = api_versions
    from helm_python import _native  # noqa: PLC0415
    out = _native.call_string("helm_render", chart._raw(), json.dumps(values), json.dumps(opts))
    return json.loads(out)


def objects_of(rendered: dict[str, str]) -> list[tuple[str, dict]]:
    objs = []
    for path, text in sorted(rendered.items()):
        if not path.endswith((".yaml", ".yml")):
            continue  # NOTES.txt
        for doc in yaml.safe_load_all(text):
            if doc:
                objs.append((path, doc))
    return objs


def name_of(obj: dict) -> str:
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace")
    return f"{obj.get('kind')}/{(ns + '/') if ns else ''}{meta.get('name')}"


# --- schemas -------------------------------------------------------------------------------------

def kubernetes_validator():
    try:
        import kubernetes_validate  # noqa: PLC0415
        from kubernetes_validate import utils  # noqa: PLC0415
    except ImportError:
        sys.exit("tools/chart/check.py needs the PyPI package kubernetes-validate "
                 "(python3 -m pip install kubernetes-validate)")
    # Each validate() reads the schema files again; the same few are read hundreds of times.
    utils.schema_contents = functools.lru_cache(maxsize=None)(utils.schema_contents)
    return kubernetes_validate, utils


def strict_schema(schema: Any) -> Any:
    """The CRD schema with unknown fields refused (the API server prunes or, with kubectl's
    strict field validation, refuses them), except where the schema preserves them."""
    if isinstance(schema, dict):
        out = {k: strict_schema(v) for k, v in schema.items()}
        if ("properties" in out and "additionalProperties" not in out
                and not out.get("x-kubernetes-preserve-unknown-fields")):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [strict_schema(v) for v in schema]
    return schema


def cel_string(literal: str) -> str:
    """The value of a CEL single-quoted string's body (the escapes the CRDs use)."""
    return re.sub(r"\\(.)", lambda m: m.group(1), literal)


MATCHES = re.compile(r"^self\.matches\('((?:[^'\\]|\\.)*)'\)$")


def cel_rules(schema: dict, value: Any, path: str, errors: list[str], counts: dict[str, int]) -> None:
    """Evaluates the rules of the form self.matches('re') where they apply; counts the others."""
    for rule in schema.get("x-kubernetes-validations") or []:
        m = MATCHES.match(rule.get("rule", "").strip())
        if m and isinstance(value, str):
            counts["evaluated"] += 1
            if not re.search(cel_string(m.group(1)), value):
                errors.append(f"{path}: {value!r} fails the CRD rule {rule['rule']}")
        else:
            counts["not evaluated"] += 1
    if isinstance(value, dict):
        for key, sub in (schema.get("properties") or {}).items():
            if key in value:
                cel_rules(sub, value[key], f"{path}.{key}", errors, counts)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            cel_rules(schema["items"], item, f"{path}[{i}]", errors, counts)


def crd_schemas(crd_dir: Path) -> dict[tuple[str, str], dict]:
    out = {}
    for f in sorted(crd_dir.glob("*.yaml")):
        crd = yaml.safe_load(f.read_text())
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        for v in crd["spec"]["versions"]:
            schema = dict(v["schema"]["openAPIV3Schema"])
            # The API server's own fields of every object, which CRD schemas leave out.
            schema["properties"] = {"apiVersion": {"type": "string"}, "kind": {"type": "string"},
                                    "metadata": {"type": "object"}, **schema.get("properties", {})}
            out[(f"{group}/{v['name']}", kind)] = schema
    return out


# --- the dpufs binaries' flags -------------------------------------------------------------------

@dataclass
class Option:
    takes_value: bool
    possible: list[str] = field(default_factory=list)
    env: str | None = None


@dataclass
class Help:
    commands: set[str]
    options: dict[str, Option]
    # Each entry: flags of which one must be given (one flag, or clap's `<--a <A>|--b <B>>` group).
    required: list[set[str]]


OPTION_LINE = re.compile(r"^\s{1,8}(?:-[A-Za-z], )?--([a-z0-9][a-z0-9-]*)(?:[ =](<[^>]+>|\[<[^>]+>\]))?")


def parse_help(text: str) -> Help:
    commands: set[str] = set()
    options: dict[str, Option] = {}
    lines = text.splitlines()
    in_commands = False
    current: str | None = None
    for line in lines:
        if re.match(r"^[A-Za-z ]*Commands:\s*$", line):
            in_commands, current = True, None
            continue
        if in_commands:
            m = re.match(r"^\s{2}([a-z][a-z0-9-]*)\s", line + " ")
            if m and not line.strip().startswith("-"):
                commands.add(m.group(1))
                continue
            if not line.strip():
                in_commands = False
            continue
        m = OPTION_LINE.match(line)
        if m:
            current = m.group(1)
            options[current] = Option(takes_value=m.group(2) is not None)
            rest = line[m.end():]
        elif current is not None and line.startswith(" "):
            rest = line
        else:
            current = None
            continue
        opt = options[current]
        env = re.search(r"\[env: ([A-Z0-9_]+)=", rest)
        if env:
            opt.env = env.group(1)
        pv = re.search(r"\[possible values: ([^\]]+)\]", rest)
        if pv:
            opt.possible = [p.strip() for p in pv.group(1).split(",")]
        item = re.match(r"^\s+- ([a-z0-9][a-z0-9-]*):", rest)
        if item:
            opt.possible.append(item.group(1))
    usage = next((line for line in lines if line.startswith("Usage:")), "")
    unbracketed = re.sub(r"\[[^\]]*\]", "", usage)
    required: list[set[str]] = []
    for group in USAGE_ONE_OF.findall(unbracketed):
        required.append(set(re.findall(r"--([a-z0-9][a-z0-9-]*)", group)))
    alone = USAGE_ONE_OF.sub("", unbracketed)
    required += [{flag} for flag in re.findall(r"--([a-z0-9][a-z0-9-]*)", alone)]
    return Help(commands, options, required)


# clap's usage of a required group: <--a <A>|--b <B>|--c> (one of them at least).
_USAGE_FLAG = r"--[a-z0-9][a-z0-9-]*(?: <[^<>|]+>)?"
USAGE_ONE_OF = re.compile(rf"<({_USAGE_FLAG}(?:\|{_USAGE_FLAG})+)>")


class Binaries:
    def __init__(self, bin_dir: Path) -> None:
        self.bin_dir = bin_dir
        self._cache: dict[tuple[str, ...], Help] = {}

    def present(self) -> list[str]:
        return [b for b in sorted(DPUFS_BINARIES) if not (self.bin_dir / b).is_file()]

    def help(self, path: tuple[str, ...]) -> Help:
        if path not in self._cache:
            exe = self.bin_dir / path[0]
            proc = subprocess.run([str(exe), *path[1:], "--help"], capture_output=True, text=True,
                                  timeout=30, env={**os.environ, "NO_COLOR": "1", "COLUMNS": "200"})
            if proc.returncode != 0:
                raise RuntimeError(f"{' '.join(path)} --help exited {proc.returncode}: {proc.stderr.strip()}")
            self._cache[path] = parse_help(proc.stdout)
        return self._cache[path]


def check_dpufs_container(report: Report, binaries: Binaries, where: str, container: dict) -> None:
    command = list(container.get("command") or [])
    args = [str(a) for a in container.get("args") or []]
    binary = os.path.basename(command[0]) if command else ENTRYPOINT
    tokens = [*command[1:], *args]
    if binary in OTHER_COMMANDS:
        print(f"  note  {where}: runs `{binary}` from the dpufs image ({OTHER_COMMANDS[binary]}); "
              f"not a dpufs binary, no flags to check")
        return
    if binary not in DPUFS_BINARIES:
        report.fail(f"{where}: runs {binary!r}, which is neither a dpufs binary nor a known command "
                    f"of the image; add it to OTHER_COMMANDS with a reason, or fix the command")
        return
    path: tuple[str, ...] = (binary,)
    try:
        h = binaries.help(path)
        while tokens and not tokens[0].startswith("-") and tokens[0] in h.commands:
            path = (*path, tokens.pop(0))
            h = binaries.help(path)
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
        report.fail(f"{where}: {e}")
        return
    if h.commands and (not tokens or tokens[0] not in h.commands) and len(path) == 1 and binary != "dpufs-engine":
        report.fail(f"{where}: `{binary}` needs a subcommand ({', '.join(sorted(h.commands))}); got {tokens[:1]}")
        return
    env_names = {e.get("name") for e in container.get("env") or []}
    seen: set[str] = set()
    bad = 0
    i = 0
    while i < len(tokens):
        t = tokens[i]
        if t == "--":
            break  # what follows is another program's arguments
        if t.startswith("--"):
            name, eq, value = t[2:].partition("=")
            opt = h.options.get(name)
            if opt is None:
                report.fail(f"{where}: `{' '.join(path)}` has no flag --{name} (see `{' '.join(path)} --help`)")
                bad += 1
            else:
                seen.add(name)
                if opt.takes_value and not eq:
                    if i + 1 >= len(tokens):
                        report.fail(f"{where}: --{name} needs a value")
                        bad += 1
                    else:
                        value = tokens[i + 1]
                        i += 1
                elif not opt.takes_value and eq:
                    report.fail(f"{where}: --{name} takes no value, got --{name}={value}")
                    bad += 1
                if opt.possible and "$(" not in value and value not in opt.possible:
                    report.fail(f"{where}: --{name}={value} is not one of {', '.join(opt.possible)}")
                    bad += 1
        elif t.startswith("-"):
            report.fail(f"{where}: short flag {t}: the chart uses long flags only")
            bad += 1
        i += 1
    for one_of in h.required:
        if one_of & seen:
            continue
        opts = [h.options.get(req) for req in one_of]
        if any(opt and opt.env and opt.env in env_names for opt in opts):
            continue
        report.fail(f"{where}: `{' '.join(path)}` requires {' or '.join('--' + r for r in sorted(one_of))}")
        bad += 1
    if not bad:
        report.ok(f"{where}: `{' '.join(path)}` with {len(seen)} flags")
        print(f"  ok    {where}: {' '.join(path)} ({', '.join('--' + s for s in sorted(seen))})")


def check_sidecar(report: Report, where: str, container: dict, image: str) -> None:
    repo, _, tag = image.rpartition(":")
    name = repo.rsplit("/", 1)[-1]
    table = SIDECARS.get(name)
    if table is None:
        report.fail(f"{where}: image {image} is neither the dpufs image nor a sidecar the checker "
                    f"knows ({', '.join(sorted(SIDECARS))}); add its flags to SIDECARS")
        return
    if not tag.startswith(table.major + "."):
        report.fail(f"{where}: {image}: the flag table of {name} is for {table.major}.x; check the "
                    f"new release's flags and update SIDECARS in tools/chart/check.py")
        return
    if not repo.startswith("registry.k8s.io/"):
        report.fail(f"{where}: {image}: sidecars come from registry.k8s.io")
    seen: set[str] = set()
    bad = 0
    for arg in [str(a) for a in (container.get("command") or [])[1:] + (container.get("args") or [])]:
        if not arg.startswith("--"):
            report.fail(f"{where}: argument {arg!r}: sidecar arguments are --flag or --flag=value")
            bad += 1
            continue
        flag_name, _, value = arg[2:].partition("=")
        seen.add(flag_name)
        if flag_name not in table.flags:
            report.fail(f"{where}: {name} {table.major} has no flag --{flag_name}")
            bad += 1
        if flag_name == "feature-gates":
            for gate in filter(None, value.split(",")):
                gname, _, gval = gate.partition("=")
                if gname not in table.gates or gval not in ("true", "false"):
                    report.fail(f"{where}: {name} has no feature gate {gate!r} "
                                f"(known: {', '.join(sorted(table.gates))})")
                    bad += 1
    for req in table.required:
        if req not in seen:
            report.fail(f"{where}: {name} runs without --{req}")
            bad += 1
    if not bad:
        report.ok(f"{where}: {name}")
        print(f"  ok    {where}: {name}:{tag} (flags from the table: {', '.join('--' + s for s in sorted(seen))})")


def pod_specs(obj: dict) -> Iterator[dict]:
    kind = obj.get("kind")
    spec = obj.get("spec") or {}
    if kind == "Pod":
        yield spec
    elif kind in ("Deployment", "DaemonSet", "StatefulSet", "ReplicaSet", "Job"):
        yield (spec.get("template") or {}).get("spec") or {}
    elif kind == "CronJob":
        yield ((spec.get("jobTemplate") or {}).get("spec") or {}).get("template", {}).get("spec") or {}


def containers_of(obj: dict) -> Iterator[tuple[str, dict]]:
    for spec in pod_specs(obj):
        for key in ("initContainers", "containers"):
            for c in spec.get(key) or []:
                yield f"{name_of(obj)}[{c.get('name')}]", c


# --- RBAC ----------------------------------------------------------------------------------------

def expand(rule: dict) -> Iterator[tuple[str, str, str]]:
    for g in rule.get("apiGroups") or [""]:
        for r in rule.get("resources") or []:
            for v in rule.get("verbs") or []:
                yield g, r, v


def check_rbac(report: Report, objs: list[dict], calls: dict, values: dict) -> None:
    by_kind: dict[str, list[dict]] = {}
    for o in objs:
        by_kind.setdefault(o["kind"], []).append(o)
    roles = {("ClusterRole", o["metadata"]["name"]): o for o in by_kind.get("ClusterRole", [])}
    roles.update({("Role", o["metadata"]["name"]): o for o in by_kind.get("Role", [])})
    accounts = {o["metadata"]["name"] for o in by_kind.get("ServiceAccount", [])}

    for o in [*by_kind.get("ClusterRole", []), *by_kind.get("Role", [])]:
        for rule in o.get("rules") or []:
            for key in ("apiGroups", "resources", "verbs"):
                if "*" in (rule.get(key) or []):
                    report.fail(f"{name_of(o)}: a wildcard in {key}: grant what is called, by name")

    grants: dict[str, list[str]] = {}
    for b in [*by_kind.get("ClusterRoleBinding", []), *by_kind.get("RoleBinding", [])]:
        ref = b["roleRef"]
        role = roles.get((ref["kind"], ref["name"]))
        if role is None:
            report.fail(f"{name_of(b)}: binds {ref['kind']} {ref['name']}, which the chart does not render")
            continue
        scope = "cluster-wide" if b["kind"] == "ClusterRoleBinding" else f"in namespace {b['metadata'].get('namespace')}"
        for s in b.get("subjects") or []:
            if s.get("kind") != "ServiceAccount":
                report.fail(f"{name_of(b)}: subject {s}: the chart binds its own ServiceAccounts only")
                continue
            if s["name"] not in accounts:
                report.fail(f"{name_of(b)}: ServiceAccount {s['name']} is not rendered")
            for rule in role.get("rules") or []:
                names = f" (only {', '.join(rule['resourceNames'])})" if rule.get("resourceNames") else ""
                groups = ",".join(g or "core" for g in rule.get("apiGroups") or [""])
                grants.setdefault(s["name"], []).append(
                    f"{groups:<22} {','.join(rule['resources']):<58} {','.join(rule['verbs'])}{names}  [{scope}, {role['metadata']['name']}]")
    for sa in sorted(grants):
        print(f"  ServiceAccount {sa}:")
        for line in grants[sa]:
            print(f"      {line}")

    conditions = rbac_conditions(objs, values)
    for component, spec in calls["components"].items():
        granted: dict[tuple[str, str, str], set[str]] = {}
        for (kind, _), role in roles.items():
            if (role["metadata"].get("labels") or {}).get("dpufs.io/rbac-for") != component:
                continue
            for rule in role.get("rules") or []:
                for t in expand(rule):
                    granted.setdefault(t, set()).add("cluster" if kind == "ClusterRole" else "namespace")
        expected: dict[tuple[str, str, str], str | None] = {}
        runs = conditions[spec["when"]] if "when" in spec else True
        for call in spec["calls"] if runs else []:
            if "when" in call and not conditions[call["when"]]:
                continue
            for v in call["verbs"]:
                expected[(call["group"], call["resource"], v)] = call.get("scope")
        extra = sorted(set(granted) - set(expected))
        missing = sorted(set(expected) - set(granted))
        for g, r, v in extra:
            report.fail(f"RBAC {component}: grants {v} on {g or 'core'}/{r}, which tools/chart/api-calls.yaml "
                        f"does not list: remove it from templates/rbac.yaml, or add the call (with its source) to the list")
        for g, r, v in missing:
            report.fail(f"RBAC {component}: {v} on {g or 'core'}/{r} is called (tools/chart/api-calls.yaml) "
                        f"but not granted: add it to templates/rbac.yaml")
        for t, scope in expected.items():
            if t in granted and scope and granted[t] != {scope}:
                report.fail(f"RBAC {component}: {t[2]} on {t[0] or 'core'}/{t[1]} is granted {sorted(granted[t])}, "
                            f"api-calls.yaml says {scope}")
        if not extra and not missing:
            report.ok(f"RBAC {component}")
            if not runs:
                print(f"  ok    RBAC {component}: not run with these values ({spec['when']} is false), nothing granted")
            else:
                print(f"  ok    RBAC {component}: exactly the {len(expected)} calls of api-calls.yaml"
                      f"{'' if conditions['tls-secret'] else ' (no TLS Secret: none read)'}")


def whole_chart(values: dict) -> bool:
    """Whether the values render the whole chart, not only the DPU agent as DPF's DPUService."""
    node = values["node"]
    return not (node["mode"] == "dpu" and node["dpu"]["dpf"]["dpuServiceOnly"])


def rbac_conditions(objs: list[dict], values: dict) -> dict[str, bool]:
    """The conditions `when` names in tools/chart/api-calls.yaml, for these values."""
    node = values["node"]
    dpu = node["mode"] == "dpu"
    whole = whole_chart(values)
    return {
        "tls-secret": any((o.get("spec") or {}).get("tls") for o in objs if o["kind"] == "DaosSystem"),
        "whole-chart": whole,
        "dpu-mode": dpu and whole,
        "dpu-agent-runs": dpu,
        "dpu-discovery": dpu and whole and not node["dpu"]["shim"]["agentAddress"],
    }


# --- what the docs ask of the objects ------------------------------------------------------------

def check_invariants(report: Report, objs: list[dict], values: dict) -> None:
    def expect(cond: bool, what: str) -> None:
        if cond:
            report.ok(what)
        else:
            report.fail(what)

    drivers = [o for o in objs if o["kind"] == "CSIDriver"]
    for d in drivers:
        s = d["spec"]
        expect(d["metadata"]["name"] == "dfs.dpufs.io", "CSIDriver is named dfs.dpufs.io")
        expect(s.get("attachRequired") is False, "CSIDriver attachRequired: false (no ControllerPublishVolume)")
        expect(s.get("podInfoOnMount") is True, "CSIDriver podInfoOnMount: true (the tenant check of NodePublishVolume)")
        expect(s.get("fsGroupPolicy") == "File", "CSIDriver fsGroupPolicy: File (the node plugin takes fsGroup as VOLUME_MOUNT_GROUP; kubelet walks nothing)")
        expect(s.get("volumeLifecycleModes") == ["Persistent"], "CSIDriver volumeLifecycleModes: [Persistent]")
        expect(s.get("requiresRepublish") is False, "CSIDriver requiresRepublish: false")
    for sc in (o for o in objs if o["kind"] == "StorageClass"):
        p = sc.get("parameters") or {}
        known = {"system", "pool", "provisioning", "objectClass", "directoryObjectClass",
                 "fileObjectClass", "chunkSize", "redundancyFactor"}
        expect(sc.get("provisioner") == "dfs.dpufs.io", f"{name_of(sc)}: provisioner dfs.dpufs.io")
        expect(set(p) <= known, f"{name_of(sc)}: only parameters docs/csi.md lists ({sorted(set(p) - known)} unknown)")
        expect(not (p.get("provisioning") == "pool" and "pool" in p), f"{name_of(sc)}: provisioning: pool names no pool")
        expect(sc.get("allowVolumeExpansion") is True, f"{name_of(sc)}: allowVolumeExpansion")
    node_pods.check(expect, objs, values)
    for _, c in (x for o in objs for x in containers_of(o)):
        if str(c.get("image", "")).rsplit(":", 1)[0].endswith("/csi-provisioner"):
            expect("--extra-create-metadata" in [str(a) for a in c.get("args") or []],
                   "csi-provisioner runs with --extra-create-metadata (the PVC namespace chooses the tenant)")


# --- the steps -----------------------------------------------------------------------------------

def check_crds(report: Report) -> None:
    section("CRDs: charts/dpufs/crds/ against manifests/crds/ (Helm never upgrades crds/)")
    src = {p.name: p.read_bytes() for p in (ROOT / "manifests" / "crds").glob("*.yaml")}
    dst = {p.name: p.read_bytes() for p in (CHART / "crds").glob("*.yaml")}
    fix = "cp manifests/crds/*.yaml charts/dpufs/crds/"
    for name in sorted(set(src) | set(dst)):
        if name not in dst:
            report.fail(f"charts/dpufs/crds/{name} is missing: {fix}")
        elif name not in src:
            report.fail(f"charts/dpufs/crds/{name} has no manifests/crds/{name}: remove it")
        elif src[name] != dst[name]:
            report.fail(f"charts/dpufs/crds/{name} differs from manifests/crds/{name}: {fix}")
        else:
            report.ok(f"crds/{name}", quiet=False)


def check_refusals(report: Report, helm, chart, base: dict) -> None:
    section("values the chart must refuse, with a message naming them")
    schema_cases = [
        ("an unknown node.mode", {"node": {"mode": "bluefield"}}, "/node/mode"),
        ("an agent port out of range", {"node": {"dpu": {"agent": {"port": 70000}}}}, "/node/dpu/agent/port"),
        ("an agent attach the chart does not offer", {"node": {"dpu": {"agent": {"attach": "qmp:/run/qmp.sock"}}}},
         "/node/dpu/agent/attach"),
        ("an agent address without a port", {"node": {"dpu": {"shim": {"agentAddress": "dpu-1"}}}},
         "/node/dpu/shim/agentAddress"),
        ("a server name that is no DNS name", {"node": {"dpu": {"tls": {"serverName": "DPU agent"}}}},
         "/node/dpu/tls/serverName"),
        ("an unknown key under node.dpu", {"node": {"dpu": {"agentPort": 9640}}}, "'agentPort'"),
        ("controller.replicas=-1", {"controller": {"replicas": -1}}, "/controller/replicas"),
        ("operator.replicas=-1", {"operator": {"replicas": -1}}, "/operator/replicas"),
        ("an unknown top-level key", {"storage": {"size": "1Ti"}}, "'storage'"),
        ("an unknown nested key", {"engine": {"replicas": 3}}, "'replicas'"),
        ("a DaosSystem name of 16 characters", {"daos": {"systemName": "a" * 16}}, "/daos/systemName"),
    ]
    for what, vals, needle in schema_cases:
        expect_refused(report, what, needle, helm.HelmValuesError, "accepted by values.schema.json",
                       lambda vals=vals: chart.validate_schema(merge(base, vals)))
    template_cases = [
        ("the engine with tls.generate=false and no Secret", {"tls": {"generate": False}}, "tls.existingSecret"),
        ("the engine with agentKey.generate=false and no Secret", {"agentKey": {"generate": False}},
         "agentKey.existingSecret"),
        ("an external system without endpoints", {"engine": {"enabled": False}}, "daos.endpoints"),
        ("an external TLS system without a Secret",
         {"engine": {"enabled": False}, "daos": {"insecure": False, "endpoints": ["10.0.0.1"]}}, "daos.tls.secretName"),
    ]
    dpu = {"node": {"mode": "dpu"}}
    dpu_service = merge(dpu, {"node": {"dpu": {"dpf": {"enabled": True, "dpuServiceOnly": True},
                                               "tls": {"existingSecret": "dpufs-dpu-certs"},
                                               "agent": {"kubeconfigSecret": {"name": "host-cluster"}}}},
                              "agentKey": {"existingSecret": "dpufs-agent-key"}})
    template_cases += [
        ("the DPF plugin in host mode", {"node": {"dpu": {"dpf": {"enabled": True}}}}, "node.mode=dpu"),
        ("DPF's serviceDaemonSet outside a DPUService", merge(dpu, {"serviceDaemonSet": {"labels": {"a": "b"}}}),
         "node.dpu.dpf.dpuServiceOnly=true"),
        ("DPF's DPUService alone in host mode", {"node": {"dpu": {"dpf": {"dpuServiceOnly": True}}}}, "node.mode=dpu"),
        ("DPU mode without the control channel's certificates",
         merge(dpu, {"node": {"dpu": {"tls": {"generate": False}}}}), "node.dpu.tls.existingSecret"),
        ("DPF's DPUService without the DPF plugin",
         merge(dpu_service, {"node": {"dpu": {"dpf": {"enabled": False}}}}), "node.dpu.dpf.enabled=true"),
        ("DPF's DPUService without the channel's Secret (no hook there)",
         merge(dpu_service, {"node": {"dpu": {"tls": {"existingSecret": ""}}}}), "node.dpu.tls.existingSecret"),
        ("DPF's DPUService without the agent key Secret (no hook there)",
         merge(dpu_service, {"agentKey": {"existingSecret": ""}}), "agentKey.existingSecret"),
        ("DPF's DPUService without the host cluster's kubeconfig",
         merge(dpu_service, {"node": {"dpu": {"agent": {"kubeconfigSecret": {"name": ""}}}}}),
         "node.dpu.agent.kubeconfigSecret.name"),
    ]
    for what, vals, needle in template_cases:
        expect_refused(report, what, needle, helm.HelmError, "rendered",
                       lambda vals=vals: render(helm, chart, merge(base, vals), KUBE_VERSIONS[0], []))


def expect_refused(report: Report, what: str, needle: str, error: type, accepted: str, attempt) -> None:
    """`attempt` must raise `error` with a message naming `needle`."""
    try:
        attempt()
    except error as e:
        msg = " ".join(str(e).split())
        if needle in msg:
            report.ok(what)
            print(f"  ok    {what}: refused: {msg[:160]}")
        else:
            report.fail(f"{what}: refused, but the message does not name {needle}: {msg}")
    else:
        report.fail(f"{what}: {accepted}; the chart must refuse it with a message")


def merge(a: dict, b: dict) -> dict:
    out = dict(a)
    for k, v in b.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def check_values_file(report: Report, helm, chart, kv, kv_utils, path: Path, binaries: Binaries | None,
                      calls: dict, crds: dict) -> None:
    section(f"values file {path.relative_to(ROOT)}")
    values = yaml.safe_load(path.read_text()) or {}
    for kube in KUBE_VERSIONS:
        lint = helm.lint(str(CHART), values, strict=True, namespace=NAMESPACE, kube_version=f"v{kube}")
        problems = [m for m in lint.get("messages", []) if m.get("severity", 0) >= 2] + \
                   [{"error": e} for e in lint.get("errors") or []]
        for m in problems:
            report.fail(f"helm lint (Kubernetes {kube}): {m.get('path', '')} {m['error']}")
        if not problems:
            report.ok(f"lint {kube}")
            infos = [m["error"] for m in lint.get("messages", []) if m.get("severity", 0) < 2]
            print(f"  ok    helm lint --strict (Kubernetes {kube})"
                  f"{' (info: ' + '; '.join(infos) + ')' if infos else ''}")
    try:
        chart.validate_schema(values)
        report.ok("schema", quiet=False)
    except helm.HelmValuesError as e:
        report.fail(f"values.schema.json refuses {path.name}: {e}")
        return
    merged = chart.merge_values(values)
    dpufs_repo = merged["image"]["repository"]

    objs_by_version: dict[str, list[dict]] = {}
    for kube in KUBE_VERSIONS:
        try:
            rendered = render(helm, chart, values, kube, [SNAPSHOT_CLASS_API])
            without = render(helm, chart, values, kube, [])
        except helm.HelmError as e:
            report.fail(f"render (Kubernetes {kube}): {e}")
            return
        objs = [o for _, o in objects_of(rendered)]
        objs_by_version[kube] = objs
        kinds_without = {o["kind"] for _, o in objects_of(without)}
        want_vsc = bool(merged["volumeSnapshotClass"]["enabled"]) and whole_chart(merged)
        has_vsc = any(o["kind"] == "VolumeSnapshotClass" for o in objs)
        if has_vsc == want_vsc and "VolumeSnapshotClass" not in kinds_without:
            report.ok("snapshot class guard")
        else:
            report.fail(f"VolumeSnapshotClass must render exactly when enabled and the cluster serves "
                        f"{SNAPSHOT_CLASS_API} (enabled={want_vsc}, with the API: {has_vsc}, without: "
                        f"{'VolumeSnapshotClass' in kinds_without})")
        counts: dict[str, int] = {"evaluated": 0, "not evaluated": 0}
        skipped: dict[str, int] = {}
        validated = 0
        for o in objs:
            key = (o.get("apiVersion"), o.get("kind"))
            if key in crds:
                import jsonschema  # noqa: PLC0415
                schema = strict_schema(crds[key])
                errors = [f"{'.'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}"
                          for e in jsonschema.Draft7Validator(schema).iter_errors(o)]
                cel_rules(crds[key], o, "", errors, counts)
                for err in errors:
                    report.fail(f"{name_of(o)} against its CRD schema (charts/dpufs/crds): {err}")
                if not errors:
                    validated += 1
                continue
            if o.get("kind") in SKIPPED_KINDS:
                skipped[o["kind"]] = skipped.get(o["kind"], 0) + 1
                continue
            try:
                kv_utils.validate(o, kube, strict=True)
                validated += 1
            except kv.ValidationError as e:
                where = ".".join(map(str, e.absolute_path)) or "(root)"
                report.fail(f"{name_of(o)} is not a valid Kubernetes {kube} object (strict): {where}: {e.message}")
            except kv_utils.SchemaNotFoundError as e:
                report.fail(f"{name_of(o)}: {e.message}; validate it against a CRD or list it in SKIPPED_KINDS with a reason")
        report.ok(f"validated {kube}")
        print(f"  ok    Kubernetes {kube}: {validated} of {len(objs)} objects valid (strict); CRD rules "
              f"(self.matches) evaluated: {counts['evaluated']}, other CEL rules not evaluated: {counts['not evaluated']}")
        for kind, n in skipped.items():
            report.skip(f"Kubernetes {kube}: {n} {kind} not validated: {SKIPPED_KINDS[kind]}")

    objs = objs_by_version[KUBE_VERSIONS[-1]]
    print("  --- flags")
    for o in objs:
        for where, c in containers_of(o):
            image = str(c.get("image", ""))
            if image.startswith(dpufs_repo + ":") or image == dpufs_repo:
                if binaries is None:
                    report.skip(f"{where}: flags not checked (--skip-flags)")
                else:
                    check_dpufs_container(report, binaries, where, c)
            else:
                check_sidecar(report, where, c, image)
    print("  --- RBAC (rules per ServiceAccount)")
    check_rbac(report, objs, calls, merged)
    print("  --- what docs/csi.md, docs/keeper.md and docs/dpu.md ask of the objects")
    before = len(report.failures)
    check_invariants(report, objs, merged)
    if len(report.failures) == before:
        print("  ok    CSIDriver, StorageClasses, node DaemonSets, provisioner metadata")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin-dir", default="target/debug",
                    help="where dpufs, dpufs-csi, dpufs-engine and dpufs-operator are (default: target/debug)")
    ap.add_argument("--skip-flags", action="store_true",
                    help="do not check the dpufs binaries' flags (when the binaries are not built)")
    args = ap.parse_args()
    started = time.monotonic()
    report = Report()

    helm = import_helm()
    kv, kv_utils = kubernetes_validator()
    import importlib.metadata as md  # noqa: PLC0415
    print(f"helm-python-sdk {md.version('helm-python-sdk')} (Helm {helm.helm_sdk_version()}), "
          f"kubernetes-validate {md.version('kubernetes-validate')}, jsonschema {md.version('jsonschema')}")
    have = kv_utils.all_versions()
    for kube in KUBE_VERSIONS:
        mm = kv_utils.major_minor(kube)
        if not any(kv_utils.major_minor(v) == mm for v in have):
            newest = kv_utils.latest_version()
            loud([f"kubernetes-validate has no schemas for Kubernetes {mm}: validating with the newest it has, {newest}",
                  "upgrade kubernetes-validate to check against the real thing"])
            KUBE_VERSIONS[KUBE_VERSIONS.index(kube)] = newest
    print(f"Kubernetes versions checked: {', '.join(KUBE_VERSIONS)}")

    bin_dir = Path(args.bin_dir)
    if not bin_dir.is_absolute():
        bin_dir = ROOT / bin_dir
    binaries: Binaries | None = Binaries(bin_dir)
    missing = binaries.present()
    if args.skip_flags:
        loud(["--skip-flags: the flags the chart passes to the dpufs binaries are NOT checked"])
        binaries = None
    elif missing:
        loud([f"the dpufs binaries {', '.join(missing)} are not in {bin_dir}",
              "build them (cargo build) or point --bin-dir at them; --skip-flags skips this check"])
        report.fail(f"dpufs binaries missing in {bin_dir}: {', '.join(missing)}")
        binaries = None

    check_crds(report)
    calls = yaml.safe_load(API_CALLS.read_text())
    crds = crd_schemas(CHART / "crds")
    values_files = sorted((CHART / "ci").glob("*.yaml"))
    if not values_files:
        report.fail("charts/dpufs/ci/ has no values files")
    with helm.Chart.load(str(CHART)) as chart:
        base = yaml.safe_load((CHART / "ci" / "default-values.yaml").read_text()) or {}
        check_refusals(report, helm, chart, base)
        for f in values_files:
            check_values_file(report, helm, chart, kv, kv_utils, f, binaries, calls, crds)

    section("summary")
    took = time.monotonic() - started
    if binaries is None:
        loud(["the flags the chart passes to the dpufs binaries were NOT checked "
              + ("(--skip-flags)" if args.skip_flags else f"(no binaries in {bin_dir})")])
    for s in report.skipped:
        print(f"  skipped: {s}")
    if report.failures:
        print(f"took {took:.1f}s")
        print(f"chart: {report.passed} passed, {len(report.failures)} failed, {len(report.skipped)} skipped")
        for f in report.failures:
            print(f"  FAIL  {f}")
        print("Fix the chart (charts/dpufs), tools/chart/api-calls.yaml or the values in charts/dpufs/ci as each line says.")
        return 1
    print(f"took {took:.1f}s")
    print(f"chart: {report.passed} passed, 0 failed, {len(report.skipped)} skipped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
