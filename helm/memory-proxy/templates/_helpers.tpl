{{/* Names */}}
{{- define "memory-proxy.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "memory-proxy.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "memory-proxy.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "memory-proxy.labels" -}}
helm.sh/chart: {{ include "memory-proxy.chart" . }}
app.kubernetes.io/name: {{ include "memory-proxy.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Labels of pods besides their selector labels. */}}
{{- define "memory-proxy.podLabels" -}}
helm.sh/chart: {{ include "memory-proxy.chart" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Selector labels of one component: include with (dict "ctx" . "component" "gateway") */}}
{{- define "memory-proxy.selectorLabels" -}}
app.kubernetes.io/name: {{ include "memory-proxy.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "memory-proxy.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "memory-proxy.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "memory-proxy.image" -}}
{{- $repository := required "image.repository is empty: build and push the image first (README.md, Deploy, \"Build and push the image\"), then pass --set image.repository=<registry>/memory-proxy" .Values.image.repository }}
{{- printf "%s:%s" $repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* The one switch: storage.backend decides the chart's shape and the gateway's config. */}}
{{- define "memory-proxy.redisMode" -}}
{{- if eq .Values.storage.backend "redis" }}true{{ end }}
{{- end }}

{{/* Learning-worker Deployment: Redis mode, worker.enabled, and learning on (a worker
with learning.enabled false exits at once). With existingConfigMap the chart cannot see
the config: worker.enabled decides. */}}
{{- define "memory-proxy.workerEnabled" -}}
{{- if and (include "memory-proxy.redisMode" .) .Values.worker.enabled }}
{{- $learning := get (default (dict) .Values.config) "learning" | default (dict) }}
{{- if or .Values.existingConfigMap (get $learning "enabled") }}true{{ end }}
{{- end }}
{{- end }}

{{- define "memory-proxy.redisHost" -}}
{{- printf "%s-redis" (include "memory-proxy.fullname" .) }}
{{- end }}

{{- define "memory-proxy.configMapName" -}}
{{- default (printf "%s-config" (include "memory-proxy.fullname" .)) .Values.existingConfigMap }}
{{- end }}

{{/* The rendered config.yaml: `config` with the chart-owned settings on top. */}}
{{- define "memory-proxy.configYaml" -}}
{{- $cfg := deepCopy (default (dict) .Values.config) }}
{{- $server := merge (dict "host" "0.0.0.0" "port" (int .Values.gateway.port) "shutdown_grace_seconds" (int .Values.gateway.shutdownGraceSeconds)) (default (dict) (get $cfg "server")) }}
{{- $_ := set $server "host" "0.0.0.0" }}
{{- $_ := set $server "port" (int .Values.gateway.port) }}
{{- $_ := set $server "shutdown_grace_seconds" (int .Values.gateway.shutdownGraceSeconds) }}
{{- $_ := set $cfg "server" $server }}
{{- $storage := deepCopy (default (dict) (get $cfg "storage")) }}
{{- $_ := set $storage "backend" .Values.storage.backend }}
{{- if include "memory-proxy.redisMode" . }}
{{- $_ := set $storage "url" "os.environ/REDIS_URL" }}
{{- $_ := unset $storage "path" }}
{{- else }}
{{- $_ := set $storage "path" "/data/memory-proxy.db" }}
{{- $_ := unset $storage "url" }}
{{- end }}
{{- $_ := set $cfg "storage" $storage }}
{{- toYaml $cfg }}
{{- end }}

{{/* Environment shared by the gateway and the worker. */}}
{{- define "memory-proxy.env" -}}
- name: MEMORY_PROXY_CONFIG
  value: /etc/memory-proxy/config.yaml
- name: MEMORY_PROXY_STORAGE__BACKEND
  value: {{ .Values.storage.backend | quote }}
{{- if include "memory-proxy.redisMode" . }}
- name: MEMORY_PROXY_STORAGE__URL
  value: os.environ/REDIS_URL
{{- if .Values.redis.enabled }}
{{- if .Values.redis.auth.existingSecret }}
- name: REDIS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ .Values.redis.auth.existingSecret }}
      key: {{ .Values.redis.auth.passwordKey }}
- name: REDIS_URL
  value: {{ printf "redis://:$(REDIS_PASSWORD)@%s:6379/0" (include "memory-proxy.redisHost" .) | quote }}
{{- else }}
- name: REDIS_URL
  value: {{ printf "redis://%s:6379/0" (include "memory-proxy.redisHost" .) | quote }}
{{- end }}
{{- else }}
- name: REDIS_URL
  valueFrom:
    secretKeyRef:
      name: {{ required "redis.enabled is false: set externalRedis.existingSecret (a Secret holding the Redis URL)" .Values.externalRedis.existingSecret }}
      key: {{ .Values.externalRedis.urlKey }}
{{- end }}
- name: FINGERPRINT_KEY
  valueFrom:
    secretKeyRef:
      name: {{ .Values.fingerprintKey.existingSecret | default (printf "%s-fingerprint" (include "memory-proxy.fullname" .)) }}
      key: {{ .Values.fingerprintKey.key }}
- name: MEMORY_PROXY_LEARNING__FINGERPRINT_KEY
  value: os.environ/FINGERPRINT_KEY
{{- else }}
- name: MEMORY_PROXY_STORAGE__PATH
  value: /data/memory-proxy.db
{{- end }}
{{- with .Values.env }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "memory-proxy.envFrom" -}}
{{- if or .Values.existingSecret .Values.envFrom }}
envFrom:
{{- if .Values.existingSecret }}
  - secretRef:
      name: {{ .Values.existingSecret }}
{{- end }}
{{- with .Values.envFrom }}
{{ toYaml . | indent 2 }}
{{- end }}
{{- end }}
{{- end }}

{{- define "memory-proxy.topologySpread" -}}
{{- if .enabled }}
topologySpreadConstraints:
  - maxSkew: 1
    topologyKey: kubernetes.io/hostname
    whenUnsatisfiable: ScheduleAnyway
    labelSelector:
      matchLabels:
        {{- include "memory-proxy.selectorLabels" (dict "ctx" .ctx "component" .component) | nindent 8 }}
{{- end }}
{{- end }}
