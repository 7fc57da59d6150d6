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
RBAC rules for the RLJobs and their children in one namespace (or all of them). Exactly the verbs the
operator sends (operator/rljob_operator/kube.py callers: reconcile.py, peering.py) plus what kopf sends
(list/watch for its watches and indexes, patch for its annotations, create for Events); no get where
only list/watch is used. A test (tests/unit/test_helm.py WORKLOAD_RULES) keeps this list exact.
*/}}
{{- define "rljob-operator.workloadRules" -}}
# RLJobs: listed and watched by kopf, patched by kopf (its last-handled-configuration annotation).
- apiGroups: ["rl.hybridflow.dev"]
  resources: ["rljobs"]
  verbs: ["list", "watch", "patch"]
# status, conditions, progress: one merge patch per change (reconcile.py; kopf patches status too).
- apiGroups: ["rl.hybridflow.dev"]
  resources: ["rljobs/status"]
  verbs: ["patch"]
# Children carry ownerReferences with blockOwnerDeletion: clusters enforcing
# OwnerReferencesPermissionEnforcement require update on the owner's finalizers for that.
- apiGroups: ["rl.hybridflow.dev"]
  resources: ["rljobs/finalizers"]
  verbs: ["update"]
# One RayJob per attempt: watched by kopf; created, read back after a 409, patched (suspend) and
# deleted when a spec edit supersedes the running attempt (reconcile.stop_rayjob) or when a finished
# job's runPolicy.ttlSecondsAfterFinished passed.
- apiGroups: ["ray.io"]
  resources: ["rayjobs"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# The trainer config of each RLJob (create, read back after a 409, patch; deleted when a finished
# job's runPolicy.ttlSecondsAfterFinished passed).
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get", "create", "patch", "delete"]
# Events on RLJobs (validation errors, attempts, retries), from the operator and from kopf.
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
# The pods of our RayJobs (selected by label), only read: ready pods per role in status.roles, and a lost
# pod (a rollout pod counts as a restart, a trainer pod ends the attempt; role_status.py).
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "watch"]
{{- end }}

{{/*
RBAC rule for kopf peering: kopf lists, watches and patches (keep-alives) the peering object; the
operator creates it when missing and reads it before each resync round (peering.py). Call with a
dict: (dict "resource" "clusterkopfpeerings").
*/}}
{{- define "rljob-operator.peeringRule" -}}
- apiGroups: ["kopf.dev"]
  resources: [{{ .resource | quote }}]
  verbs: ["get", "list", "watch", "create", "patch"]
{{- end }}

{{/* The webhook's Service, Secret (serving certificate) and ValidatingWebhookConfiguration names. */}}
{{- define "rljob-operator.webhookService" -}}
{{- printf "%s-webhook" (include "rljob-operator.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- define "rljob-operator.webhookSecret" -}}
{{- printf "%s-webhook-tls" (include "rljob-operator.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- define "rljob-operator.webhookConfiguration" -}}
{{- printf "%s.%s" (include "rljob-operator.fullname" .) .Release.Namespace | trunc 253 }}
{{- end }}
{{- define "rljob-operator.webhookSelfSigned" -}}
{{- if and .Values.webhook.enabled (eq .Values.webhook.certificate.source "self-signed") }}true{{ end }}
{{- end }}
