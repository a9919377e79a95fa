{{- define "astraflow.fullname" -}}
{{- printf "%s-astraflow" .Release.Name | trunc 52 | trimSuffix "-" -}}
{{- end -}}

{{- define "astraflow.secretName" -}}
{{- .Values.secrets.name | default (printf "%s-secrets" (include "astraflow.fullname" .)) -}}
{{- end -}}

{{- define "astraflow.bootstrap" -}}
{{- if .Values.kafka.bootstrap -}}
{{- .Values.kafka.bootstrap -}}
{{- else if .Values.kafka.strimzi.enabled -}}
{{- printf "%s-kafka-bootstrap:9092" .Values.kafka.strimzi.cluster -}}
{{- else -}}
{{- fail "kafka.bootstrap: name an existing cluster, or set kafka.strimzi.enabled" -}}
{{- end -}}
{{- end -}}

{{- define "astraflow.labels" -}}
app.kubernetes.io/name: astraflow
app.kubernetes.io/instance: {{ .Release.Name }}
astraflow.io/job: {{ required "job.name is required" .Values.job.name | quote }}
{{- end -}}

{{/* the environment, volumes and mounts every component has */}}
{{- define "astraflow.env" -}}
- name: POD_NAME
  valueFrom: {fieldRef: {fieldPath: metadata.name}}
- name: AF_BOOTSTRAP
  value: {{ include "astraflow.bootstrap" . | quote }}
{{- range $name, $_ := .Values.secrets.env }}
- name: {{ $name }}
  valueFrom: {secretKeyRef: {name: {{ include "astraflow.secretName" $ }}, key: {{ $name }}}}
{{- end }}
{{- end -}}

{{- define "astraflow.mounts" -}}
- {name: job, mountPath: /etc/astraflow/job, readOnly: true}
- {name: secrets, mountPath: /etc/astraflow/secrets, readOnly: true}
- {name: run, mountPath: /var/lib/astraflow}
{{- end -}}

{{- define "astraflow.volumes" -}}
- name: job
  configMap: {name: {{ include "astraflow.fullname" . }}-job}
- name: secrets
  secret: {secretName: {{ include "astraflow.secretName" . }}}
- name: run
  persistentVolumeClaim: {claimName: {{ .Values.runDir.existingClaim | default (printf "%s-run" (include "astraflow.fullname" .)) }}}
{{- end -}}

{{/* `astraflow node` with the job config, the cluster and the shared run dir */}}
{{- define "astraflow.node" -}}
astraflow node --config /etc/astraflow/job/job.yaml --bootstrap-servers "$AF_BOOTSTRAP" --run-dir /var/lib/astraflow/{{ .Values.job.name }}{{ range .Values.job.args }} {{ . | quote }}{{ end }}
{{- end -}}

{{- define "astraflow.resources" -}}
requests:
  cpu: {{ .resources.cpu | quote }}
  memory: {{ .resources.memory | quote }}
{{- if .gpus }}
  nvidia.com/gpu: {{ .gpus }}
limits:
  nvidia.com/gpu: {{ .gpus }}
{{- end }}
{{- end -}}
