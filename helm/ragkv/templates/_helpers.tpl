{{/* Names, labels and the small decisions several templates share. */}}

{{- define "ragkv.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* <release>-<chart>, or just <release> when it already contains the chart name. */}}
{{- define "ragkv.fullname" -}}
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

{{- define "ragkv.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "ragkv.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "ragkv.selectorLabels" -}}
app.kubernetes.io/name: {{ include "ragkv.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "ragkv.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "ragkv.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "ragkv.image" -}}
{{- $tag := .Values.image.tag | default (printf "%s-%s" .Chart.AppVersion .Values.image.flavor) }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}

{{- define "ragkv.rayImage" -}}
{{- $repo := .Values.ray.image.repository | default .Values.image.repository }}
{{- $tag := .Values.ray.image.tag | default (printf "%s-cuda" .Chart.AppVersion) }}
{{- printf "%s:%s" $repo $tag }}
{{- end }}

{{/* Service names. */}}
{{- define "ragkv.redisName" -}}{{ include "ragkv.fullname" . }}-redis{{- end }}
{{- define "ragkv.rayName" -}}{{ include "ragkv.fullname" . }}-ray{{- end }}
{{/* KubeRay names the head Service "<RayCluster name>-head-svc". */}}
{{- define "ragkv.rayHeadService" -}}{{ include "ragkv.rayName" . }}-head-svc{{- end }}

{{/* --workers: ray://<head>:<clientPort> with the RayCluster, inproc without. */}}
{{- define "ragkv.workers" -}}
{{- if .Values.ray.enabled -}}
ray://{{ include "ragkv.rayHeadService" . }}.{{ .Release.Namespace }}.svc:{{ .Values.ray.clientPort }}
{{- else -}}
inproc
{{- end }}
{{- end }}

{{/* --model: "default" (baked into the image) or the directory under /models. */}}
{{- define "ragkv.modelArg" -}}
{{- if eq .Values.model.source "baked" -}}
default
{{- else -}}
/models/{{ .Values.model.dir }}
{{- end }}
{{- end }}

{{/* Secret + key holding the store URL (never a ConfigMap: it may carry a password). */}}
{{- define "ragkv.storeSecretName" -}}
{{- if and (not .Values.redis.enabled) .Values.externalRedis.existingSecret -}}
{{ .Values.externalRedis.existingSecret }}
{{- else -}}
{{ include "ragkv.fullname" . }}-store
{{- end }}
{{- end }}

{{- define "ragkv.storeSecretKey" -}}
{{- if and (not .Values.redis.enabled) .Values.externalRedis.existingSecret -}}
{{ .Values.externalRedis.existingSecretKey }}
{{- else -}}
redis-url
{{- end }}
{{- end }}

{{/* URL of the bundled Redis: its StatefulSet pod through the headless Service. */}}
{{- define "ragkv.bundledRedisURL" -}}
{{- $host := printf "%s-0.%s.%s.svc" (include "ragkv.redisName" .) (include "ragkv.redisName" .) .Release.Namespace -}}
{{- if .Values.redis.password -}}
redis://:{{ .Values.redis.password | urlquery }}@{{ $host }}:6379/{{ .Values.redis.db }}
{{- else -}}
redis://{{ $host }}:6379/{{ .Values.redis.db }}
{{- end }}
{{- end }}

{{/* URL of an external Redis Cluster given by its seed nodes. */}}
{{- define "ragkv.clusterRedisURL" -}}
{{- $nodes := join "," .Values.externalRedis.clusterNodes -}}
{{- if .Values.externalRedis.password -}}
redis+cluster://:{{ .Values.externalRedis.password | urlquery }}@{{ $nodes }}
{{- else -}}
redis+cluster://{{ $nodes }}
{{- end }}
{{- end }}

{{- define "ragkv.redisCluster" -}}
{{- ternary "1" "0" (and (not .Values.redis.enabled) (or .Values.externalRedis.cluster (not (empty .Values.externalRedis.clusterNodes)))) -}}
{{- end }}

{{- define "ragkv.authSecretName" -}}
{{- .Values.auth.existingSecret | default (printf "%s-auth" (include "ragkv.fullname" .)) }}
{{- end }}

{{- define "ragkv.authSecretKey" -}}
{{- if .Values.auth.existingSecret }}{{ .Values.auth.existingSecretKey }}{{ else }}token{{ end }}
{{- end }}

{{- define "ragkv.tlsSecretName" -}}
{{- .Values.tls.existingSecret | default (printf "%s-tls" (include "ragkv.fullname" .)) }}
{{- end }}

{{/* Environment every ragkv process gets: settings from the ConfigMap, the store URL from its Secret. */}}
{{- define "ragkv.env" -}}
- name: RAGKV_STORE
  valueFrom:
    secretKeyRef:
      name: {{ include "ragkv.storeSecretName" . }}
      key: {{ include "ragkv.storeSecretKey" . }}
{{- end }}

{{/* Volumes for the model (when not baked), /tmp and the cache dir. */}}
{{- define "ragkv.modelVolume" -}}
{{- if eq .Values.model.source "pvc" }}
- name: model
  persistentVolumeClaim:
    claimName: {{ .Values.model.pvc.existingClaim }}
    readOnly: true
{{- else if eq .Values.model.source "hostPath" }}
- name: model
  hostPath:
    path: {{ .Values.model.hostPath.path }}
    type: Directory
{{- else if eq .Values.model.source "initContainer" }}
- name: model
  emptyDir:
    sizeLimit: {{ .Values.model.initContainer.sizeLimit }}
{{- end }}
{{- end }}

{{- define "ragkv.modelMount" -}}
{{- if ne .Values.model.source "baked" }}
- name: model
  mountPath: /models
  readOnly: true
{{- end }}
{{- end }}

{{/* initContainer that copies the model directory out of a model image into the emptyDir. */}}
{{- define "ragkv.modelInitContainer" -}}
{{- if eq .Values.model.source "initContainer" }}
- name: copy-model
  image: {{ .Values.model.initContainer.image }}
  imagePullPolicy: IfNotPresent
  command: ["cp", "-R", "{{ trimSuffix "/" .Values.model.initContainer.sourcePath }}/.", "/models/{{ .Values.model.dir }}"]
  securityContext:
    {{- toYaml .Values.securityContext | nindent 4 }}
  resources:
    requests:
      cpu: 100m
      memory: 64Mi
    limits:
      memory: 256Mi
  volumeMounts:
    - name: model
      mountPath: /models
{{- end }}
{{- end }}
