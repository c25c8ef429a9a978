{{/*
Names, labels, images and the checks across values that values.schema.json cannot say clearly.
*/}}

{{- define "dpufs.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 40 | trimSuffix "-" -}}
{{- end -}}

{{/* The prefix of every object name: <release>-dpufs, or the release name when it contains the chart name. */}}
{{- define "dpufs.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Labels of every object; call with (dict "ctx" . "component" "operator"). */}}
{{- define "dpufs.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .ctx.Chart.Name .ctx.Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "dpufs.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
app.kubernetes.io/part-of: dpufs
{{- with .component }}
app.kubernetes.io/component: {{ . }}
{{- end }}
{{- end -}}

{{/* Selector labels of a component's pods; call with (dict "ctx" . "component" "node"). */}}
{{- define "dpufs.selectorLabels" -}}
app.kubernetes.io/name: {{ include "dpufs.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* The dpufs image; the tag defaults to the chart's appVersion. */}}
{{- define "dpufs.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* A sidecar's image from its values block. */}}
{{- define "dpufs.sidecarImage" -}}
{{- printf "%s:%s" .image.repository .image.tag -}}
{{- end -}}

{{- define "dpufs.serviceAccount" -}}
{{- printf "%s-%s" (include "dpufs.fullname" .ctx) .component -}}
{{- end -}}

{{/* The operator's leader-election Lease. */}}
{{- define "dpufs.leaseName" -}}
{{- printf "%s-operator" (include "dpufs.fullname" .) -}}
{{- end -}}

{{/* The engine's Service; the DaosSystem's endpoint. */}}
{{- define "dpufs.engineService" -}}
{{- printf "%s-engine" (include "dpufs.fullname" .) -}}
{{- end -}}

{{/* The certificate Secret of the chart's engine and its clients: the administrator's, or the
one the install hook makes (tls.generate; only for the chart's engine: an external system's CA is
its own); empty when the management channel is plaintext. */}}
{{- define "dpufs.tlsSecret" -}}
{{- if not .Values.daos.insecure -}}
{{- if .Values.tls.existingSecret -}}
{{- .Values.tls.existingSecret -}}
{{- else if and .Values.tls.generate .Values.engine.enabled -}}
{{- printf "%s-daos-certs" (include "dpufs.fullname" .) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The node agent's key Secret: the administrator's, or the one the install hook makes
(agentKey.generate); empty: each node makes its own key. */}}
{{- define "dpufs.agentKeySecret" -}}
{{- if .Values.agentKey.existingSecret -}}
{{- .Values.agentKey.existingSecret -}}
{{- else if .Values.agentKey.generate -}}
{{- printf "%s-agent-key" (include "dpufs.fullname" .) -}}
{{- end -}}
{{- end -}}

{{/* "true" in DPU mode (node.mode=dpu, docs/dpu.md), else empty. */}}
{{- define "dpufs.dpuMode" -}}
{{- if eq .Values.node.mode "dpu" -}}true{{- end -}}
{{- end -}}

{{/* "true" unless the chart renders only the DPU agent, as DPF's DPUService in the DPU cluster
(node.dpu.dpf.dpuServiceOnly): then nothing of the host cluster is rendered. */}}
{{- define "dpufs.wholeChart" -}}
{{- if not (and (include "dpufs.dpuMode" .) .Values.node.dpu.dpf.dpuServiceOnly) -}}true{{- end -}}
{{- end -}}

{{/* The ServiceAccount of what stages volumes and reads the directory: the host-mode node plugin,
or in DPU mode the agents on the DPUs (the hosts' shims read neither). */}}
{{- define "dpufs.stagingAccount" -}}
{{- include "dpufs.serviceAccount" (dict "ctx" . "component" (ternary "dpu-agent" "node" (eq .Values.node.mode "dpu"))) -}}
{{- end -}}

{{/* The DPU control channel's certificate Secret (ca.crt, agent.crt, agent.key, host.crt,
host.key): the administrator's, or the one the install hook makes (node.dpu.tls.generate). */}}
{{- define "dpufs.dpuTlsSecret" -}}
{{- if .Values.node.dpu.tls.existingSecret -}}
{{- .Values.node.dpu.tls.existingSecret -}}
{{- else if .Values.node.dpu.tls.generate -}}
{{- printf "%s-dpu-certs" (include "dpufs.fullname" .) -}}
{{- end -}}
{{- end -}}

{{/* The Secret with daosCA.crt, admin.crt, admin.key the DaosSystem names; empty when insecure. */}}
{{- define "dpufs.adminSecret" -}}
{{- if not .Values.daos.insecure -}}
{{- default (include "dpufs.tlsSecret" .) .Values.daos.tls.secretName -}}
{{- end -}}
{{- end -}}

{{/* The DaosSystem's data endpoint (may be empty). */}}
{{- define "dpufs.dataEndpoint" -}}
{{- if .Values.daos.dataEndpoint -}}
{{- .Values.daos.dataEndpoint -}}
{{- else if and .Values.engine.enabled .Values.engine.hostNetwork -}}
{{- printf "127.0.0.1:%d" (int .Values.engine.fabric.port) -}}
{{- end -}}
{{- end -}}

{{/* The StorageClass of the helm test's PVC. */}}
{{- define "dpufs.testStorageClass" -}}
{{- default .Values.storageClasses.pool.name .Values.tests.storageClassName -}}
{{- end -}}

{{/*
Checks across values, each failing with what to do. Rendered by templates/validate.yaml.
*/}}
{{- define "dpufs.validate" -}}
{{- if include "dpufs.wholeChart" . -}}
{{- $certs := "dpufs certs generate ./daos-certs && kubectl -n <namespace> create secret generic dpufs-daos-certs --from-file=./daos-certs/daosCA.crt --from-file=./daos-certs/admin.crt --from-file=./daos-certs/admin.key --from-file=./daos-certs/server.crt --from-file=./daos-certs/server.key" -}}
{{- if .Values.engine.enabled -}}
{{- if .Values.daos.endpoints -}}
{{- fail "daos.endpoints is for an external DAOS system (engine.enabled=false); with the chart's engine the DaosSystem points at the engine's Service. Remove daos.endpoints or set engine.enabled=false." -}}
{{- end -}}
{{- if and (not .Values.daos.insecure) (not (include "dpufs.tlsSecret" .)) -}}
{{- fail (printf "the chart's engine needs its certificates: leave tls.generate=true (the install hook makes them), or set tls.existingSecret to a Secret with daosCA.crt, server.crt, server.key, admin.crt and admin.key (%s), or daos.insecure=true for a plaintext trial." $certs) -}}
{{- end -}}
{{- if not (include "dpufs.agentKeySecret" .) -}}
{{- fail "the chart's engine needs the node agent's key: leave agentKey.generate=true (the install hook makes it), or set agentKey.existingSecret to a Secret with agent.key and agent.pub (dpufs certs secrets --namespace <namespace> --agent-key-secret dpufs-agent-key)." -}}
{{- end -}}
{{- else -}}
{{- if not .Values.daos.endpoints -}}
{{- fail "engine.enabled=false needs daos.endpoints: the management endpoints (host or host:port) of the DAOS system." -}}
{{- end -}}
{{- if and (not .Values.daos.insecure) (not (include "dpufs.adminSecret" .)) -}}
{{- fail "engine.enabled=false needs daos.tls.secretName: a Secret in the release namespace with daosCA.crt, admin.crt and admin.key of the DAOS system (kubectl -n <namespace> create secret generic daos-admin-cert --from-file=daosCA.crt --from-file=admin.crt --from-file=admin.key), or daos.insecure=true for a system in DAOS's insecure mode." -}}
{{- end -}}
{{- end -}}
{{- if and .Values.tests.enabled (not .Values.tests.storageClassName) (not .Values.storageClasses.pool.enabled) -}}
{{- fail "tests.enabled needs a StorageClass: enable storageClasses.pool or name one in tests.storageClassName (or set tests.enabled=false)." -}}
{{- end -}}
{{- end -}}
{{- include "dpufs.validateDpu" . -}}
{{- end -}}

{{/* The checks of DPU mode's values (node.mode, node.dpu). */}}
{{- define "dpufs.validateDpu" -}}
{{- $d := .Values.node.dpu -}}
{{- $certs := printf "dpufs certs dpu ./dpu-certs --agent-host %s && kubectl -n <namespace> create secret generic dpufs-dpu-certs --from-file=./dpu-certs/ca.crt --from-file=./dpu-certs/agent.crt --from-file=./dpu-certs/agent.key --from-file=./dpu-certs/host.crt --from-file=./dpu-certs/host.key" $d.tls.serverName -}}
{{- if and .Values.serviceDaemonSet (not (and (include "dpufs.dpuMode" .) $d.dpf.dpuServiceOnly)) -}}
{{- fail "serviceDaemonSet is the value NVIDIA DPF sets from a DPUService's spec.serviceDaemonSet: it applies only to the agent as a DPUService (node.mode=dpu with node.dpu.dpf.dpuServiceOnly=true). Remove it, or use node.dpu.agent's nodeSelector, affinity and resources." -}}
{{- end -}}
{{- if not (include "dpufs.dpuMode" .) -}}
{{- if $d.dpf.enabled -}}
{{- fail "node.dpu.dpf.enabled is for DPU mode: the DPF storage plugin is served by the dpufs agent on the DPU. Set node.mode=dpu, or leave node.dpu.dpf.enabled=false." -}}
{{- end -}}
{{- if $d.dpf.dpuServiceOnly -}}
{{- fail "node.dpu.dpf.dpuServiceOnly renders the DPU agent alone (DPF's DPUService): it needs node.mode=dpu and node.dpu.dpf.enabled=true." -}}
{{- end -}}
{{- else -}}
{{- if not (include "dpufs.dpuTlsSecret" .) -}}
{{- fail (printf "node.mode=dpu needs the control channel's certificates: leave node.dpu.tls.generate=true (the install hook makes them), or set node.dpu.tls.existingSecret to a Secret with ca.crt, agent.crt, agent.key, host.crt and host.key (%s)." $certs) -}}
{{- end -}}
{{- if $d.dpf.dpuServiceOnly -}}
{{- if not $d.dpf.enabled -}}
{{- fail "node.dpu.dpf.dpuServiceOnly renders the agent as DPF's DPUService, which SNAP's node driver calls on the storage-plugin socket: set node.dpu.dpf.enabled=true." -}}
{{- end -}}
{{- if not $d.tls.existingSecret -}}
{{- fail (printf "node.dpu.dpf.dpuServiceOnly runs no install hook in the DPU cluster: set node.dpu.tls.existingSecret to the control channel's Secret (a copy of the host cluster's, or %s)." $certs) -}}
{{- end -}}
{{- if and .Values.agentKey.generate (not .Values.agentKey.existingSecret) -}}
{{- fail "node.dpu.dpf.dpuServiceOnly runs no install hook in the DPU cluster: set agentKey.existingSecret to a copy of the host cluster's agent key Secret (agent.key, agent.pub; the engine trusts that key), or agentKey.generate=false for a key each DPU makes itself." -}}
{{- end -}}
{{- if not $d.agent.kubeconfigSecret.name -}}
{{- fail "node.dpu.dpf.dpuServiceOnly: the agent checks pods and claims and reads the dpufs resources of the host cluster, not of the DPU cluster it runs in: set node.dpu.agent.kubeconfigSecret.name to a Secret holding a kubeconfig of the host cluster (whose identity the host cluster's install binds to the agent's roles)." -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
