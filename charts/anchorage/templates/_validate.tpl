{{/* The images are not published: every repository is empty by default and must be set to
where the user pushed the images scripts/images/build.py builds. Only the images a pod of
this release runs are required (the router's with the router on, the Anchorage image with
the operator or a model's node-agent sidecar, each model's engine image). */}}
{{- define "anchorage.validateImages" -}}
{{- $missing := list -}}
{{- if and (or .Values.operator.enabled .Values.models) (not .Values.image.repository) -}}
{{- $missing = append $missing "image.repository (anchorage)" -}}
{{- end -}}
{{- if and .Values.router.enabled (not .Values.router.image.repository) -}}
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
