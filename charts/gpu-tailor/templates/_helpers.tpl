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

{{/* A webhook entry's clientConfig for PATH: the webhook's Service, or webhook.url + PATH (a webhook run outside
the cluster, as the end-to-end tests run it beside a control plane without kubelets) */}}
{{- define "gpu-tailor.clientConfig" -}}
{{- $root := index . 0 -}}
{{- $path := index . 1 -}}
{{- if $root.Values.webhook.url -}}
url: {{ printf "%s%s" (trimSuffix "/" $root.Values.webhook.url) $path }}
{{- else -}}
service:
  name: gpu-tailor-webhook
  namespace: {{ $root.Release.Namespace }}
  path: {{ $path }}
  port: 443
{{- end -}}
{{- end -}}
