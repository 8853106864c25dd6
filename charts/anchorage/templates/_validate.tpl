{{/* The images are not published: every repository is empty by default and must be set to
where the user pushed the images scripts/images/build.py builds. Only the images a pod of
this release runs are required (the router's with the router on, the Anchorage image with
the operator or a model's node-agent sidecar, each model's engine image). */}}
{{- define "anchorage.validateImages" -}}
{{- $missing := list -}}
{{- if and (or .Values.operator.enabled .Values.models .Values.crds.upgradeJob.enabled) (not .Values.image.repository) -}}
{{- $missing = append $missing "image.repository (anchorage)" -}}
{{- end -}}
{{- if and (or .Values.router.enabled .Values.epp.enabled) (not .Values.router.image.repository) -}}
{{- $missing = append $missing "router.image.repository (anchorage-router)" -}}
{{- end -}}
{{- range $m := include "anchorage.models" . | fromJsonArray -}}
{{- if not (dig "image" "repository" "" $m) -}}
{{- $missing = append $missing (printf "modelDefaults.image.repository or models[name=%s].image.repository (vllm-anchorage)" $m.name) -}}
{{- end -}}
{{- end -}}
{{- if $missing -}}
{{- fail (printf "\n\nAnchorage's images are not published: no image repository is set for %s.\nBuild and push them to your registry, then point the chart at it (docs/chart.md, \"Images\"):\n  python scripts/images/build.py --registry registry.example.com/ml --push\n  helm install ... --set image.repository=registry.example.com/ml/anchorage \\\n    --set router.image.repository=registry.example.com/ml/anchorage-router \\\n    --set modelDefaults.image.repository=registry.example.com/ml/vllm-anchorage\n" (join ", " $missing)) -}}
{{- end -}}
{{- end -}}

{{/* A model Hugging Face serves only to accounts that accepted its licence (every
meta-llama/ and google/gemma repository is gated) needs a token: without one vLLM's download
answers 401 and the pod crash-loops. Refused unless the model has hfTokenSecret, or its
extraEnv brings a token or an offline/mirror setup of the user's own (HF_TOKEN,
HF_HUB_OFFLINE, HF_ENDPOINT). A local path (/...) never downloads. */}}
{{- define "anchorage.validateGatedModels" -}}
{{- range $m := include "anchorage.models" . | fromJsonArray -}}
{{- $gated := or (hasPrefix "meta-llama/" $m.model) (hasPrefix "google/gemma" $m.model) -}}
{{- $own := false -}}
{{- range $m.extraEnv -}}
{{- if has .name (list "HF_TOKEN" "HF_HUB_OFFLINE" "HF_ENDPOINT") -}}{{- $own = true -}}{{- end -}}
{{- end -}}
{{- if and $gated (not (dig "hfTokenSecret" "name" "" $m)) (not $own) -}}
{{- fail (printf "\n\nmodels[name=%s]: %s is gated on Hugging Face and no token is set: every engine pod would crash-loop on HTTP 401.\nCreate a Secret with a token of an account that accepted the model's licence and name it:\n  kubectl -n %s create secret generic hf-token --from-literal=token=hf_...\n  --set modelDefaults.hfTokenSecret.name=hf-token   (or models[i].hfTokenSecret.name)\nor serve an ungated model (the chart's default: Qwen/Qwen2.5-7B-Instruct).\n" $m.name $m.model $.Release.Namespace) -}}
{{- end -}}
{{- end -}}
{{- end -}}
