{{/* The chart's name, shortened to fit a label value. */}}
{{- define "leasehold.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Prefix of every resource name: the release name, with the chart's name unless it already holds it. */}}
{{- define "leasehold.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "leasehold.selectorLabels" -}}
app.kubernetes.io/name: {{ include "leasehold.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "leasehold.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "leasehold.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "leasehold.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "leasehold.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
The store's values, as YAML (read it with fromYaml): each store.* value when
set, else its deprecated redis.* name's, else its default.
*/}}
{{- define "leasehold.store" -}}
{{- $s := .Values.store }}
{{- $r := .Values.redis }}
{{- $defaults := dict "url" "" "existingSecret" "" "existingSecretPasswordKey" "password" "sentinelSecret" "" "sentinelSecretPasswordKey" "password" "caSecret" "" "caSecretKey" "ca.crt" "prefix" "leasehold" "replicaAcks" "all" }}
{{- $out := dict }}
{{- range $key, $default := $defaults }}
{{- $value := coalesce (index $s $key) (index $r $key) $default | default "" }}
{{- $_ := set $out $key (toString $value) }}
{{- end }}
{{- toYaml $out }}
{{- end }}

{{/*
The store URL: store.url when set, else the in-release Redis when deployed,
else the deprecated redis.url when set, else redis://redis:6379.
store.sentinelSecret is refused unless the URL is a Sentinel one, as the
binary refuses --store-sentinel-password-file.
*/}}
{{- define "leasehold.storeUrl" -}}
{{- $store := include "leasehold.store" . | fromYaml }}
{{- $url := $store.url }}
{{- if and .Values.redis.deploy (not .Values.store.url) }}
{{- $url = printf "redis://%s-redis.%s.svc:6379" (include "leasehold.fullname" .) .Release.Namespace }}
{{- else if not $url }}
{{- $url = "redis://redis:6379" }}
{{- end }}
{{- if and $store.sentinelSecret (not (contains "+sentinel://" $url)) }}
{{- fail "store.sentinelSecret is for a redis+sentinel:// or rediss+sentinel:// store.url only (not with redis.deploy=true)" }}
{{- end }}
{{- $url }}
{{- end }}

{{/*
The apiVersion of ValidatingAdmissionPolicy the API server serves: v1 (GA in
Kubernetes 1.30), else v1beta1 (1.28-1.29, where the cluster turned it on),
else empty: the admission policy is then not rendered.
*/}}
{{- define "leasehold.admissionPolicyApiVersion" -}}
{{- if .Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy" }}
{{- "admissionregistration.k8s.io/v1" }}
{{- else if .Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1beta1/ValidatingAdmissionPolicy" }}
{{- "admissionregistration.k8s.io/v1beta1" }}
{{- end }}
{{- end }}

{{/* Name of the (cluster-scoped) admission policy and its binding: the release namespace is in it, so releases of the same name in two namespaces do not collide. */}}
{{- define "leasehold.admissionPolicyName" -}}
{{- printf "%s-%s-pod-labels" (include "leasehold.fullname" .) .Release.Namespace }}
{{- end }}
