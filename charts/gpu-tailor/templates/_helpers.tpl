{{- define "gpu-tailor.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag }}
{{- end -}}

{{/* namespace/name of the Secret that holds the webhook's serving certificate */}}
{{- define "gpu-tailor.certsSecret" -}}
{{ .Release.Namespace }}/gpu-tailor-webhook-tls
{{- end -}}

{{/* The namespaces never admitted through gpu-tailor: the release's and .Values.excludedNamespaces */}}
{{- define "gpu-tailor.excluded" -}}
{{- $out := list .Release.Namespace -}}
{{- range .Values.excludedNamespaces }}{{ if not (has . $out) }}{{ $out = append $out . }}{{ end }}{{ end -}}
{{- toYaml $out -}}
{{- end -}}

{{/* nodeSelector, affinity and tolerations of a Deployment's pod, from one values block */}}
{{- define "gpu-tailor.placement" -}}
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
