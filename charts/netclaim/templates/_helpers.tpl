{{/* The image of the agent and the controller: repository:tag, the tag defaulting to appVersion. */}}
{{- define "netclaim.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* A pod's affinity: `.affinity` (the value given) with the nodes the image runs on required in each of
its required node terms (they are ORed: every one must say it), or alone when it has none. Linux only,
and image.architectures (amd64 when absent: `helm upgrade --reuse-values` of a release from before the
value): a Windows or another CPU's node gets no pod that could only fail there. */}}
{{- define "netclaim.affinity" -}}
{{- $platform := list
  (dict "key" "kubernetes.io/os" "operator" "In" "values" (list "linux"))
  (dict "key" "kubernetes.io/arch" "operator" "In" "values" (.architectures | default (list "amd64"))) }}
{{- $affinity := deepCopy (.affinity | default dict) }}
{{- $node := get $affinity "nodeAffinity" | default dict }}
{{- $required := get $node "requiredDuringSchedulingIgnoredDuringExecution" | default dict }}
{{- $terms := list }}
{{- range (get $required "nodeSelectorTerms" | default (list dict)) }}
{{- $terms = append $terms (set (deepCopy .) "matchExpressions" (concat (get . "matchExpressions" | default list) $platform)) }}
{{- end }}
{{- $_ := set $required "nodeSelectorTerms" $terms }}
{{- $_ = set $node "requiredDuringSchedulingIgnoredDuringExecution" $required }}
{{- $_ = set $affinity "nodeAffinity" $node }}
{{- toYaml $affinity }}
{{- end }}

{{/* imagePullPolicy and imagePullSecrets lines of a container / pod spec, when set. */}}
{{- define "netclaim.pullPolicy" -}}
{{- with .Values.image.pullPolicy }}
imagePullPolicy: {{ . }}
{{- end }}
{{- end }}

{{- define "netclaim.pullSecrets" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
{{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* The agent's ServiceAccount: agent.serviceAccountName, the one place its name is set (the
ServiceAccount, its bindings, the DaemonSet and the own-node admission policies all take it from here). */}}
{{- define "netclaim.agentServiceAccount" -}}
{{- if not (regexMatch "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$" .Values.agent.serviceAccountName) }}
{{- fail (printf "agent.serviceAccountName: %q is not a DNS label" .Values.agent.serviceAccountName) }}
{{- end }}
{{- .Values.agent.serviceAccountName }}
{{- end }}

{{/* The agent's ServiceAccount as the apiserver names it in admission requests: the release namespace's,
so that an install into another namespace keeps the own-node policies in force. */}}
{{- define "netclaim.agentUser" -}}
system:serviceaccount:{{ .Release.Namespace }}:{{ include "netclaim.agentServiceAccount" . }}
{{- end }}

{{/* The controller's ServiceAccount as the apiserver names it in admission requests. */}}
{{- define "netclaim.controllerUser" -}}
system:serviceaccount:{{ .Release.Namespace }}:netclaim-controller
{{- end }}

{{/* admission.deviceClassPlugins as the items of a CEL list, filled to 110 columns as in deploy/admission.yaml. */}}
{{- define "netclaim.deviceClassPlugins" -}}
{{- $column := 9 }}
{{- range $i, $plugin := .Values.admission.deviceClassPlugins }}
{{- if not (regexMatch "^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$" $plugin) }}
{{- fail (printf "admission.deviceClassPlugins: %q is not a CNI plugin type (letters, digits, _ . -)" $plugin) }}
{{- end }}
{{- $item := squote $plugin }}
{{- if $i }}
{{- if gt (add $column 3 (len $item)) 110 }},{{ "\n        " }}{{ $column = 8 }}
{{- else }}, {{ $column = add $column 2 }}{{ end }}
{{- end }}
{{- $item }}{{ $column = add $column (len $item) }}
{{- end }}
{{- end }}
