{{/* Chart name, overridable. */}}
{{- define "rljob-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: <release>-<chart> unless the release name already contains the chart name. */}}
{{- define "rljob-operator.fullname" -}}
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

{{/* Selector labels: stable across upgrades (a Deployment's selector is immutable). */}}
{{- define "rljob-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "rljob-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Standard labels on every object. */}}
{{- define "rljob-operator.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "rljob-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: operator
app.kubernetes.io/part-of: rljob
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* The ServiceAccount the operator runs as. */}}
{{- define "rljob-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "rljob-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The operator image reference. */}}
{{- define "rljob-operator.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/*
RBAC rules for the RLJobs and their children in one namespace (or all of them). Least privilege:
exactly the verbs operator/rljob_operator (kube.py, kopf) uses; no delete (children are removed by the
garbage collector through ownerReferences).
*/}}
{{- define "rljob-operator.workloadRules" -}}
# RLJobs: watched by kopf, patched by kopf (its handled-state annotations) and by the operator.
- apiGroups: ["rl.hybridflow.dev"]
  resources: ["rljobs"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["rl.hybridflow.dev"]
  resources: ["rljobs/status"]
  verbs: ["get", "patch"]
# Children carry ownerReferences with blockOwnerDeletion: clusters enforcing
# OwnerReferencesPermissionEnforcement require update on the owner's finalizers for that.
- apiGroups: ["rl.hybridflow.dev"]
  resources: ["rljobs/finalizers"]
  verbs: ["update"]
# One RayJob per attempt, created and patched (suspend) by the operator.
- apiGroups: ["ray.io"]
  resources: ["rayjobs"]
  verbs: ["get", "list", "watch", "create", "patch"]
# The trainer config of each RLJob.
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get", "create", "patch"]
# Events on RLJobs (validation errors, attempts, retries).
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
{{- end }}
