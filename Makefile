# firescale: one-command set-up, the test suite and the embedded sweep.
#   make sweep   set up what is missing, then run the speedup sweep on the embedded `local` site
#   make test    set up what is missing, then run the whole test suite
#   make fuzz    the fuzz tier for FUZZ_MINUTES (default 30) on one core, the pixel kernel built with ASan
#   make setup GPU=1   the GPU stack: TensorFlow with its CUDA packages, Horovod built with NCCL
#   make setup FRAMEWORKS=pytorch   only the PyTorch backend: no TensorFlow, no Horovod, Python 3.11 to 3.13
# Every step leaves a stamp in .venv/.firescale and is skipped when its stamp is newer than its inputs.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
BIN := $(VENV)/bin
STAMPS := $(VENV)/.firescale
HOROVOD_VERSION := 0.28.1
# The training backends to set up: `tensorflow` (TensorFlow 2.15.1 and Horovod, pyproject.toml's `tensorflow`
# extra) and `pytorch` (torch.distributed, the `pytorch` extra).  The test suite has tests for both, so both
# is the default; FRAMEWORKS=pytorch leaves TensorFlow and Horovod out, and then any Python from 3.11 to 3.13
# will do (TensorFlow 2.15 has wheels for 3.11 at most).  With GPU=1 the default is tensorflow alone, as
# before; see GPU below for why one virtualenv cannot hold both backends' CUDA libraries.
GPU ?= 0
# Without FRAMEWORKS given, a Python that cannot run TensorFlow 2.15 (any but 3.11: the virtualenv's where it exists,
# else PYTHON) gets the PyTorch backend alone, and `make test` and `make sweep` follow it (docs/install.md).
SETUP_PYTHON := $(if $(wildcard $(BIN)/python),$(BIN)/python,$(PYTHON))
ifeq ($(origin FRAMEWORKS),undefined)
ifeq ($(shell $(SETUP_PYTHON) -c 'import sys; print(int(sys.version_info[:2] == (3, 11)))' 2>/dev/null),0)
FRAMEWORKS := pytorch
PYTORCH_ALONE := $(shell $(SETUP_PYTHON) -V 2>&1) ($(SETUP_PYTHON))
endif
endif
ifeq ($(GPU),1)
FRAMEWORKS ?= tensorflow
else
FRAMEWORKS ?= tensorflow pytorch
endif
ifneq ($(filter-out tensorflow pytorch,$(FRAMEWORKS)),)
$(error FRAMEWORKS: unknown backend '$(filter-out tensorflow pytorch,$(FRAMEWORKS))'; name tensorflow, pytorch or both)
endif
ifeq ($(strip $(FRAMEWORKS)),)
$(error FRAMEWORKS is empty; name tensorflow, pytorch or both)
endif
WITH_TF := $(filter tensorflow,$(FRAMEWORKS))
WITH_TORCH := $(filter pytorch,$(FRAMEWORKS))
# torch 2.13.0 needs setuptools >= 77.0.3; setuptools 82 dropped pkg_resources, which TensorBoard 2.15 imports.
# Every step that installs passes this range, so that no requirement moves setuptools out of it.
SETUPTOOLS := setuptools>=77.0.3,<82
# GPU=1 on a GPU site: TensorFlow with pip's CUDA libraries (pyproject.toml's `gpu` extra) and Horovod built
# with HOROVOD_GPU_OPERATIONS=NCCL against pip's NCCL, or a site module's (firescale.cluster.horovod_build).
# With FRAMEWORKS=pytorch, GPU=1 installs PyPI's torch, a CUDA build (see TORCH).
# Its steps leave their own stamps (stack-gpu, horovod-gpu, torch-gpu), so GPU=1 after a CPU set-up redoes them.
# One virtualenv takes one backend's CUDA libraries: TensorFlow 2.15.1 wants CUDA 12.2 and cuDNN 8
# (nvidia-*-cu12), torch 2.14.1 CUDA 13 and cuDNN 9, and their nvidia-nccl-cu12 and nvidia-nccl-cu13 write the
# same nvidia/nccl/lib/libnccl.so.2 (Horovod's NCCL) -- as do the two cuDNN packages under nvidia/cudnn.
ifeq ($(GPU),1)
ifneq ($(and $(WITH_TF),$(WITH_TORCH)),)
$(error GPU=1 sets up one backend per virtualenv (their CUDA libraries overwrite each other's files): \
  make setup GPU=1 FRAMEWORKS=tensorflow, then make setup GPU=1 FRAMEWORKS=pytorch VENV=.venv-torch)
endif
TENSORFLOW ?= tensorflow==2.15.1
TF_EXTRAS := tensorflow,gpu
VARIANT := -gpu
HOROVOD_BUILD_FLAGS := --gpu
# PyPI's default build of torch 2.14.1 carries CUDA 13 (cuda-toolkit and nvidia-* packages, about 2.8 GB of
# wheels); it needs an NVIDIA driver >= 580.  Sites with an older driver pin a CUDA 12 release, e.g.
# TORCH=torch==2.9.1 (CUDA 12.8).
TORCH ?= torch==2.14.1
else
# tensorflow-cpu on this kind of machine
TENSORFLOW ?= tensorflow-cpu==2.15.1
TF_EXTRAS := tensorflow
VARIANT :=
HOROVOD_BUILD_FLAGS :=
# torch's CPU build.  Pinned exactly, so pip never chooses a build itself: a range takes PyPI's newest release,
# which on Linux is a CUDA build of several GB.  On the project's machines, CI's included, pip finds
# torch-2.13.0+cpu (Python 3.11) on disk (/opt/wheels, pip's find-links) and prefers it to PyPI's 2.13.0.  Elsewhere
# the torch step tries PyTorch's CPU index itself, and stops rather than download a CUDA build (ALLOW_CUDA_TORCH).
TORCH ?= torch==2.13.0
endif
TORCH_INDEX ?=
# A CPU set-up where pip reaches no CPU build of torch (no wheel on disk, PyTorch's CPU index closed) stops before
# PyPI's CUDA build, about 3 GB; ALLOW_CUDA_TORCH=1 takes that build anyway, to run on the CPU.
ALLOW_CUDA_TORCH ?= 0
comma := ,
# What the stack step installs from pyproject.toml: the test tools and TensorFlow's extras.  torch has a step
# of its own (the `pytorch` extra is for installs without make: they pin torch the same way).
EXTRAS := test$(if $(WITH_TF),$(comma)$(TF_EXTRAS))
# The TensorFlow stack keeps its stamps (stack, stack-gpu); without TensorFlow the step installs the base
# alone and leaves stack-base.
STACK := $(STAMPS)/$(if $(WITH_TF),stack$(VARIANT),stack-base)
# TensorFlow 2.15 has wheels for Python 3.11 only; the rest of firescale runs on 3.11 to 3.13.
ifneq ($(WITH_TF),)
PYTHON_OK := (3, 11) == sys.version_info[:2]
PYTHON_WANTED := Python 3.11 (TensorFlow 2.15)
else
PYTHON_OK := (3, 11) <= sys.version_info[:2] <= (3, 13)
PYTHON_WANTED := Python 3.11, 3.12 or 3.13
endif
# What the stack needs from the operating system (Debian 12 names); dataset-fashion-mnist holds the
# default sweep's data (/usr/share/datasets/fashion-mnist).
DEB_PACKAGES := openmpi-bin libopenmpi-dev cmake g++ make python3-dev python3-venv dataset-fashion-mnist
# Optional: a Slurm for the real-scheduler test tiers (tests/slurm, and tests/vcluster, which also needs
# iproute2 and root; deselect with PYTEST_ARGS="-m 'not slurm and not vcluster'" without them), and
# Debian's PostgreSQL server for the results store's PostgreSQL tier (tests/store, marker `postgres`;
# its tests skip, naming why, where no server can start).
DEB_OPTIONAL := slurmctld slurmd slurm-client iproute2 postgresql
SITES := $(notdir $(patsubst %/,%,$(dir $(wildcard site/*/config.yaml))))
PROFILE_HOME ?= $(or $(XDG_CONFIG_HOME),$(HOME)/.config)/snakemake
PYTEST_ARGS ?=
# The suite runs in two pytest-xdist workers, one core each, a file's tests in one worker (tests/conftest.py);
# PYTEST_WORKERS=0 runs it in one process.
PYTEST_WORKERS ?= 2

.PHONY: help setup pytorch-alone system stack torch horovod package profiles check test fuzz sweep lint clean

help:
	@echo "make sweep   set up, then run the speedup sweep on the local site"
	@echo "make test    set up, then run the test suite"
	@echo "make setup   only the set-up (system packages, virtualenv, Horovod, Snakemake profiles)"
	@echo "make setup GPU=1   the same for GPU nodes: Horovod with NCCL (needs a CUDA toolkit's nvcc)"
	@echo "make setup FRAMEWORKS=pytorch   only the PyTorch backend (add GPU=1 for torch's CUDA build)"
	@echo "make check   ruff and mypy (make test runs them first)"
	@echo "make fuzz    the fuzz tier for FUZZ_MINUTES (default 30), the pixel kernel built with AddressSanitizer"

setup: $(if $(PYTORCH_ALONE),pytorch-alone) system stack $(if $(WITH_TORCH),torch) $(if $(WITH_TF),horovod) \
       package profiles

pytorch-alone:
	@echo "firescale: $(PYTORCH_ALONE) cannot run TensorFlow 2.15 (Python 3.11 only): setting up the PyTorch" \
	  "backend alone, without TensorFlow and Horovod; for both, make setup PYTHON=/path/to/python3.11 (docs/install.md)"

system: $(STAMPS)/system
stack: $(STACK)
torch: $(STAMPS)/torch$(VARIANT)
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

# $(call python_check,PYTHON): stop unless PYTHON is a Python the chosen backends run on.
python_check = $(1) -c 'import sys; sys.exit(not ($(PYTHON_OK)))' || { \
	  echo "firescale: $(PYTHON_WANTED) is required, and $(1) is $$($(1) -V 2>&1)"; \
	  echo "  set PYTHON=/path/to/python3.X (for a virtualenv of another Python: make clean, or VENV=elsewhere)"; \
	  exit 1; }

$(BIN)/python:
	@$(call python_check,$(PYTHON))
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade "pip>=23.2" "$(SETUPTOOLS)" wheel

# pyproject.toml's dependencies, the test tools and, with TensorFlow, its extras.
$(STACK): pyproject.toml $(STAMPS)/system | $(BIN)/python
	@$(call python_check,$(BIN)/python)
	$(BIN)/python -m pip install -q -e '.[$(EXTRAS)]' "$(SETUPTOOLS)"
ifneq ($(WITH_TF),)
	$(if $(VARIANT),$(BIN)/python -m pip uninstall -q -y tensorflow-cpu)
	$(BIN)/python -m pip install -q --no-deps "$(TENSORFLOW)"
endif
	@touch $@

# torch at its pin (TORCH above), after the stack, whose packages it leaves as they are (it needs none of
# TensorFlow's, and NumPy 1.26 suits it).  firescale.cluster.torch_install reads pip's dry-run reports and takes,
# on a CPU set-up, a CPU build: TORCH_INDEX's, else the one pip finds, else PyTorch's CPU index's; a CUDA build of
# several GB only with ALLOW_CUDA_TORCH=1.
$(STAMPS)/torch$(VARIANT): $(STACK)
	$(BIN)/python -m firescale.cluster.torch_install "$(TORCH)" "$(SETUPTOOLS)" --report-dir $(STAMPS) \
	  $(if $(TORCH_INDEX),--index "$(TORCH_INDEX)") $(if $(filter 1,$(ALLOW_CUDA_TORCH)),--allow-cuda) \
	  $(if $(filter 1,$(GPU)),--gpu)
	$(BIN)/python -c 'import torch; print("firescale: torch", torch.__version__, "CUDA", torch.version.cuda)'
	@touch $@

# Horovod is built from source against the venv's TensorFlow and the system Open MPI (and, with GPU=1,
# NCCL and the CUDA toolkit's nvcc); the step does nothing when the installed build is the one asked for.
$(STAMPS)/horovod$(VARIANT): $(STAMPS)/stack$(VARIANT)
	@$(BIN)/python -m firescale.cluster.horovod_build install --version $(HOROVOD_VERSION) $(HOROVOD_BUILD_FLAGS)
	@touch $@

# firescale itself, rebuilt when its C extension (the pixel kernel) changes.
$(STAMPS)/package: $(STACK) $(if $(WITH_TF),$(STAMPS)/horovod$(VARIANT)) $(if $(WITH_TORCH),$(STAMPS)/torch$(VARIANT)) \
                   $(wildcard src/firescale/schemas/*.json) src/firescale/_pixels.c
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

# Style and types: ruff over the package and the tests, mypy over the whole package (pyproject.toml).
check: setup
	$(BIN)/ruff check src tests
	$(BIN)/mypy

# The tests marked `aside` sleep while a real scheduler's clock runs (a controller's outage), with the CPU
# idle: they run in a pytest of their own beside the workers, and their output follows the workers'.
# Exit status 5 is pytest's "no test selected" (PYTEST_ARGS chose none of one kind).
# A backend the set-up leaves out (FRAMEWORKS=pytorch, or a Python that cannot run TensorFlow) has its tier
# deselected by its marker, and the last lines say how many tests that tier holds.
LEFT_OUT_TIER := $(if $(WITH_TF),$(if $(WITH_TORCH),,pytorch),tensorflow)
LEAVE_OUT := $(if $(LEFT_OUT_TIER),-m 'not $(LEFT_OUT_TIER)')
test: check
	@$(BIN)/python -m pytest --aside only -p no:cacheprovider --durations=5 $(LEAVE_OUT) $(PYTEST_ARGS) \
	  > $(VENV)/aside-tests.log 2>&1 & aside=$$!; \
	set +e; \
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadfile --durations=15 --aside exclude $(LEAVE_OUT) \
	  $(PYTEST_ARGS); \
	main=$$?; wait $$aside; side=$$?; \
	echo "--- the tests marked aside, run beside the workers ($(VENV)/aside-tests.log)"; cat $(VENV)/aside-tests.log; \
	$(if $(LEFT_OUT_TIER),echo "firescale: left out the $(LEFT_OUT_TIER) tier (not in this set-up): its \
	  $$($(BIN)/python -m pytest --collect-only -q -p no:cacheprovider -m $(LEFT_OUT_TIER) 2>&1 | tail -1 \
	  | sed -E 's|/.*||; s/ tests? collected.*//') tests (marker $(LEFT_OUT_TIER)) did not run";) \
	if [ $$main -eq 5 ] && [ $$side -eq 5 ]; then exit 5; fi; \
	for rc in $$main $$side; do if [ $$rc -ne 0 ] && [ $$rc -ne 5 ]; then exit $$rc; fi; done

lint: check
	$(BIN)/snakemake --lint

# The fuzz tier (tests/fuzz, docs/testing.md#the-fuzz-tier) in rounds of FUZZ_SCALE times make test's examples,
# each round with a seed of its own, until FUZZ_MINUTES have passed, on one core.  The pixel kernel is built a
# second time with AddressSanitizer into $(FUZZ_OUT)/asan and loaded in place of the installed one (libasan
# preloaded); logs, failing examples and the examples tried per target land in $(FUZZ_OUT).
FUZZ_MINUTES ?= 30
FUZZ_SCALE ?= 10
FUZZ_OUT ?= $(VENV)/fuzz
CC ?= gcc
fuzz: export PATH := $(abspath $(BIN)):$(PATH)
fuzz: setup
	@mkdir -p $(FUZZ_OUT)/asan
	$(CC) -shared -fPIC -O1 -g -fno-omit-frame-pointer -fsanitize=address \
	  -I"$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["include"])')" \
	  src/firescale/_pixels.c -o $(FUZZ_OUT)/asan/_pixels.so
	$(BIN)/python tests/fuzz/campaign.py --minutes $(FUZZ_MINUTES) --scale $(FUZZ_SCALE) --out $(FUZZ_OUT) \
	  --asan-kernel $(FUZZ_OUT)/asan/_pixels.so

# Without TensorFlow the default experiment trains with PyTorch (the experiments file's `framework` key).
sweep: setup
	$(BIN)/snakemake --profile local speedup_sweep $(if $(WITH_TF),,--config framework=pytorch)

clean:
	rm -rf $(VENV) .pytest_cache .snakemake
