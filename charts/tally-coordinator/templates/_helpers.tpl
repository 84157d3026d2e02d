{{- define "tally-coordinator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "tally-coordinator.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "tally-coordinator.labels" -}}
app.kubernetes.io/name: {{ include "tally-coordinator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "tally-coordinator.selector" -}}
app.kubernetes.io/name: {{ include "tally-coordinator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: serve
{{- end -}}

{{/* The headless Service that gives each replica its DNS name: <fullname>-N.<peers>.<ns>.svc.cluster.local */}}
{{- define "tally-coordinator.peers" -}}
{{- printf "%s-peers" (include "tally-coordinator.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "tally-coordinator.peerDomain" -}}
{{- printf "%s.%s.svc.cluster.local" (include "tally-coordinator.peers" .) .Release.Namespace -}}
{{- end -}}

{{/* "true" when the replicas form a Raft group */}}
{{- define "tally-coordinator.clustered" -}}
{{- if and .Values.serve.enabled (gt (int .Values.replicas) 1) }}true{{ end -}}
{{- end -}}

{{- define "tally-coordinator.peerTlsSecret" -}}
{{- if .Values.cluster.tls.certManager.enabled -}}
{{- printf "%s-peer-tls" (include "tally-coordinator.fullname" .) -}}
{{- else -}}
{{- required "cluster.tls.existingSecret is required with replicas > 1 (or cluster.tls.certManager.enabled): the replicas speak Raft over mutual TLS only (tls.crt, tls.key, ca.crt)" .Values.cluster.tls.existingSecret -}}
{{- end -}}
{{- end -}}
