{{/* The chart's name, as in object labels. */}}
{{- define "spectune.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The full name: every object of the release is called this (or starts with it). */}}
{{- define "spectune.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else if contains (include "spectune.name" .) .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name (include "spectune.name" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "spectune.selectorLabels" -}}
app.kubernetes.io/name: {{ include "spectune.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "spectune.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "spectune.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "spectune.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "spectune.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
The operator's rules (files/operator-rules.yaml, the one copy the tests bind too), split by
scope: rules on cluster-scoped resources always go to a ClusterRole; the others go to the
ClusterRole when every namespace is watched, else to a Role in each watched namespace.
Call with (dict "root" $ "scope" "Cluster"|"Namespaced").
*/}}
{{- define "spectune.rules" -}}
{{- $clusterScoped := list "namespaces" "customresourcedefinitions" }}
{{- $out := list }}
{{- range (.root.Files.Get "files/operator-rules.yaml" | fromYamlArray) }}
{{- $cluster := true }}
{{- range .resources }}{{ if not (has . $clusterScoped) }}{{ $cluster = false }}{{ end }}{{ end }}
{{- if eq $cluster (eq $.scope "Cluster") }}{{ $out = append $out . }}{{ end }}
{{- end }}
{{- toYaml $out }}
{{- end }}

{{/* A CRD from files/crds/ (a link to the repository's crds/, generated from the models). */}}
{{- define "spectune.crd" -}}
{{- $crd := .root.Files.Get (printf "files/crds/%s" .file) | fromYaml }}
{{- $meta := $crd.metadata }}
{{- $_ := set $meta "labels" (include "spectune.labels" .root | fromYaml) }}
{{- if .root.Values.crds.keep }}
{{- $_ := set $meta "annotations" (dict "helm.sh/resource-policy" "keep") }}
{{- end }}
{{- toYaml $crd }}
{{- end }}
