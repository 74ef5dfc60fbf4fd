{{- define "llmgw.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}{{ .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else -}}{{ printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" }}{{- end -}}
{{- end -}}

{{- define "llmgw.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "llmgw.selector" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: gateway
{{- end -}}

{{- define "llmgw.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "llmgw.secretName" -}}
{{ .Values.existingSecret | default (printf "%s-secrets" (include "llmgw.fullname" .)) }}
{{- end -}}

{{/* The gateway's config file: values.config, plus the engine pools' models when config.models is unset. */}}
{{- define "llmgw.config" -}}
{{- $config := deepCopy .Values.config -}}
{{- if and .Values.enginePools (not (hasKey $config "models")) -}}
{{- $models := list -}}
{{- $pools := list -}}
{{- range .Values.enginePools -}}
{{- $url := printf "http://%s-engine-%s:%v/v1" (include "llmgw.fullname" $) .name (.port | default 8000) -}}
{{- $deployment := dict "name" (printf "engine-%s" .name) "base_url" $url "model" (.model | default .name) "input_price_per_1m" (.inputPricePer1M | default 0) "output_price_per_1m" (.outputPricePer1M | default 0) -}}
{{- $models = append $models (dict "name" (.model | default .name) "deployments" (list $deployment)) -}}
{{- $pools = append $pools (.model | default .name) -}}
{{- end -}}
{{- $_ := set $config "models" $models -}}
{{- $routing := get $config "routing" | default dict -}}
{{- $_ := set $routing "engine_pools" $pools -}}
{{- $_ := set $config "routing" $routing -}}
{{- end -}}
{{ toYaml $config }}
{{- end -}}

{{/* Environment and mounts shared by the gateway pods and the migration Job. */}}
{{- define "llmgw.env" -}}
- name: LLMGW_CONFIG_FILE
  value: /etc/llmgw/config/gateway.yaml
- name: LLMGW_POLICIES__AUTO_MIGRATE
  value: "false"
- name: LLMGW_SHUTDOWN_GRACE_S
  value: {{ .Values.drain.shutdownGraceSeconds | quote }}
{{- range $name, $key := dict "LLMGW_MASTER_KEY" "masterKey" "LLMGW_ADMIN_TOKEN" "adminToken" "LLMGW_DATABASE_URL" "databaseUrl" "LLMGW_REDIS_URL" "redisUrl" }}
- name: {{ $name }}
  valueFrom:
    secretKeyRef: {name: {{ include "llmgw.secretName" $ }}, key: {{ $key }}, optional: {{ ne $key "masterKey" }}}
{{- end }}
{{- range $name, $value := .Values.env }}
- name: {{ $name }}
  value: {{ $value | quote }}
{{- end }}
{{- end -}}

{{- define "llmgw.volumeMounts" -}}
- {name: config, mountPath: /etc/llmgw/config, readOnly: true}
- {name: tmp, mountPath: /tmp}
- {name: data, mountPath: /var/lib/llmgw}
{{- if .Values.tls.secretName }}
- {name: tls, mountPath: {{ .Values.tls.mountPath }}, readOnly: true}
{{- end }}
{{- end -}}

{{- define "llmgw.volumes" -}}
- name: config
  configMap: {name: {{ include "llmgw.fullname" . }}-config}
- {name: tmp, emptyDir: {medium: Memory, sizeLimit: 64Mi}}
- {name: data, emptyDir: {sizeLimit: 256Mi}}
{{- if .Values.tls.secretName }}
- name: tls
  secret: {secretName: {{ .Values.tls.secretName }}}
{{- end }}
{{- end -}}
