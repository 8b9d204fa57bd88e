{{- /* Helpers of the generated templates (templates/generated/, from deploy/kubernetes). */}}

{{- define "gpuledger.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- /* (list $ image): repository:tag, the tag defaulting to the chart's appVersion. */}}
{{- define "gpuledger.image" -}}
{{- $root := index . 0 }}{{- $image := index . 1 }}
{{- printf "%s:%s" $image.repository (toString (default $root.Chart.AppVersion $image.tag)) }}
{{- end }}

{{- define "gpuledger.natsServers" -}}
{{- $port := index . 1 }}
{{- $servers := list }}
{{- range $i := until (int (index . 0).Values.nats.replicas) }}
{{- $servers = append $servers (printf "tls://gpuledger-nats-%d.gpuledger-nats-headless.gpuledger.svc:%d" $i $port) }}
{{- end }}
{{- join "," $servers }}
{{- end }}

{{- /* Every NATS server, for the clients (docs/operator-guide.md, "NATS servers"). */}}
{{- define "gpuledger.natsUrls" -}}
{{ include "gpuledger.natsServers" (list . 4222) }}
{{- end }}

{{- /* Every NATS server's route, for the servers. */}}
{{- define "gpuledger.natsRoutes" -}}
{{ include "gpuledger.natsServers" (list . 6222) }}
{{- end }}

{{- define "gpuledger.bucketReplicas" -}}
{{ min 3 (int .Values.nats.replicas) }}
{{- end }}

{{- define "gpuledger.guard" -}}
{{- if .Values.guard.enabled }}{{ printf "%v:%v" .Values.guard.cpuPerCard .Values.guard.memoryPerCardGiB }}{{ else }}off{{ end }}
{{- end }}

{{- /* Not empty when a node pool is in DRA mode. */}}
{{- define "gpuledger.anyDra" -}}
{{- range .Values.nodePools }}{{ if eq .mode "dra" }}dra{{ end }}{{ end }}
{{- end }}

{{- /* Refuse values that would render something broken, naming the value. */}}
{{- define "gpuledger.validate" -}}
{{- if ne .Release.Namespace "gpuledger" }}
{{- fail (printf "the chart installs into the namespace gpuledger only (its services, certificates and admission policies name it), not %s: use -n gpuledger" .Release.Namespace) }}
{{- end }}
{{- $n := int .Values.nats.replicas }}
{{- if or (lt $n 1) (eq (mod $n 2) 0) }}
{{- fail (printf "nats.replicas must be odd (1, 3, 5: JetStream needs a majority), got %d" $n) }}
{{- end }}
{{- range $key := list "allocator" "placement" "scheduler" }}
{{- if lt (int (index $.Values $key).replicas) 1 }}
{{- fail (printf "%s.replicas must be 1 or more" $key) }}
{{- end }}
{{- end }}
{{- if not (regexMatch "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$" .Values.scheduler.name) }}
{{- fail (printf "scheduler.name must be a DNS label (lower-case letters, digits, '-'), got %q" .Values.scheduler.name) }}
{{- end }}
{{- if not .Values.nodePools }}
{{- fail "nodePools: at least one pool" }}
{{- end }}
{{- $seen := dict }}
{{- range .Values.nodePools }}
{{- if not (regexMatch "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$" (toString .name)) }}
{{- fail (printf "nodePools: name %q is not a DNS label" (toString .name)) }}
{{- end }}
{{- if hasKey $seen .name }}
{{- fail (printf "nodePools: name %q twice" .name) }}
{{- end }}
{{- $_ := set $seen .name true }}
{{- if not (has .mode (list "classic" "dra")) }}
{{- fail (printf "nodePools: pool %s: mode must be classic or dra, got %q" .name (toString .mode)) }}
{{- end }}
{{- end }}
{{- if .Values.guard.enabled }}
{{- if not (and (regexMatch "^[0-9]+(\\.[0-9]+)?$" (toString .Values.guard.cpuPerCard)) (regexMatch "^[0-9]+(\\.[0-9]+)?$" (toString .Values.guard.memoryPerCardGiB))) }}
{{- fail "guard.cpuPerCard and guard.memoryPerCardGiB must be numbers" }}
{{- end }}
{{- end }}
{{- range .Values.credentials.nodes }}
{{- if not (regexMatch "^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$" (toString .)) }}
{{- fail (printf "credentials.nodes: %q is not a Kubernetes node name" (toString .)) }}
{{- end }}
{{- end }}
{{- end }}
