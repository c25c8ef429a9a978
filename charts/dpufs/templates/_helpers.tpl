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
