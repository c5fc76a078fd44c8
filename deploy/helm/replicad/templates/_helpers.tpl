{{- define "replicad.fullname" -}}
{{- printf "%s" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "replicad.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "replicad.selector" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* The Secret's keys as environment variables, by reference. */}}
{{- define "replicad.secretEnv" -}}
{{- $secret := .Values.replicad.existingSecret -}}
{{- if $secret }}
env:
{{- range .Values.replicad.secretKeys }}
  - name: {{ . }}
    valueFrom:
      secretKeyRef:
        name: {{ $secret }}
        key: {{ . }}
{{- end }}
{{- end }}
{{- end -}}

{{- define "replicad.containerSecurity" -}}
securityContext:
  allowPrivilegeEscalation: false
  readOnlyRootFilesystem: true
  capabilities:
    drop: ["ALL"]
{{- end -}}
