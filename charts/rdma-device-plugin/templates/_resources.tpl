{{/*
The resources of rdmaResources (docs/config.md): the config file the plugin reads, and the CEL
selector of each resource's DeviceClass, generated from the same selector over the attributes
the DRA driver publishes (docs/dra.md, "Attributes").
*/}}

{{/* The config file serve --config reads, from rdmaResources: our format, as JSON, which every
build of the binary reads (the arm64 one has no YAML parser). */}}
{{- define "rdp.configFile" -}}
{{- toPrettyJson (dict "resources" .Values.rdmaResources) }}
{{- end }}

{{/* Where the plugin container sees the config file; "" when there is none. */}}
{{- define "rdp.configPath" -}}
{{- if ne .Values.driver "dra" }}
{{- if .Values.rdmaResources }}/etc/rdma-device-plugin/config.json
{{- else if (.Values.rdmaConfigMap | default dict).name }}/etc/rdma-device-plugin/{{ .Values.rdmaConfigMap.key | default "config.json" }}
{{- end }}
{{- end }}
{{- end }}

{{/* A resource name as a DNS label: "rdma/hca" -> "rdma-hca". */}}
{{- define "rdp.resourceSlug" -}}
{{- . | lower | replace "/" "-" | replace "." "-" | replace "_" "-" }}
{{- end }}

{{/*
A shell glob (fnmatch: * ? [set] [!set]) as an RE2 fragment for CEL's matches(), to be anchored
by the caller: metacharacters quoted, * and ? never crossing a comma (netdevs is a
comma-separated list).
*/}}
{{- define "rdp.globRegex" -}}
{{- regexQuoteMeta . | replace "\\*" "[^,]*" | replace "\\?" "[^,]" | replace "\\[!" "[^" | replace "\\[" "[" | replace "\\]" "]" }}
{{- end }}

{{/*
The CEL selector of one resource: (dict "root" $ "selector" <selector>). Keys ANDed, a key's
values ORed, as resources::Selector::Matches; every attribute guarded by has(), so a device
without it does not match a key that asks for it (and, for virtualFunction, counts as a
physical function). linkLayer is the device's first port's.
*/}}
{{- define "rdp.celSelector" -}}
{{- $driver := .root.Values.dra.driverName }}
{{- $own := printf "device.attributes[%s]" ($driver | quote) }}
{{- $std := "device.attributes[\"resource.kubernetes.io\"]" }}
{{- $s := .selector | default dict }}
{{- $terms := list (printf "device.driver == %s" ($driver | quote)) }}
{{- $vf := printf "(has(%s.virtualFunction) && %s.virtualFunction)" $own $own }}
{{- $mode := $s.virtualFunctions | default "exclude" }}
{{- if eq $mode "exclude" }}
{{- $terms = append $terms (printf "!%s" $vf) }}
{{- else if eq $mode "only" }}
{{- $terms = append $terms $vf }}
{{- end }}
{{- range $key, $attr := dict "vendors" "pciVendorID" "deviceIDs" "pciDeviceID" "drivers" "driver" }}
{{- with (get $s $key) }}
{{- $values := list }}
{{- range . }}
{{- $v := toString . }}
{{- if ne $key "drivers" }}{{ $v = lower $v }}{{ end }}
{{- $values = append $values ($v | quote) }}
{{- end }}
{{- $terms = append $terms (printf "(has(%s.%s) && %s.%s in [%s])" $own $attr $own $attr (join ", " $values)) }}
{{- end }}
{{- end }}
{{- with $s.linkLayers }}
{{- $values := list }}
{{- range . }}{{ $values = append $values (ternary "\"InfiniBand\"" "\"Ethernet\"" (eq (lower .) "infiniband")) }}{{ end }}
{{- $terms = append $terms (printf "(has(%s.linkLayer) && %s.linkLayer in [%s])" $own $own (join ", " $values)) }}
{{- end }}
{{- with $s.hcaNames }}
{{- $res := list }}
{{- range . }}{{ $res = append $res (include "rdp.globRegex" .) }}{{ end }}
{{- $re := printf "^(?:%s)$" (join "|" $res) }}
{{- $terms = append $terms (printf "(has(%s.hcaName) && %s.hcaName.matches(%s))" $own $own ($re | quote)) }}
{{- end }}
{{- with $s.netdevs }}
{{- $res := list }}
{{- range . }}{{ $res = append $res (include "rdp.globRegex" .) }}{{ end }}
{{- $re := printf "(?:^|,)(?:%s)(?:,|$)" (join "|" $res) }}
{{- $terms = append $terms (printf "(has(%s.netdevs) && %s.netdevs.matches(%s))" $own $own ($re | quote)) }}
{{- end }}
{{- with $s.pciAddresses }}
{{- $alts := list }}
{{- range . }}
{{- $a := lower . }}
{{- if eq (len $a) 12 }}{{ $alts = append $alts (printf "%s.pciBusID == %s" $std ($a | quote)) }}
{{- else }}{{ $alts = append $alts (printf "%s.pciBusID.endsWith(%s)" $std (printf ":%s" $a | quote)) }}{{ end }}
{{- end }}
{{- $terms = append $terms (printf "(has(%s.pciBusID) && (%s))" $std (join " || " $alts)) }}
{{- end }}
{{- with $s.numaNodes }}
{{- $nodes := list }}
{{- range . }}{{ $nodes = append $nodes (int64 . | toString) }}{{ end }}
{{- $terms = append $terms (printf "(has(%s.numaNode) && %s.numaNode in [%s])" $std $std (join ", " $nodes)) }}
{{- end }}
{{- join " &&\n" $terms }}
{{- end }}

{{/*
rdmaResources and rdmaConfigMap, checked where the schema cannot: one of them, names unique
(also as DeviceClass names), and no ConfigMap of one's own under the DRA driver (its DeviceClasses
are generated from rdmaResources).
*/}}
{{- define "rdp.validateResources" -}}
{{- $cm := (.Values.rdmaConfigMap | default dict).name }}
{{- if and .Values.rdmaResources $cm }}
{{- fail "rdmaResources and rdmaConfigMap.name are both set: the plugin reads one config file; set one" }}
{{- end }}
{{- if and $cm (eq .Values.driver "dra") }}
{{- fail "rdmaConfigMap is for driver: deviceplugin; with driver: dra list the resources in rdmaResources (each becomes a DeviceClass)" }}
{{- end }}
{{- $seen := dict }}
{{- range $i, $r := .Values.rdmaResources }}
{{- $slug := include "rdp.resourceSlug" $r.name }}
{{- if hasKey $seen $slug }}
{{- fail (printf "rdmaResources[%d].name %s: rdmaResources[%s] has the same name (or the same DeviceClass name, %s)" $i $r.name (get $seen $slug) $slug) }}
{{- end }}
{{- $_ := set $seen $slug (toString $i) }}
{{- end }}
{{- end }}
