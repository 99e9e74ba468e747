{{/* Labels every object carries, as in manifests/base. */}}
{{- define "gpuquota.labels" -}}
app.kubernetes.io/name: koord-gpuquota
{{- end }}

{{- define "gpuquota.selectorLabels" -}}
app.kubernetes.io/name: koord-gpuquota
app.kubernetes.io/component: webhook
{{- end }}

{{/* Non-empty when the replicas elect one ledger writer: strict accounting with a writerLease. */}}
{{- define "gpuquota.writerLease" -}}
{{- if and (eq .Values.accounting "strict") .Values.writerLease }}true{{ end }}
{{- end }}

{{- define "gpuquota.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{- define "gpuquota.clientConfig" -}}
service:
  name: gpuquota-webhook
  namespace: {{ .root.Release.Namespace }}
  path: {{ .path }}
  port: 443
{{- end }}

{{/* The webhooks never see their own namespace, kube-system, or a namespace labelled ignore. */}}
{{- define "gpuquota.namespaceSelector" -}}
matchExpressions:
  - key: kubernetes.io/metadata.name
    operator: NotIn
    values: ["kube-system", {{ .Release.Namespace | quote }}]
  - key: gpuquota.koord-gpuquota.io/ignore
    operator: NotIn
    values: ["true"]
{{- end }}

{{/* manifests/webhooks/webhook-configurations.yaml says why: mirror pods and pods without a GPU name are skipped. */}}
{{- define "gpuquota.podMatchConditions" -}}
- name: not-a-mirror-pod
  expression: >-
    !has(object.metadata.annotations) ||
    !('kubernetes.io/config.mirror' in object.metadata.annotations)
- name: names-a-gpu-resource
  expression: >-
    [object.spec.containers,
     has(object.spec.initContainers) ? object.spec.initContainers : []].exists(containers,
      containers.exists(c, has(c.resources) &&
        [has(c.resources.requests) ? c.resources.requests : {},
         has(c.resources.limits) ? c.resources.limits : {}].exists(resources,
          resources.exists(name,
            name.startsWith('koordinator.sh/gpu') || name.startsWith('kubernetes.io/gpu') ||
            name in ['nvidia.com/gpu', 'amd.com/gpu', 'dcu.com/gpu']))))
{{- end }}

{{- define "gpuquota.caInjection" -}}
{{- if .Values.certManager.enabled }}
annotations:
  cert-manager.io/inject-ca-from: {{ .Release.Namespace }}/gpuquota-webhook
{{- end }}
{{- end }}
