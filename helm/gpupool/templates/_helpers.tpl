{{/* Names: <release>-gpupool-<component>, shortened to 63 characters. */}}
{{- define "gpupool.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "gpupool.hub" -}}{{ include "gpupool.fullname" . }}-hub{{- end -}}
{{- define "gpupool.proxyPublic" -}}{{ include "gpupool.fullname" . }}-proxy-public{{- end -}}
{{- define "gpupool.proxyApi" -}}{{ include "gpupool.fullname" . }}-proxy-api{{- end -}}
{{- define "gpupool.proxy" -}}{{ include "gpupool.fullname" . }}-proxy{{- end -}}
{{- define "gpupool.secret" -}}{{ include "gpupool.fullname" . }}-secret{{- end -}}
{{- define "gpupool.dbSecret" -}}{{ .Values.database.postgres.existingSecret | default (printf "%s-db" (include "gpupool.fullname" .)) }}{{- end -}}
{{- define "gpupool.dataClaim" -}}{{ include "gpupool.fullname" . }}-hub-data{{- end -}}
{{- define "gpupool.jobsClaim" -}}{{ .Values.gpupool.jobs.storage.existingClaim | default (printf "%s-jobs" (include "gpupool.fullname" .)) }}{{- end -}}
{{- define "gpupool.hubImage" -}}{{ .Values.hub.image.repository }}:{{ .Values.hub.image.tag }}{{- end -}}

{{- define "gpupool.labels" -}}
app.kubernetes.io/name: gpupool
app.kubernetes.io/instance: {{ .Release.Name | quote }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | quote }}
{{- end -}}

{{- define "gpupool.selector" -}}
app.kubernetes.io/name: gpupool
app.kubernetes.io/instance: {{ .Release.Name | quote }}
{{- end -}}

{{/* A secret value kept across upgrades: the existing Secret's value when the cluster has one. */}}
{{- define "gpupool.keep" -}}
{{- $secret := lookup "v1" "Secret" .ctx.Release.Namespace (include "gpupool.secret" .ctx) -}}
{{- if and $secret (index ($secret.data | default dict) .key) -}}
{{- index $secret.data .key -}}
{{- else -}}
{{- randAlphaNum 64 | sha256sum | b64enc -}}
{{- end -}}
{{- end -}}
