{{/* An image reference: its repository and tag (the chart's appVersion when none is set). */}}
{{- define "runtimekit.image" -}}
{{- $root := index . 0 -}}
{{- $image := index . 1 -}}
{{ $image.repository }}:{{ $image.tag | default $root.Chart.AppVersion }}
{{- end -}}

{{/* The pull secrets every pod of the kit uses. */}}
{{- define "runtimekit.pullSecrets" -}}
{{- with .Values.images.pullSecrets }}
imagePullSecrets:
  {{- range . }}
  - name: {{ . }}
  {{- end }}
{{- end }}
{{- end -}}

{{/* A component's nodeSelector, affinity and tolerations. */}}
{{- define "runtimekit.scheduling" -}}
{{- with .nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}
