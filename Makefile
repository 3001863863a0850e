# firescale: one-command set-up, the test suite and the embedded sweep.
#   make sweep   set up what is missing, then run the speedup sweep on the embedded `local` site
#   make test    set up what is missing, then run the whole test suite
#   make setup GPU=1   the GPU stack: TensorFlow with its CUDA packages, Horovod built with NCCL
# Every step leaves a stamp in .venv/.firescale and is skipped when its stamp is newer than its inputs.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
BIN := $(VENV)/bin
STAMPS := $(VENV)/.firescale
HOROVOD_VERSION := 0.28.1
# GPU=1 on a GPU site: TensorFlow with pip's CUDA libraries (pyproject.toml's `gpu` extra) and Horovod built
# with HOROVOD_GPU_OPERATIONS=NCCL against pip's NCCL, or a site module's (firescale.cluster.horovod_build).
# Its steps leave their own stamps (stack-gpu, horovod-gpu), so GPU=1 after a CPU set-up rebuilds them.
GPU ?= 0
ifeq ($(GPU),1)
TENSORFLOW ?= tensorflow==2.15.1
EXTRAS := test,tensorflow,gpu
VARIANT := -gpu
HOROVOD_BUILD_FLAGS := --gpu
else
# tensorflow-cpu on this kind of machine
TENSORFLOW ?= tensorflow-cpu==2.15.1
EXTRAS := test,tensorflow
VARIANT :=
HOROVOD_BUILD_FLAGS :=
endif
# What the stack needs from the operating system (Debian 12 names); dataset-fashion-mnist holds the
# default sweep's data (/usr/share/datasets/fashion-mnist).
DEB_PACKAGES := openmpi-bin libopenmpi-dev cmake g++ make python3-dev python3-venv dataset-fashion-mnist
# Optional: a Slurm for the real-scheduler test tiers (tests/slurm, and tests/vcluster, which also needs
# iproute2 and root; deselect with PYTEST_ARGS="-m 'not slurm and not vcluster'" without them).
DEB_OPTIONAL := slurmctld slurmd slurm-client iproute2
SITES := $(notdir $(patsubst %/,%,$(dir $(wildcard site/*/config.yaml))))
PROFILE_HOME ?= $(or $(XDG_CONFIG_HOME),$(HOME)/.config)/snakemake
PYTEST_ARGS ?=
# The suite runs in two pytest-xdist workers, one core each, a file's tests in one worker (tests/conftest.py);
# PYTEST_WORKERS=0 runs it in one process.
PYTEST_WORKERS ?= 2

.PHONY: help setup system stack horovod package profiles check test sweep lint clean

help:
	@echo "make sweep   set up, then run the speedup sweep on the local site"
	@echo "make test    set up, then run the test suite"
	@echo "make setup   only the set-up (system packages, virtualenv, Horovod, Snakemake profiles)"
	@echo "make setup GPU=1   the same for GPU nodes: Horovod with NCCL (needs a CUDA toolkit's nvcc)"
	@echo "make check   ruff and mypy (make test runs them first)"

setup: system stack horovod package profiles

system: $(STAMPS)/system
stack: $(STAMPS)/stack$(VARIANT)
horovod: $(STAMPS)/horovod$(VARIANT)
package: $(STAMPS)/package

$(STAMPS)/system:
	@missing=""; \
	for p in $(DEB_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' "$$p" 2>/dev/null | grep -q "ok installed" || missing="$$missing $$p"; \
	done; \
	optional=""; \
	for p in $(DEB_OPTIONAL); do \
	  dpkg-query -W -f='$${Status}' "$$p" 2>/dev/null | grep -q "ok installed" || optional="$$optional $$p"; \
	done; \
	if [ -n "$$missing$$optional" ] && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "firescale: installing Debian packages:$$missing$$optional"; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get update -qq; \
	  apt-get install -y -qq --no-install-recommends $$missing; \
	  [ -z "$$optional" ] || apt-get install -y -qq --no-install-recommends $$optional \
	    || echo "firescale: optional packages$$optional could not be installed; continuing without them"; \
	elif [ -n "$$missing" ]; then \
	  echo "firescale: these system packages are missing:$$missing"; \
	  echo "  install them as root, e.g.: sudo apt-get install$$missing"; \
	  echo "  (on other systems: an MPI with its compiler wrappers, cmake, a C++17 compiler, Python 3.11 headers and venv)"; \
	  exit 1; \
	fi
	@command -v mpicxx >/dev/null || { echo "firescale: mpicxx not found; install libopenmpi-dev (or your MPI's development package)"; exit 1; }
	@mkdir -p $(STAMPS) && touch $@

$(BIN)/python:
	@$(PYTHON) -c 'import sys; assert sys.version_info[:2] == (3, 11), sys.version' \
	  || { echo "firescale: Python 3.11 is required; set PYTHON=/path/to/python3.11"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade "pip>=23.2" "setuptools>=74.1,<75" wheel

$(STAMPS)/stack$(VARIANT): pyproject.toml $(STAMPS)/system | $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[$(EXTRAS)]'
	$(if $(VARIANT),$(BIN)/python -m pip uninstall -q -y tensorflow-cpu)
	$(BIN)/python -m pip install -q --no-deps "$(TENSORFLOW)"
	@touch $@

# Horovod is built from source against the venv's TensorFlow and the system Open MPI (and, with GPU=1,
# NCCL and the CUDA toolkit's nvcc); the step does nothing when the installed build is the one asked for.
$(STAMPS)/horovod$(VARIANT): $(STAMPS)/stack$(VARIANT)
	@$(BIN)/python -m firescale.cluster.horovod_build install --version $(HOROVOD_VERSION) $(HOROVOD_BUILD_FLAGS)
	@touch $@

# firescale itself, rebuilt when its C extension (the pixel kernel) changes.
$(STAMPS)/package: $(STAMPS)/horovod$(VARIANT) $(wildcard src/firescale/schemas/*.json) src/firescale/_pixels.c
	$(BIN)/python -m pip install -q --no-deps --no-build-isolation -e .
	$(BIN)/firescale --version
	@touch $@

# Install every site's Snakemake profile where Snakemake looks for it (never site/ itself).
profiles: $(addprefix $(PROFILE_HOME)/,$(addsuffix /config.yaml,$(SITES)))

$(PROFILE_HOME)/%/config.yaml: site/%/config.yaml
	@mkdir -p $(dir $@)
	@cp $< $@.tmp && mv $@.tmp $@
	@echo "firescale: installed Snakemake profile '$*' in $(dir $@)"

# The venv's commands (firescale, snakemake, horovodrun) come first for the workflow's jobs.
test sweep lint: export PATH := $(abspath $(BIN)):$(PATH)

# Style and types: ruff over the package and the tests, mypy over the pure modules (pyproject.toml).
check: setup
	$(BIN)/ruff check src tests
	$(BIN)/mypy

# The tests marked `aside` sleep while a real scheduler's clock runs (a controller's outage), with the CPU
# idle: they run in a pytest of their own beside the workers, and their output follows the workers'.
# Exit status 5 is pytest's "no test selected" (PYTEST_ARGS chose none of one kind).
test: check
	@$(BIN)/python -m pytest --aside only -p no:cacheprovider --durations=5 $(PYTEST_ARGS) \
	  > $(VENV)/aside-tests.log 2>&1 & aside=$$!; \
	set +e; \
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadfile --durations=15 --aside exclude $(PYTEST_ARGS); \
	main=$$?; wait $$aside; side=$$?; \
	echo "--- the tests marked aside, run beside the workers ($(VENV)/aside-tests.log)"; cat $(VENV)/aside-tests.log; \
	if [ $$main -eq 5 ] && [ $$side -eq 5 ]; then exit 5; fi; \
	for rc in $$main $$side; do if [ $$rc -ne 0 ] && [ $$rc -ne 5 ]; then exit $$rc; fi; done

lint: check
	$(BIN)/snakemake --lint

sweep: setup
	$(BIN)/snakemake --profile local speedup_sweep

clean:
	rm -rf $(VENV) .pytest_cache .snakemake
