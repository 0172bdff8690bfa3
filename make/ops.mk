# Operating the pipeline on a KFP cluster: upload, submit, schedule.
# Included from the Makefile, which defines PY (the venv python), `install` and `compile`.
# Every target is a thin wrapper over `python -m pipeline <command>`, or kfp's own CLI for
# listing, pausing, resuming and deleting schedules; see docs/operating.md.
#
#   make upload   KFP_HOST=http://localhost:8888
#   make submit   KFP_HOST=http://localhost:8888 PARAMS="registry_root=gs://b/models epochs=8" WAIT=1
#   make schedule KFP_HOST=... SCHEDULE_NAME=nightly CRON="0 0 2 * * *" VERSION_NAME=0.1.0-g1a2b3c4
#
# Connection: KFP_HOST, KFP_NAMESPACE (or the KF_PIPELINES_ENDPOINT / KF_PIPELINES_NAMESPACE /
# KF_PIPELINES_TOKEN environment variables, which the CLI reads itself). Never put a token
# on the make command line; export KF_PIPELINES_TOKEN instead.

KFP_HOST ?=
KFP_NAMESPACE ?=
PIPELINE_NAME ?= kfp-horovod-mnist
PACKAGE ?= build/pipeline.yaml
# Empty: <package version>-g<commit>[-dirty] (python -m pipeline version-name).
VERSION_NAME ?=
# Space-separated NAME=VALUE pairs (values without spaces), typed by the pipeline's inputs.
PARAMS ?=
EXPERIMENT ?= Default
RUN_NAME ?=
# WAIT=1: follow the run; exit 5 if it fails, 6 if it is not done after WAIT_TIMEOUT seconds.
WAIT ?=
WAIT_TIMEOUT ?= 3600
SCHEDULE_NAME ?=
# A schedule's id (`make schedules` lists them), for schedule-pause | -resume | -delete.
SCHEDULE_ID ?=
# 6 fields, seconds first: SEC MIN HOUR DAY-OF-MONTH MONTH DAY-OF-WEEK.
CRON ?=
MAX_CONCURRENCY ?= 1
# CATCHUP=1: backfill intervals missed while paused.
CATCHUP ?=

OPS_CONNECTION = $(if $(KFP_HOST),--host '$(KFP_HOST)') $(if $(KFP_NAMESPACE),--namespace '$(KFP_NAMESPACE)')
OPS_PARAMS = $(foreach p,$(PARAMS),--param '$(p)')
OPS_VERSION = $(if $(VERSION_NAME),--version-name '$(VERSION_NAME)')
# Upload and package submits recompile build/pipeline.yaml first; a custom PACKAGE is used as is.
OPS_PACKAGE_DEP = $(if $(filter build/pipeline.yaml,$(PACKAGE)),compile,install)

.PHONY: help-ops version-name upload submit schedule schedules schedule-pause schedule-resume \
	schedule-delete

help-ops:
	@echo "make upload           create the pipeline / add version VERSION_NAME (default: from git)"
	@echo "make submit           run PACKAGE (or uploaded VERSION_NAME) with PARAMS; WAIT=1 follows it"
	@echo "make schedule         create recurring run SCHEDULE_NAME with CRON for VERSION_NAME"
	@echo "make schedules        list recurring runs (kfp recurring-run list)"
	@echo "make schedule-pause | schedule-resume | schedule-delete   SCHEDULE_ID=..."
	@echo "connection: KFP_HOST=... [KFP_NAMESPACE=...], token in KF_PIPELINES_TOKEN"

version-name: install
	@$(PY) -m pipeline version-name

upload: $(OPS_PACKAGE_DEP)
	$(PY) -m pipeline upload --package '$(PACKAGE)' --pipeline-name '$(PIPELINE_NAME)' \
		$(OPS_VERSION) $(OPS_CONNECTION)

submit: $(if $(VERSION_NAME),install,$(OPS_PACKAGE_DEP))
	$(PY) -m pipeline submit $(if $(VERSION_NAME),--pipeline-name '$(PIPELINE_NAME)' $(OPS_VERSION),--package '$(PACKAGE)') \
		$(OPS_PARAMS) --experiment '$(EXPERIMENT)' $(if $(RUN_NAME),--run-name '$(RUN_NAME)') \
		$(if $(WAIT),--wait --timeout $(WAIT_TIMEOUT)) $(OPS_CONNECTION)

schedule: install
	@test -n "$(SCHEDULE_NAME)" || { echo "set SCHEDULE_NAME=..." >&2; exit 2; }
	@test -n "$(CRON)" || { echo "set CRON='SEC MIN HOUR DOM MON DOW', e.g. CRON='0 0 2 * * *'" >&2; exit 2; }
	$(PY) -m pipeline schedule --name '$(SCHEDULE_NAME)' --cron '$(CRON)' \
		--pipeline-name '$(PIPELINE_NAME)' --version-name $(if $(VERSION_NAME),'$(VERSION_NAME)',"$$($(PY) -m pipeline version-name)") \
		$(OPS_PARAMS) --experiment '$(EXPERIMENT)' --max-concurrency $(MAX_CONCURRENCY) \
		$(if $(CATCHUP),--catchup,--no-catchup) $(OPS_CONNECTION)

# kfp's own CLI (`kfp`, run through PY): its host flag is --endpoint (else KF_PIPELINES_ENDPOINT).
KFP_CLI = $(PY) -c 'from kfp.cli.__main__ import main; main()' $(if $(KFP_HOST),--endpoint '$(KFP_HOST)') $(if $(KFP_NAMESPACE),--namespace '$(KFP_NAMESPACE)')
KFP_SCHEDULE_VERB = $(subst pause,disable,$(subst resume,enable,$(patsubst schedule-%,%,$@)))

schedules: install
	$(KFP_CLI) recurring-run list

schedule-pause schedule-resume schedule-delete: install
	@test -n "$(SCHEDULE_ID)" || { echo "set SCHEDULE_ID=<id> (make schedules lists them)" >&2; exit 2; }
	$(KFP_CLI) recurring-run $(KFP_SCHEDULE_VERB) '$(SCHEDULE_ID)'

