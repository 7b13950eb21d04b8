{{/* The gateway's pod template (Deployment in Redis mode, StatefulSet in SQLite mode). */}}
{{- define "memory-proxy.gatewayPod" -}}
{{- $g := .Values.gateway -}}
metadata:
  labels:
    {{- include "memory-proxy.podLabels" . | nindent 4 }}
    {{- include "memory-proxy.selectorLabels" (dict "ctx" . "component" "gateway") | nindent 4 }}
    {{- with $g.podLabels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  annotations:
    checksum/config: {{ include "memory-proxy.configYaml" . | sha256sum }}
    {{- with $g.podAnnotations }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
spec:
  serviceAccountName: {{ include "memory-proxy.serviceAccountName" . }}
  automountServiceAccountToken: false
  {{- with .Values.imagePullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  securityContext:
    {{- toYaml .Values.podSecurityContext | nindent 4 }}
  terminationGracePeriodSeconds: {{ add $g.preStopSleepSeconds $g.shutdownGraceSeconds 10 }}
  containers:
    - name: gateway
      image: {{ include "memory-proxy.image" . }}
      imagePullPolicy: {{ .Values.image.pullPolicy }}
      args:
        - serve
        - --processes
        - {{ $g.processes | quote }}
        {{- if include "memory-proxy.redisMode" . }}
        - --no-worker
        {{- end }}
      ports:
        - name: http
          containerPort: {{ $g.port }}
          protocol: TCP
      env:
        {{- include "memory-proxy.env" . | nindent 8 }}
        - name: MEMORY_PROXY_SERVER__SHUTDOWN_GRACE_SECONDS
          value: {{ $g.shutdownGraceSeconds | quote }}
      {{- include "memory-proxy.envFrom" . | nindent 6 }}
      startupProbe:
        httpGet: {path: /healthz, port: http}
        {{- toYaml $g.startupProbe | nindent 8 }}
      livenessProbe:
        httpGet: {path: /healthz, port: http}
        {{- toYaml $g.livenessProbe | nindent 8 }}
      readinessProbe:
        httpGet: {path: /readyz, port: http}
        {{- toYaml $g.readinessProbe | nindent 8 }}
      lifecycle:
        preStop:
          exec:
            command: ["sleep", "{{ $g.preStopSleepSeconds }}"]
      securityContext:
        {{- toYaml .Values.securityContext | nindent 8 }}
      resources:
        {{- toYaml $g.resources | nindent 8 }}
      volumeMounts:
        - name: config
          mountPath: /etc/memory-proxy
          readOnly: true
        - name: tmp
          mountPath: /tmp
        {{- if not (include "memory-proxy.redisMode" .) }}
        - name: data
          mountPath: /data
        {{- end }}
  volumes:
    - name: config
      configMap:
        name: {{ include "memory-proxy.configMapName" . }}
        items:
          - key: config.yaml
            path: config.yaml
    - name: tmp
      emptyDir: {}
  {{- include "memory-proxy.topologySpread" (dict "enabled" $g.topologySpread "ctx" . "component" "gateway") | nindent 2 }}
  {{- with $g.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $g.tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $g.affinity }}
  affinity:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end }}
