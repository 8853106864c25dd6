{{/* Chart name, truncated to a DNS label. */}}
{{- define "anchorage.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Prefix of every resource name: <release>-<chart>, or the release alone when it already
contains the chart name. Kept to 40 characters so suffixes stay within 63. */}}
{{- define "anchorage.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "anchorage.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Selector labels of a component: call with (dict "ctx" $ "component" "operator"). */}}
{{- define "anchorage.selectorLabels" -}}
app.kubernetes.io/name: {{ include "anchorage.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* All labels of a component's objects. */}}
{{- define "anchorage.labels" -}}
{{ include "anchorage.selectorLabels" . }}
helm.sh/chart: {{ include "anchorage.chart" .ctx }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
app.kubernetes.io/part-of: anchorage
{{- with .ctx.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Labels of a component's pod template: everything of anchorage.labels that stays the
same across chart versions. helm.sh/chart and app.kubernetes.io/version change on every
chart bump, and a changed pod template replaces every pod (every GPU engine reloads its
weights): they stay on the objects' own metadata only. */}}
{{- define "anchorage.podLabels" -}}
{{ include "anchorage.selectorLabels" . }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
app.kubernetes.io/part-of: anchorage
{{- with .ctx.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "anchorage.modelPodLabels" -}}
{{ include "anchorage.podLabels" (dict "ctx" .ctx "component" "model") }}
anchorage.dev/model: {{ .model.name }}
{{- end -}}

{{/* Selector labels of one model's pods: (dict "ctx" $ "model" $m). */}}
{{- define "anchorage.modelSelectorLabels" -}}
{{ include "anchorage.selectorLabels" (dict "ctx" .ctx "component" "model") }}
anchorage.dev/model: {{ .model.name }}
{{- end -}}

{{- define "anchorage.modelLabels" -}}
{{ include "anchorage.labels" (dict "ctx" .ctx "component" "model") }}
anchorage.dev/model: {{ .model.name }}
{{- end -}}

{{- define "anchorage.modelFullname" -}}
{{- printf "%s-%s" (include "anchorage.fullname" .ctx) .model.name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "anchorage.servedModelName" -}}
{{- default .name .servedModelName -}}
{{- end -}}

{{/* The ConfigMap the operator writes for one AgentCachePolicy: `<policy name>-anchorage`
(operator/config.py); the chart names the policy after the model's Deployment. */}}
{{- define "anchorage.policyConfigMap" -}}
{{- printf "%s-anchorage" (include "anchorage.modelFullname" .) -}}
{{- end -}}

{{- define "anchorage.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* The router's image (Ray Serve): the Deployment's Ray head, KubeRay's head and workers. */}}
{{- define "anchorage.routerImage" -}}
{{- printf "%s:%s" .Values.router.image.repository (default .Chart.AppVersion .Values.router.image.tag) -}}
{{- end -}}

{{- define "anchorage.serviceAccountName" -}}
{{- printf "%s-%s" (include "anchorage.fullname" .ctx) .component -}}
{{- end -}}

{{/* PodDisruptionBudget API: policy/v1 where served (1.21+), else policy/v1beta1. Offline
(`helm template`) Helm lists group/versions only, so the group/version is checked too. */}}
{{- define "anchorage.pdbApiVersion" -}}
{{- if or (.Capabilities.APIVersions.Has "policy/v1/PodDisruptionBudget") (.Capabilities.APIVersions.Has "policy/v1") -}}
policy/v1
{{- else -}}
policy/v1beta1
{{- end -}}
{{- end -}}

{{/* "true" when the Prometheus Operator objects of a setting (auto|true|false) render. */}}
{{- define "anchorage.monitoringOn" -}}
{{- $mode := toString .mode -}}
{{- if eq $mode "true" -}}true
{{- else if and (eq $mode "auto") (.ctx.Capabilities.APIVersions.Has (printf "monitoring.coreos.com/v1/%s" .kind)) -}}true
{{- end -}}
{{- end -}}

{{/* The kopf peering object's name: operator.peering.name, else the release's fullname (a
fixed name clashed between two releases: Helm's ownership check refused the second). */}}
{{- define "anchorage.peeringName" -}}
{{- .Values.operator.peering.name | default (include "anchorage.fullname" .) -}}
{{- end -}}

{{/* The operator watches all namespaces unless watchNamespaces lists some. */}}
{{- define "anchorage.operatorClusterwide" -}}
{{- if not .Values.operator.watchNamespaces -}}true{{- end -}}
{{- end -}}

{{/* Data key of the operator's ConfigMap (operator/config.py DATA_KEY). */}}
{{- define "anchorage.policyConfigKey" -}}anchorage.yaml{{- end -}}

{{/* Only what the operator does (operator/kube.py, handlers.py): kopf watches and patches
AgentCachePolicies (its finalizer, progress annotations, status) and posts Events; the
operator reads, creates and patches the versioned ConfigMap (never update or delete: the
garbage collector removes it with its owner), sets the ConfigMap's ownerReference with
blockOwnerDeletion (clusters enforcing owner-reference permissions require `update` on the
owner's `finalizers` subresource for that), reads/patches the target's scale
subresource, and reads the Services named in spec.tuning.accessLogs (it sends its
access-log token only to node-agent Services of the target: operator/access_logs.py). Peering rules are added where the peering object lives. The integration test
runs the operator under exactly these rules (tests/operator/test_operator_k8s.py). */}}
{{- define "anchorage.operatorNamespacedRules" -}}
- apiGroups: [anchorage.dev]
  resources: [agentcachepolicies]
  verbs: [get, list, watch, patch]
- apiGroups: [anchorage.dev]
  resources: [agentcachepolicies/status]
  verbs: [get, patch]
- apiGroups: [anchorage.dev]
  resources: [agentcachepolicies/finalizers]
  verbs: [update]
- apiGroups: [""]
  resources: [configmaps]
  verbs: [get, create, patch]
- apiGroups: [""]
  resources: [services]
  verbs: [get]
- apiGroups: [""]
  resources: [events]
  verbs: [create]
- apiGroups: [apps]
  resources: [deployments/scale, statefulsets/scale]
  verbs: [get, patch]
{{- end -}}

{{/* The models list with modelDefaults filled in (an entry's own fields win; maps merge
key by key, lists and scalars are replaced), as JSON: use with
`include "anchorage.models" . | fromJsonArray`. Sprig's merge would let a default `true`
override an entry's `false`, hence anchorage.overlay. */}}
{{- define "anchorage.models" -}}
{{- $out := list -}}
{{- range .Values.models -}}
{{- $out = append $out (include "anchorage.overlay" (dict "base" $.Values.modelDefaults "over" .) | fromJson) -}}
{{- end -}}
{{- toJson $out -}}
{{- end -}}

{{/* JSON of map .base with map .over laid over it, recursively. */}}
{{- define "anchorage.overlay" -}}
{{- $out := deepCopy .base -}}
{{- range $k, $v := .over -}}
{{- if and (kindIs "map" $v) (kindIs "map" (get $out $k)) -}}
{{- $_ := set $out $k (include "anchorage.overlay" (dict "base" (get $out $k) "over" $v) | fromJson) -}}
{{- else -}}
{{- $_ := set $out $k $v -}}
{{- end -}}
{{- end -}}
{{- toJson $out -}}
{{- end -}}

{{/* A container's resources with every quantity as a string: server-side apply (Helm 4's
default) rejects bare numbers in quantities on Kubernetes 1.20 ("expected string"). */}}
{{- define "anchorage.resources" -}}
{{- $out := dict -}}
{{- range $section, $q := . -}}
{{- if kindIs "map" $q -}}
{{- $m := dict -}}
{{- range $k, $v := $q -}}
{{- if kindIs "string" $v -}}
{{- $_ := set $m $k $v -}}
{{- else if eq (float64 $v) (float64 (int64 $v)) -}}
{{- $_ := set $m $k (toString (int64 $v)) -}}
{{- else -}}
{{- $_ := set $m $k (toString $v) -}}
{{- end -}}
{{- end -}}
{{- $_ := set $out $section $m -}}
{{- else -}}
{{- $_ := set $out $section $q -}}
{{- end -}}
{{- end -}}
{{- toYaml $out -}}
{{- end -}}

{{/* A component's security context: its own map laid over the global one (recursively;
an own `false` wins, unlike sprig's merge). Call with (dict "global" .Values.x "own" y). */}}
{{- define "anchorage.context" -}}
{{- include "anchorage.overlay" (dict "base" (default (dict) .global) "over" (default (dict) .own)) | fromJson | toYaml -}}
{{- end -}}

{{/* The `release` label a stock kube-prometheus-stack selects monitors and rules by, plus
monitoring.labels. */}}
{{- define "anchorage.monitoringLabels" -}}
{{- with .Values.monitoring.prometheusRelease }}
release: {{ . | quote }}
{{- end }}
{{- with .Values.monitoring.labels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* The Prometheus that may scrape: its namespaces and, when set, its pods. */}}
{{- define "anchorage.monitoringPeer" -}}
{{- $np := .Values.networkPolicy -}}
{{- $peer := dict "namespaceSelector" $np.monitoringNamespaceSelector -}}
{{- if $np.monitoringPodSelector -}}
{{- $_ := set $peer "podSelector" $np.monitoringPodSelector -}}
{{- end -}}
{{- toYaml $peer -}}
{{- end -}}

{{/* The vLLM engine's user, HOME and caches (a uid without a passwd entry, read-only
root): getpass and torch read USER/LOGNAME before the passwd database; every cache vLLM,
torch, Triton, numba, outlines or Hugging Face writes lives under HOME, an emptyDir. */}}
{{- define "anchorage.engineHomeEnv" -}}
- {name: HOME, value: /home/vllm}
- {name: USER, value: vllm}
- {name: LOGNAME, value: vllm}
- {name: XDG_CACHE_HOME, value: /home/vllm/.cache}
- {name: XDG_CONFIG_HOME, value: /home/vllm/.config}
- {name: VLLM_CACHE_ROOT, value: /home/vllm/.cache/vllm}
- {name: VLLM_CONFIG_ROOT, value: /home/vllm/.config/vllm}
- {name: TORCHINDUCTOR_CACHE_DIR, value: /home/vllm/.cache/torchinductor}
- {name: TRITON_CACHE_DIR, value: /home/vllm/.cache/triton}
- {name: TORCH_EXTENSIONS_DIR, value: /home/vllm/.cache/torch_extensions}
- {name: NUMBA_CACHE_DIR, value: /home/vllm/.cache/numba}
- {name: OUTLINES_CACHE_DIR, value: /home/vllm/.cache/outlines}
- {name: TMPDIR, value: /tmp}
{{- end -}}

{{/* The Secret of the router's tenant secret and of the node agents' access-log token:
`secrets.<which>.existingSecret`, else the one the chart creates (templates/secrets.yaml). */}}
{{- define "anchorage.tenantSecretName" -}}
{{- .Values.secrets.tenant.existingSecret | default (printf "%s-tenant" (include "anchorage.fullname" .)) -}}
{{- end -}}
{{- define "anchorage.accessLogSecretName" -}}
{{- .Values.secrets.accessLog.existingSecret | default (printf "%s-access-log" (include "anchorage.fullname" .)) -}}
{{- end -}}

{{/* "true" when the router pods share routing decisions (Deployment mode, more than one pod):
they then need ANCHORAGE_INTERNAL_TOKEN (router/config.py validate()). */}}
{{- define "anchorage.routerPeers" -}}
{{- if and .Values.router.enabled (not .Values.router.kuberay.enabled) (gt (int .Values.router.replicaCount) 1) -}}true{{- end -}}
{{- end -}}

{{/* "true" when the chart supplies ANCHORAGE_INTERNAL_TOKEN: router peers on, and
router.extraEnv does not set it already (the way this was documented before; two entries of
one name would fail server-side apply). */}}
{{- define "anchorage.internalTokenFromChart" -}}
{{- if include "anchorage.routerPeers" . -}}
{{- $own := false -}}
{{- range .Values.router.extraEnv -}}
{{- if eq .name "ANCHORAGE_INTERNAL_TOKEN" -}}{{- $own = true -}}{{- end -}}
{{- end -}}
{{- if not $own -}}true{{- end -}}
{{- end -}}
{{- end -}}

{{- define "anchorage.internalSecretName" -}}
{{- .Values.secrets.internal.existingSecret | default (printf "%s-internal" (include "anchorage.fullname" .)) -}}
{{- end -}}

{{/* ANCHORAGE_ACCESS_LOG_TOKEN from its Secret (the node agents and the operator). */}}
{{- define "anchorage.accessLogTokenEnv" -}}
- name: ANCHORAGE_ACCESS_LOG_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ include "anchorage.accessLogSecretName" . }}
      key: {{ .Values.secrets.accessLog.key }}
{{- end -}}

{{/* A random value for a Secret the chart creates, the one already in the cluster when
there is one (`helm upgrade` keeps it; `helm template` has no cluster: a new one). */}}
{{- define "anchorage.secretValue" -}}
{{- $old := lookup "v1" "Secret" .ns .name -}}
{{- if and $old $old.data (hasKey $old.data .key) -}}
{{- index $old.data .key -}}
{{- else -}}
{{- randAlphaNum 48 | b64enc -}}
{{- end -}}
{{- end -}}
