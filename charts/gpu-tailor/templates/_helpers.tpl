{{/*
Names. The chart's name is gpu-tailor (nameOverride replaces it); an object's name starts with the release's
"full name": the release name where it already holds the chart's name (the default install, `helm install
gpu-tailor`, names everything as manifests/ does), else <release>-<chart>; fullnameOverride replaces it outright.
Cut to 45 characters so that the longest suffix added here ("-scheduler-metrics", a Service) stays within the
63 of a DNS label.
*/}}
{{- define "gpu-tailor.name" -}}
{{- .Values.nameOverride | default .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "gpu-tailor.fullname" -}}
{{- $full := .Values.fullnameOverride -}}
{{- if not $full -}}
{{- $name := include "gpu-tailor.name" . -}}
{{- $full = ternary .Release.Name (printf "%s-%s" .Release.Name $name) (contains $name .Release.Name) -}}
{{- end -}}
{{- $full | trunc 45 | trimSuffix "-" -}}
{{- end -}}

{{/* <fullname>-<component>: the webhook's, the scheduler's and the agent's objects */}}
{{- define "gpu-tailor.component" -}}
{{- printf "%s-%s" (include "gpu-tailor.fullname" (index . 0)) (index . 1) -}}
{{- end -}}

{{/*
Labels. (list $ COMPONENT). The selector labels (name, instance, component) pick a component's pods; they are in
Deployment and DaemonSet selectors, which cannot change after install, so nothing that moves between releases
(version, chart) is among them.
*/}}
{{- define "gpu-tailor.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpu-tailor.name" (index . 0) }}
app.kubernetes.io/instance: {{ (index . 0).Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{- define "gpu-tailor.labels" -}}
{{- $root := index . 0 -}}
{{ include "gpu-tailor.selectorLabels" . }}
app.kubernetes.io/version: {{ $root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ $root.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" $root.Chart.Name $root.Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end -}}

{{/*
One release per cluster. The MutatingWebhookConfiguration, the CRD, the scheduler name the webhook writes on pods
and the node taint are the cluster's, not a namespace's: two releases would fight over every GPU pod. The webhook
configuration with gpu-tailor's pods.gpu-tailor.io entry, whatever its name, belongs to the release that installed
it; another release (or a kustomize install of manifests/) stops this one. `lookup` reads the cluster on install and
upgrade only: `helm template` and a client-side dry run see nothing and pass.
*/}}
{{- define "gpu-tailor.onePerCluster" -}}
{{- $configs := lookup "admissionregistration.k8s.io/v1" "MutatingWebhookConfiguration" "" "" -}}
{{- range ($configs.items | default list) -}}
{{- $entries := list -}}
{{- range (.webhooks | default list) }}{{ $entries = append $entries .name }}{{ end -}}
{{- if has "pods.gpu-tailor.io" $entries -}}
{{- $annotations := .metadata.annotations | default dict -}}
{{- $release := index $annotations "meta.helm.sh/release-name" | default "" -}}
{{- $namespace := index $annotations "meta.helm.sh/release-namespace" | default "" -}}
{{- if not (and (eq $release $.Release.Name) (eq $namespace $.Release.Namespace)) -}}
{{- $owner := ternary (printf "Helm release %s in namespace %s" $release $namespace) "something other than Helm (kubectl apply -k manifests/?)" (ne $release "") -}}
{{- fail (printf "gpu-tailor is installed once per cluster, and is already: MutatingWebhookConfiguration %s belongs to %s. Upgrade that release (helm upgrade %s ...), or uninstall it first." .metadata.name $owner (default "RELEASE" $release)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
kube-scheduler's image tag: scheduler.image.tag where set, else the cluster's own version (kube-scheduler's minor
must match the API server's) with what providers append cut off: v1.30.2-eks-abc and v1.30.2-gke.100 -> v1.30.2,
v1.28.7+k3s1 -> v1.28.7; Kubernetes' own pre-releases (v1.36.0-rc.1) keep theirs, as registry.k8s.io tags them.
Outside Chart.yaml's kubeVersion it fails: Helm checks that range for an installed chart, not for a subchart.
*/}}
{{- define "gpu-tailor.schedulerTag" -}}
{{- if .Values.scheduler.image.tag -}}
{{- .Values.scheduler.image.tag -}}
{{- else -}}
{{- $cluster := .Capabilities.KubeVersion.Version -}}
{{- $tag := regexFind "^v?[0-9]+\\.[0-9]+\\.[0-9]+(-(alpha|beta|rc)\\.[0-9]+)?" $cluster -}}
{{- if not (and $tag (semverCompare .Chart.KubeVersion $tag)) -}}
{{- fail (printf "gpu-tailor supports Kubernetes %s and this cluster is %s: kube-scheduler's image follows the cluster's version, and none is checked against this one. Set scheduler.image.tag to run one anyway." .Chart.KubeVersion $cluster) -}}
{{- end -}}
{{- printf "v%s" (trimPrefix "v" $tag) -}}
{{- end -}}
{{- end -}}

{{/* the schedulerName of gpu-tailor-scheduler's profile: the one the webhook writes on the pods it sends there */}}
{{- define "gpu-tailor.schedulerName" -}}
{{- (.Values.webhook.config | default dict).schedulerName | default "gpu-tailor-scheduler" -}}
{{- end -}}

{{- define "gpu-tailor.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag }}
{{- end -}}

{{/* namespace/name of the Secret that holds the webhook's serving certificate */}}
{{- define "gpu-tailor.certsSecret" -}}
{{ .Release.Namespace }}/{{ include "gpu-tailor.component" (list . "webhook-tls") }}
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
  name: {{ include "gpu-tailor.component" (list $root "webhook") }}
  namespace: {{ $root.Release.Namespace }}
  path: {{ $path }}
  port: 443
{{- end -}}
{{- end -}}
