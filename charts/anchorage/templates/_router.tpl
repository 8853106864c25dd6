{{/* Arguments of `anchorage router` (shared by the Deployment and the RayService head). */}}
{{- define "anchorage.routerArgs" -}}
{{- $r := .Values.router -}}
- router
- --host=0.0.0.0
- --port={{ $r.port }}
- --policy={{ $r.policy }}
- --policy-params={{ toJson $r.policyParams }}
- --block-size={{ $r.blockSize }}
- --max-body-bytes={{ int64 $r.maxBodyBytes }}
- --body-timeout-s={{ $r.bodyTimeoutSeconds }}
- --max-inflight-per-replica={{ $r.maxInflightPerReplica }}
- --retries={{ $r.retries }}
- --config-dir=/etc/anchorage/models
{{- if eq $r.discovery.mode "kubernetes" }}
- --discovery=kubernetes
- --k8s-namespace={{ .Release.Namespace }}
- --k8s-selector={{ include "anchorage.modelDiscoverySelector" . }}
- --k8s-port=8000
- --k8s-kind={{ include "anchorage.discoveryKind" . }}
{{- else }}
- --discovery=static
- --replicas={{ join "," $r.discovery.staticReplicas }}
{{- end }}
{{- if and (not $r.kuberay.enabled) (gt (int $r.replicaCount) 1) }}
- --peer-selector=app.kubernetes.io/instance={{ .Release.Name }},app.kubernetes.io/component=router
- --peer-port={{ $r.port }}
{{- end }}
{{- range $r.extraArgs }}
- {{ . | quote }}
{{- end }}
{{- end -}}

{{/* Label selector of the model Services (their Endpoints/EndpointSlices carry it). */}}
{{- define "anchorage.modelDiscoverySelector" -}}
app.kubernetes.io/instance={{ .Release.Name }},app.kubernetes.io/component=model
{{- end -}}

{{/* EndpointSlice where discovery.k8s.io/v1 is served (1.21+), else Endpoints. */}}
{{- define "anchorage.discoveryKind" -}}
{{- if .Capabilities.APIVersions.Has "discovery.k8s.io/v1" -}}EndpointSlice{{- else -}}Endpoints{{- end -}}
{{- end -}}

{{- define "anchorage.routerEnv" -}}
- name: HOME
  value: /tmp
- name: RAY_USAGE_STATS_ENABLED
  value: "0"
- name: POD_NAMESPACE
  valueFrom: {fieldRef: {fieldPath: metadata.namespace}}
- name: ANCHORAGE_TENANT_SECRET
  valueFrom:
    secretKeyRef:
      name: {{ include "anchorage.tenantSecretName" . }}
      key: {{ .Values.secrets.tenant.key }}
{{- if include "anchorage.internalTokenFromChart" . }}
# the router pods share decisions only with holders of this token (secrets.internal)
- name: ANCHORAGE_INTERNAL_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ include "anchorage.internalSecretName" . }}
      key: {{ .Values.secrets.internal.key }}
{{- end }}
- name: POD_NAME
  valueFrom: {fieldRef: {fieldPath: metadata.name}}
- name: POD_IP
  valueFrom: {fieldRef: {fieldPath: status.podIP}}
# Serve's HAProxy ingress with direct ingress (no actor call per request): Ray reads these
# when it starts (anchorage.router.app.hosting_env sets the same for a local router)
- name: RAY_SERVE_ENABLE_HA_PROXY
  value: "1"
- name: RAY_SERVE_THROUGHPUT_OPTIMIZED
  value: "1"
- name: RAY_SERVE_HAPROXY_BALANCE_ALGORITHM
  value: "hdr(x-session-id)"
- name: RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S
  value: "2"
# Serve kills its proxy actor when a ready check outlasts 5 s while it starts or three
# health checks outlast 10 s; a busy node exceeds that (router.app.SERVE_PROXY_TIMEOUTS)
- name: RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S
  value: "60"
- name: RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S
  value: "30"
# Ray starts its workers (the Serve replicas, HAProxy) at nice 15: the router is on the
# request path, so normal priority (router.app.RAY_WORKER_PRIORITY)
- name: RAY_worker_niceness
  value: "0"
{{- with .Values.router.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Each model's policy ConfigMap (written by the operator) at /etc/anchorage/models/<served name>/
(the issue's contract: the router mounts the effective configuration). */}}
{{- define "anchorage.routerVolumeMounts" -}}
- {name: tmp, mountPath: /tmp}
- {name: dshm, mountPath: /dev/shm}
{{- range .Values.models }}
- name: config-{{ .name }}
  mountPath: /etc/anchorage/models/{{ include "anchorage.servedModelName" . }}
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
