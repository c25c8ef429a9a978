{{/*
What the node DaemonSets share: the host-mode node plugin (node.yaml) and, in DPU mode, the agent
on each DPU (dpu-agent.yaml) and the CSI shim on each host (dpu-shim.yaml). Each piece is written
once here and included by the DaemonSets that need it.
*/}}

{{/*
The head of a node DaemonSet, down to the pod spec's common fields; the caller continues at the
pod spec's indentation (6). Call with (dict "ctx" . "component" "node"), and "dpf" with DPF's
serviceDaemonSet values for the agent as a DPUService (their labels, annotations and update
strategy are added here).

Every node DaemonSet uses the host's network: the keeper and its workers keep the network they
started in, which must outlive the pod, and reach the engine's fabric on the node's loopback; the
agent is dialled by its host on the node's InternalIP; the shim dials its DPU from the host itself.
At SIGTERM each stops serving and exits; staged volumes stay mounted and served.
*/}}
{{- define "dpufs.nodeDaemonSet" -}}
{{- $ctx := .ctx -}}
{{- $dpf := .dpf | default dict -}}
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: {{ include "dpufs.fullname" $ctx }}-{{ .component }}
  namespace: {{ $ctx.Release.Namespace }}
  labels:
    {{- include "dpufs.labels" (dict "ctx" $ctx "component" .component) | nindent 4 }}
    {{- with $dpf.labels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- with $dpf.annotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
spec:
  selector:
    matchLabels:
      {{- include "dpufs.selectorLabels" (dict "ctx" $ctx "component" .component) | nindent 6 }}
  updateStrategy:
    {{- with $dpf.updateStrategy }}
    {{- toYaml . | nindent 4 }}
    {{- else }}
    type: RollingUpdate
    rollingUpdate:
      maxUnavailable: 1
    {{- end }}
  template:
    metadata:
      labels:
        {{- include "dpufs.selectorLabels" (dict "ctx" $ctx "component" .component) | nindent 8 }}
        {{- with $dpf.labels }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      annotations:
        dpufs.io/node-mode: {{ $ctx.Values.node.mode }}
        {{- with $dpf.annotations }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
    spec:
      serviceAccountName: {{ include "dpufs.serviceAccount" (dict "ctx" $ctx "component" .component) }}
      {{- with $ctx.Values.imagePullSecrets }}
      imagePullSecrets:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      priorityClassName: {{ $ctx.Values.node.priorityClassName }}
      hostNetwork: true
      dnsPolicy: ClusterFirstWithHostNet
      terminationGracePeriodSeconds: 30
{{- end -}}

{{/*
hostPID for the keeper (docs/keeper.md, "Pod settings the chart must use"): with the host's PID
namespace, `--keeper-start detach` places the keeper and the volume workers it starts outside the
container's PID namespace and cgroup, so they outlive the pod.
*/}}
{{- define "dpufs.keeperHostPID" -}}
hostPID: {{ has .Values.node.keeperStart (list "detach" "auto") }}
{{- end -}}

{{/* Root and privileged: mount(2), bind mounts into pods' directories, moving the keeper into
its own cgroups. The workers drop their privileges themselves. */}}
{{- define "dpufs.privileged" -}}
privileged: true
runAsUser: 0
runAsGroup: 0
runAsNonRoot: false
{{- end -}}

{{- define "dpufs.nodeEnv" -}}
- name: NODE_ID
  valueFrom:
    fieldRef:
      fieldPath: spec.nodeName
- name: RUST_LOG
  value: {{ .Values.node.logLevel | quote }}
{{- end -}}

{{/*
The flags of what stages volumes, the same for the host-mode node plugin and the DPU agent
(`StagingArgs` of dpufs-csi): the directory, the keeper and its state, the node agent's key, the
workers' fabric.
*/}}
{{- define "dpufs.stagingArgs" -}}
{{- $v := .Values.node -}}
- --directory=kubernetes
- --tls-dir=/run/dpufs/tls
{{- with .Values.controller.defaultTenant }}
- --default-tenant={{ . }}
{{- end }}
- --state-dir={{ $v.stateDir }}
{{- if include "dpufs.agentKeySecret" . }}
- --agent-key=/etc/dpufs/agent/agent.key
{{- end }}
- --capability-ttl-secs={{ $v.capabilityTtlSeconds }}
- --keeper-start={{ $v.keeperStart }}
- --max-volumes={{ $v.maxVolumes }}
- --fabric-provider={{ $v.fabric.provider }}
- --fabric-device={{ $v.fabric.device }}
- --fabric-dir={{ $v.fabric.hostDir }}
{{- end -}}

{{/* The volumes of what stages volumes (host-mode node plugin, DPU agent). */}}
{{- define "dpufs.stagingVolumeNames" -}}
{{- $names := list "state-dir" "cgroup" "fabric-dir" "tls" -}}
{{- if include "dpufs.agentKeySecret" . -}}
{{- $names = append $names "agent-key" -}}
{{- end -}}
{{- toJson $names -}}
{{- end -}}

{{/*
Every volume of the node DaemonSets, each written once with where its container sees it:
name: {mount: <volumeMount without its name>, volume: <volume without its name>}.
"dpufs.nodeMounts" and "dpufs.nodeVolumes" pick from it by name.
*/}}
{{- define "dpufs.nodeVolumeTable" -}}
{{- $v := .Values.node -}}
{{- $dpuSecret := include "dpufs.dpuTlsSecret" . -}}
# kubelet's plugin directory: the CSI socket kubelet and the sidecars reach.
socket-dir:
  mount: {mountPath: /csi}
  volume: {hostPath: {path: {{ printf "%s/plugins/dfs.dpufs.io" $v.kubeletDir | quote }}, type: DirectoryOrCreate}}
registration-dir:
  mount: {mountPath: /registration}
  volume: {hostPath: {path: {{ printf "%s/plugins_registry" $v.kubeletDir | quote }}, type: Directory}}
# Staging and target paths: mounts made here reach kubelet and the pods.
kubelet-dir:
  mount: {mountPath: {{ $v.kubeletDir | quote }}, mountPropagation: Bidirectional}
  volume: {hostPath: {path: {{ $v.kubeletDir | quote }}, type: Directory}}
# Records, sockets and worker state survive the container.
state-dir:
  mount: {mountPath: {{ $v.stateDir | quote }}}
  volume: {hostPath: {path: {{ $v.stateDir | quote }}, type: DirectoryOrCreate}}
fuse-device:
  mount: {mountPath: /dev/fuse}
  volume: {hostPath: {path: /dev/fuse, type: CharDevice}}
# The keeper joins a cgroup of its own at the root of every hierarchy.
cgroup:
  mount: {mountPath: /sys/fs/cgroup}
  volume: {hostPath: {path: /sys/fs/cgroup, type: Directory}}
# The node's software fabric device (shared memory), kept across restarts like its workers.
fabric-dir:
  mount: {mountPath: {{ $v.fabric.hostDir | quote }}}
  volume: {hostPath: {path: {{ $v.fabric.hostDir | quote }}, type: DirectoryOrCreate}}
# The DaosSystems' TLS files, written from their Secrets by the directory.
tls:
  mount: {mountPath: /run/dpufs/tls}
  volume: {emptyDir: {medium: Memory}}
agent-key:
  mount: {mountPath: /etc/dpufs/agent, readOnly: true}
  volume:
    secret:
      secretName: {{ include "dpufs.agentKeySecret" . | quote }}
      defaultMode: 0400
      items: [{key: agent.key, path: agent.key}]
# The control channel, each side with its own pair only: a host never holds the agent's key.
dpu-agent-tls:
  mount: {mountPath: /etc/dpufs/dpu, readOnly: true}
  volume:
    secret:
      secretName: {{ $dpuSecret | quote }}
      defaultMode: 0400
      items: [{key: ca.crt, path: ca.crt}, {key: agent.crt, path: agent.crt}, {key: agent.key, path: agent.key}]
dpu-host-tls:
  mount: {mountPath: /etc/dpufs/dpu, readOnly: true}
  volume:
    secret:
      secretName: {{ $dpuSecret | quote }}
      defaultMode: 0400
      items: [{key: ca.crt, path: ca.crt}, {key: host.crt, path: host.crt}, {key: host.key, path: host.key}]
# Where DPF's SNAP node driver finds the storage plugin's socket.
dpf-plugin-dir:
  mount: {mountPath: {{ include "dpufs.dpfPluginDir" . | quote }}}
  volume: {hostPath: {path: {{ include "dpufs.dpfPluginDir" . | quote }}, type: DirectoryOrCreate}}
# A kubeconfig of the host cluster, whose pods, claims and dpufs resources the agent reads
# (--host-cluster-kubeconfig).
kubeconfig:
  mount: {mountPath: /etc/dpufs/kubeconfig, readOnly: true}
  volume:
    secret:
      secretName: {{ .Values.node.dpu.agent.kubeconfigSecret.name | quote }}
      defaultMode: 0400
      items: [{key: {{ .Values.node.dpu.agent.kubeconfigSecret.key | quote }}, path: kubeconfig}]
{{- end -}}

{{/* volumeMounts of the volumes named; call with (dict "ctx" . "names" (list ...)). */}}
{{- define "dpufs.nodeMounts" -}}
{{- $table := include "dpufs.nodeVolumeTable" .ctx | fromYaml -}}
{{- range $i, $name := .names }}
{{- if $i }}{{ "\n" }}{{ end -}}
- name: {{ $name }}
  {{- toYaml (index $table $name "mount") | nindent 2 }}
{{- end }}
{{- end -}}

{{/* volumes of the names; call as "dpufs.nodeMounts". */}}
{{- define "dpufs.nodeVolumes" -}}
{{- $table := include "dpufs.nodeVolumeTable" .ctx | fromYaml -}}
{{- range $i, $name := .names }}
{{- if $i }}{{ "\n" }}{{ end -}}
- name: {{ $name }}
  {{- toYaml (index $table $name "volume") | nindent 2 }}
{{- end }}
{{- end -}}

{{/* The DPF storage plugin's directory: SNAP's node driver calls <dir>/dpu.sock. */}}
{{- define "dpufs.dpfPluginDir" -}}
/var/lib/nvidia/storage/snap/plugins/dfs.dpufs.io
{{- end -}}

{{/*
The kubelet sidecars of a CSI node plugin (host mode's, and DPU mode's shim): node-driver-registrar
registers the plugin's socket with kubelet; livenessprobe answers /healthz with the plugin's Probe.
At the containers list's indentation.
*/}}
{{- define "dpufs.kubeletSidecars" -}}
{{- $sc := .Values.sidecars -}}
{{- $v := .Values.node -}}
- name: node-driver-registrar
  image: {{ include "dpufs.sidecarImage" $sc.nodeDriverRegistrar }}
  imagePullPolicy: {{ $sc.nodeDriverRegistrar.image.pullPolicy }}
  args:
    - --csi-address=/csi/csi.sock
    - --kubelet-registration-path={{ $v.kubeletDir }}/plugins/dfs.dpufs.io/csi.sock
    - --v=2
  securityContext:
    allowPrivilegeEscalation: false
    capabilities:
      drop: ["ALL"]
  {{- with $sc.nodeDriverRegistrar.resources }}
  resources:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  volumeMounts:
    {{- include "dpufs.nodeMounts" (dict "ctx" . "names" (list "socket-dir" "registration-dir")) | nindent 4 }}
- name: liveness-probe
  image: {{ include "dpufs.sidecarImage" $sc.livenessProbe }}
  imagePullPolicy: {{ $sc.livenessProbe.image.pullPolicy }}
  args:
    - --csi-address=/csi/csi.sock
    - --http-endpoint=:{{ $v.healthPort }}
    - --probe-timeout=5s
  securityContext:
    allowPrivilegeEscalation: false
    readOnlyRootFilesystem: true
    capabilities:
      drop: ["ALL"]
  {{- with $sc.livenessProbe.resources }}
  resources:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  volumeMounts:
    {{- include "dpufs.nodeMounts" (dict "ctx" . "names" (list "socket-dir")) | nindent 4 }}
{{- end -}}

{{/* The CSI plugin's own healthz port and liveness probe (through the livenessprobe sidecar). */}}
{{- define "dpufs.csiLiveness" -}}
ports:
  - name: healthz
    containerPort: {{ .Values.node.healthPort }}
    protocol: TCP
livenessProbe:
  httpGet:
    path: /healthz
    port: healthz
  initialDelaySeconds: 10
  timeoutSeconds: 5
  periodSeconds: 10
  failureThreshold: 5
{{- end -}}

{{/* nodeSelector, tolerations and affinity of a values block, those set; empty if none. */}}
{{- define "dpufs.scheduling" -}}
{{- $set := dict -}}
{{- range $key := list "nodeSelector" "tolerations" "affinity" -}}
{{- with index $ $key -}}
{{- $_ := set $set $key . -}}
{{- end -}}
{{- end -}}
{{- with $set -}}
{{- toYaml . -}}
{{- end -}}
{{- end -}}
