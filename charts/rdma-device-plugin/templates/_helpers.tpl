{{/* Chart name, at most 63 characters (a label value). */}}
{{- define "rdp.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Release-qualified name. Truncated to 50 so that "<fullname>-exclusive" still fits the 63
characters of a DaemonSet's pod names' prefix.
*/}}
{{- define "rdp.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 50 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 50 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "rdp.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The image reference; image.repository has no default (the project publishes no image). */}}
{{- define "rdp.image" -}}
{{- if not .Values.image.repository }}
{{- fail "image.repository is not set: build the image from the project's Dockerfile, push it to a registry your nodes pull from, and set image.repository=<registry>/rdma-device-plugin (docs/install.md, \"Build and push the image\")" }}
{{- end }}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}

{{/* Labels every object carries. */}}
{{- define "rdp.labels" -}}
helm.sh/chart: {{ include "rdp.chart" . }}
app.kubernetes.io/name: {{ include "rdp.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/*
Selector labels of one mode's DaemonSet. The mode is part of them so that the two DaemonSets'
selectors never overlap. Call with (dict "root" $ "mode" "shared").
*/}}
{{- define "rdp.selectorLabels" -}}
app.kubernetes.io/name: {{ include "rdp.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .mode }}
{{- end }}

{{/*
The plugin's socket file name in the kubelet's device-plugin directory. One per release and
mode: while a relabelled node swaps DaemonSets, the terminating pod removes only its own socket,
not the one its successor already serves on.
*/}}
{{- define "rdp.socketName" -}}
{{- printf "%s-%s.sock" (include "rdp.fullname" .root) .mode }}
{{- end }}

{{/*
The pod's affinity: .Values.affinity with the nodes with RDMA NICs and the mode's requirement on the
exclusive label. Each required nodeSelectorTerm (or one empty term when none is given) is repeated
once per .Values.rdmaNodeLabels entry with `<label> In ["true"]` added (a node with any of the
labels qualifies: terms are ORed), and .Values.rdmaNodeRequirements and the mode's requirement
added to every term (a requirement in one term only would not bind).
exclusive: <key> In [<value>]; shared: <key> NotIn [<value>], which also matches nodes without
the label. The two select complementary sets of nodes, so each node runs exactly one of them.
*/}}
{{- define "rdp.affinity" -}}
{{- $values := .root.Values }}
{{- $operator := ternary "In" "NotIn" (eq .mode "exclusive") }}
{{- $mode := dict "key" $values.exclusiveLabel.key "operator" $operator "values" (list $values.exclusiveLabel.value) }}
{{- $requirements := deepCopy ($values.rdmaNodeRequirements | default list) }}
{{- $rdma := list }}
{{- range ($values.rdmaNodeLabels | default list) }}
{{- $rdma = append $rdma (list (dict "key" . "operator" "In" "values" (list "true"))) }}
{{- end }}
{{- if not $rdma }}
{{- $rdma = list list }}
{{- end }}
{{- $affinity := deepCopy ($values.affinity | default dict) }}
{{- $nodeAffinity := get $affinity "nodeAffinity" | default dict }}
{{- $required := get $nodeAffinity "requiredDuringSchedulingIgnoredDuringExecution" | default dict }}
{{- $given := get $required "nodeSelectorTerms" | default (list dict) }}
{{- $terms := list }}
{{- range $given }}
{{- $base := . }}
{{- range $rdma }}
{{- $term := deepCopy $base }}
{{- $_ := set $term "matchExpressions" (concat (get $base "matchExpressions" | default list) $requirements . (list $mode)) }}
{{- $terms = append $terms $term }}
{{- end }}
{{- end }}
{{- $_ := set $required "nodeSelectorTerms" $terms }}
{{- $_ := set $nodeAffinity "requiredDuringSchedulingIgnoredDuringExecution" $required }}
{{- $_ := set $affinity "nodeAffinity" $nodeAffinity }}
{{- toYaml $affinity }}
{{- end }}

{{/*
The probe command (exec'd where the metrics port cannot answer the probes). Device-plugin mode: GetDevicePluginOptions on our own socket. DRA mode: GetInfo
on the driver's registration socket, then an empty NodeUnprepareResources on its DRA socket; the
readiness probe (.ready) also wants the kubelet to have registered the driver. 1 s deadline each.
*/}}
{{- define "rdp.probeCommand" -}}
- rdma-device-plugin
- probe
{{- if eq .root.Values.driver "dra" }}
- --dra
- --kubelet-dir={{ .root.Values.hostPaths.kubeletRoot }}
- --driver-name={{ .root.Values.dra.driverName }}
{{- if .ready }}
- --ready
{{- end }}
{{- else }}
- --kubelet-dir={{ .root.Values.hostPaths.kubeletDevicePlugins }}
- --socket-name={{ include "rdp.socketName" . }}
{{- with include "rdp.configPath" .root }}
- --config={{ . }}
{{- end }}
{{- end }}
{{- end }}

{{/*
A probe's handler. Where the plugin serves its metrics port to the kubelet (metrics on, no proxy,
no access list that could refuse the kubelet), an httpGet of /livez (startup, liveness) or
/readyz (.ready): the probe subcommand's own check, run in the plugin's process, so no probe
starts a process in the container. Otherwise the probe subcommand, exec'd.
*/}}
{{- define "rdp.probeHandler" -}}
{{- $m := .root.Values.metrics }}
{{- if and $m.enabled (not $m.proxy.enabled) (empty $m.allow) }}
httpGet:
  path: {{ ternary "/readyz" "/livez" (.ready | default false) }}
  port: metrics
{{- else }}
exec:
  command:
    {{- include "rdp.probeCommand" . | nindent 4 }}
{{- end }}
{{- end }}

{{/*
In device-plugin mode a DaemonSet's maxSurge would start the new pod beside the old one on one
socket. The DRA driver hands over instead (docs/dra.md, "Upgrades"): the new pod asks, the old
one stops serving and releases the plugin directory.
*/}}
{{- define "rdp.validate" -}}
{{- $rolling := .Values.updateStrategy.rollingUpdate | default dict }}
{{- $surge := toString (get $rolling "maxSurge" | default 0) }}
{{- if and (ne .Values.driver "dra") (not (has $surge (list "0" "0%"))) }}
{{- fail (printf "updateStrategy.rollingUpdate.maxSurge must be 0 (got %s) with driver: deviceplugin: two plugin pods on one node would share one socket (driver: dra hands over and allows it)" $surge) }}
{{- end }}
{{- if not .Values.modes }}
{{- fail "modes is empty: list shared, exclusive or both" }}
{{- end }}
{{- include "rdp.checkPodSecurity" . }}
{{- end }}

{{/*
hostPath volumes are allowed only at the Pod Security level "privileged". Against a cluster
(install, upgrade, --dry-run=server) the release namespace's enforce label is read: at baseline or
restricted the DaemonSets would be accepted but the controller's every pod refused, so fail now.
A namespace not created yet, or without the label, gets the cluster's default level (privileged
unless the admission configuration says otherwise; docs/install.md). `helm template` sees no
cluster and checks nothing.
*/}}
{{- define "rdp.checkPodSecurity" -}}
{{- if .Values.podSecurityCheck }}
{{- $ns := lookup "v1" "Namespace" "" .Release.Namespace }}
{{- $labels := dig "metadata" "labels" dict ($ns | default dict) }}
{{- $level := get $labels "pod-security.kubernetes.io/enforce" }}
{{- if and $level (ne $level "privileged") }}
{{- fail (printf "namespace %q enforces Pod Security level %q, which refuses the plugin's hostPath volumes (the kubelet's device-plugin directory, /sys, /dev/infiniband): install into kube-system, or into a namespace labelled pod-security.kubernetes.io/enforce=privileged (docs/install.md, \"Pod Security\"); podSecurityCheck=false skips this check" .Release.Namespace $level) }}
{{- end }}
{{- end }}
{{- end }}

{{/* The mode the helm test pod runs under: test.mode, else exclusive when deployed, else shared. */}}
{{- define "rdp.testMode" -}}
{{- $mode := .Values.test.mode | default (ternary "exclusive" "shared" (has "exclusive" .Values.modes)) }}
{{- if not (has $mode .Values.modes) }}
{{- fail (printf "test.mode is %s, but modes (%s) does not deploy it: no node would serve the test pod" $mode (join ", " .Values.modes)) }}
{{- end }}
{{- $mode }}
{{- end }}

{{/*
"true" when the DRA driver reads pods (dra.readPods), else "". Absent from the values (a
release's values from before the chart had it, reused by helm upgrade --reuse-values): true.
*/}}
{{- define "rdp.draReadPods" -}}
{{- if ne (toString .Values.dra.readPods) "false" }}true{{ end }}
{{- end }}
