{{/* Arguments of `anchorage router` (shared by the Deployment and the RayService head). */}}
{{- define "anchorage.routerArgs" -}}
{{- $r := .Values.router -}}
- router
- --host=0.0.0.0
- --port={{ $r.port }}
- --policy={{ $r.policy }}
- --serve-replicas={{ $r.serveReplicas }}
- --max-request-bytes={{ int64 $r.maxRequestBytes }}
- --upstream-timeout-s={{ $r.upstreamTimeoutSeconds }}
- --num-cpus={{ $r.ray.numCpus }}
{{- if $r.ray.objectStoreMemoryBytes }}
- --object-store-memory={{ int64 $r.ray.objectStoreMemoryBytes }}
{{- end }}
{{- if eq $r.discovery.mode "kubernetes" }}
- --discovery=kubernetes
- --discovery-namespace={{ .Release.Namespace }}
- --discovery-selector=app.kubernetes.io/instance={{ .Release.Name }},app.kubernetes.io/component=model
{{- else }}
- --discovery=static
{{- range $r.discovery.staticReplicas }}
- --replica={{ . }}
{{- end }}
{{- end }}
- --config-dir=/etc/anchorage/models
{{- range $r.extraArgs }}
- {{ . | quote }}
{{- end }}
{{- end -}}

{{- define "anchorage.routerEnv" -}}
- name: HOME
  value: /tmp
- name: RAY_USAGE_STATS_ENABLED
  value: "0"
- name: POD_NAMESPACE
  valueFrom: {fieldRef: {fieldPath: metadata.namespace}}
{{- with .Values.router.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Each model's policy ConfigMap (written by the operator) at /etc/anchorage/models/<model>/. */}}
{{- define "anchorage.routerVolumeMounts" -}}
- {name: tmp, mountPath: /tmp}
- {name: dshm, mountPath: /dev/shm}
{{- range .Values.models }}
- name: config-{{ .name }}
  mountPath: /etc/anchorage/models/{{ .name }}
  readOnly: true
{{- end }}
{{- end -}}

{{- define "anchorage.routerVolumes" -}}
- name: tmp
  emptyDir: {sizeLimit: 4Gi}
- name: dshm
  emptyDir: {medium: Memory, sizeLimit: 2Gi}
{{- range .Values.models }}
- name: config-{{ .name }}
  configMap:
    name: {{ include "anchorage.policyConfigMap" (dict "ctx" $ "model" .) }}
    optional: true
{{- end }}
{{- end -}}
