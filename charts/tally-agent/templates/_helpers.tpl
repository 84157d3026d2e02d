{{- define "tally-agent.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "tally-agent.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "tally-agent.labels" -}}
app.kubernetes.io/name: {{ include "tally-agent.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "tally-agent.selector" -}}
app.kubernetes.io/name: {{ include "tally-agent.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "tally-agent.tlsSecret" -}}
{{- if .Values.tls.certManager.enabled -}}
{{- printf "%s-tls" (include "tally-agent.fullname" .) -}}
{{- else -}}
{{- required "tls.existingSecret (or tls.certManager.enabled) is required: the agent speaks mutual TLS only" .Values.tls.existingSecret -}}
{{- end -}}
{{- end -}}

{{/* The Secret holding the zone key: its own, or the TLS Secret (not with cert-manager). */}}
{{- define "tally-agent.zoneSecret" -}}
{{- if .Values.tls.zoneKey.existingSecret -}}
{{- .Values.tls.zoneKey.existingSecret -}}
{{- else if .Values.tls.certManager.enabled -}}
{{- fail "tls.zoneKey.existingSecret is required with tls.certManager: cert-manager cannot issue the X25519 zone key that seals checksums; create one with `tally certs init` (NAME-zone.key) and `kubectl create secret generic NAME --from-file=zone.key=NAME-zone.key`" -}}
{{- else -}}
{{- include "tally-agent.tlsSecret" . -}}
{{- end -}}
{{- end -}}

{{/* The environment variable carrying one dataset's URL. */}}
{{- define "tally-agent.urlEnv" -}}
{{- printf "TALLY_DATASET_%s_URL" (. | upper | replace "-" "_" | replace "." "_") -}}
{{- end -}}
