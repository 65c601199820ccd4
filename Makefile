# stormwatch — set-up and entry points.
#
#   make demo   set up everything (apt + venv) and run the main job
#   make game-day  run the default chaos suite on a fresh lab and write a scorecard
#   make soak      a fault-free job on a fresh lab for SOAK_MINUTES (30) counting every alert
#   make test   set up everything and run the whole suite (fast tier + e2e)
#
# Set-up is idempotent: system packages are installed only when missing, the
# virtual environment is rebuilt only when pyproject.toml/setup.py change.

SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The CPU build of torch is enough for the lab; GPU users install a CUDA build
# (pyproject.toml only asks for torch>=2.6).
TORCH_SPEC ?= torch==2.13.0
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
PYTEST_ARGS ?=
# Extra arguments of `stormwatch demo`, e.g. make demo DEMO_ARGS=--keep-lab (keeps the lab up
# so a Grafana can be pointed at its Prometheus; `stormwatch lab down --run-dir run/demo` after).
DEMO_ARGS ?=

.PHONY: all setup system system-test venv demo game-day soak test test-fast test-e2e check lint format bench gpu-check deploy-manifests clean distclean

all: test

setup: system venv

# Debian/Ubuntu packages the lab needs: Prometheus, Alertmanager, promtool, amtool, ip, iptables,
# and Slurm 22.05 with munge (slurmctld, slurmd, the client commands; the lab starts its own
# daemons, so the packages' system services are stopped and disabled like Prometheus's).
system:
	@missing=""; \
	command -v prometheus >/dev/null || missing="$$missing prometheus"; \
	command -v promtool >/dev/null || missing="$$missing prometheus"; \
	command -v prometheus-alertmanager >/dev/null || missing="$$missing prometheus-alertmanager"; \
	command -v slurmctld >/dev/null || missing="$$missing slurmctld"; \
	command -v slurmd >/dev/null || missing="$$missing slurmd"; \
	command -v sbatch >/dev/null || missing="$$missing slurm-client"; \
	command -v munged >/dev/null || missing="$$missing munge"; \
	command -v ip >/dev/null || missing="$$missing iproute2"; \
	command -v iptables >/dev/null || missing="$$missing iptables"; \
	command -v pgrep >/dev/null || missing="$$missing procps"; \
	$(PYTHON) -c 'import ensurepip, venv' 2>/dev/null || missing="$$missing python3-venv"; \
	if [ -n "$$missing" ]; then \
	  echo ">> installing system packages:$$missing"; \
	  $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends $$missing; \
	  for s in prometheus prometheus-alertmanager prometheus-node-exporter slurmctld slurmd munge; do \
	    $(SUDO) systemctl disable --now $$s >/dev/null 2>&1 || $(SUDO) service $$s stop >/dev/null 2>&1 || true; \
	  done; \
	else echo ">> system packages present"; fi

# What only the tests need: kubectl (`kubectl kustomize` renders the deploy/ overlays; Debian's
# kubernetes-client when no kubectl is installed) and chromium (the post-mortem HTML test opens
# it through playwright; no `playwright install`).
system-test:
	@missing=""; \
	command -v kubectl >/dev/null || missing="$$missing kubernetes-client"; \
	command -v chromium >/dev/null || missing="$$missing chromium"; \
	if [ -n "$$missing" ]; then \
	  echo ">> installing test packages:$$missing"; \
	  $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends $$missing; \
	else echo ">> test packages present"; fi

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml setup.py
	@echo ">> creating virtual environment $(VENV)"
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e '.[dev]'
	@touch $@

demo: setup
	$(SUDO) $(VENV)/bin/stormwatch demo $(DEMO_ARGS)

# A game day: lab up in run/game-day, the default suite (experiments/suite), a scorecard in
# run/game-day/suites/<id>/scorecard.md, lab down (docs/chaos-suite.md).
game-day: setup
	$(SUDO) $(VENV)/bin/stormwatch lab up --run-dir run/game-day
	$(SUDO) $(VENV)/bin/stormwatch chaos suite experiments/suite --run-dir run/game-day; rc=$$?; \
	$(SUDO) $(VENV)/bin/stormwatch lab down --run-dir run/game-day; exit $$rc

check: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy stormwatch faults postmortem telemetry agent trainer chaos alerts dashboards lab plan

lint: check

format: venv
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

# A soak: lab up in run/soak, a fault-free job for SOAK_MINUTES with checkpoints, eval
# pauses, a planned restart and an elastic resize; every alert that fires is counted (target
# 0) in run/soak/soaks/<job>/soak.md; lab down (docs/detection.md). Not part of `make test`.
SOAK_MINUTES ?= 30
soak: setup
	$(SUDO) $(VENV)/bin/stormwatch lab up --run-dir run/soak
	$(SUDO) $(VENV)/bin/stormwatch chaos soak --run-dir run/soak --minutes $(SOAK_MINUTES); rc=$$?; \
	$(SUDO) $(VENV)/bin/stormwatch lab down --run-dir run/soak; exit $$rc

test-fast: venv
	$(VENV)/bin/pytest -m "not e2e" $(PYTEST_ARGS)

test-e2e: setup system-test
	$(SUDO) $(VENV)/bin/pytest -m e2e $(PYTEST_ARGS)

# Two tiers at once. In the foreground, in order: the timed end-to-end tests (labs, Slurm
# daemons, detection within deadlines), which two at once would starve on 2 cores. In the
# background, niced so that the timed tier keeps the CPU it waits on: the fast tests and the
# `untimed` end-to-end ones (torchrun jobs checked for results only). The background report
# is printed after the foreground's; the exit status is the first failing tier's.
test: setup system-test check
	@$(SUDO) nice -n 5 $(VENV)/bin/pytest -m "not e2e or untimed" -p no:cacheprovider $(PYTEST_ARGS) > .pytest-fast.log 2>&1 & fast=$$!; \
	$(SUDO) $(VENV)/bin/pytest -m "e2e and not untimed" $(PYTEST_ARGS); e2e=$$?; \
	wait $$fast; fast_rc=$$?; \
	echo ">> the background tier (fast and untimed end-to-end tests, exit $$fast_rc):"; cat .pytest-fast.log; \
	if [ $$e2e -ne 0 ]; then exit $$e2e; fi; exit $$fast_rc

# Speed and memory targets live here, not in timed tests (README.md "Benchmarks").
#   agent_bench.py    the agent vs node-exporter (~2 min)
#   trainer_bench.py  instrumentation overhead, disarmed fault points, async vs sync
#                     checkpoint blocking, exposed communication (~6 min on 2 cores)
#   lightning_bench.py  the telemetry API's overhead on a PyTorch Lightning DDP job:
#                     StormwatchCallback vs none, with an A/A row (~5 min on 2 cores)
#   scrape_bench.py   the agent's render after 1,000 rank restarts vs a fresh node
#                     (target <= 1.5x), with the unfolded folder and an A/A row (~4 min)
bench: setup
	$(PY) benchmarks/agent_bench.py
	$(PY) benchmarks/trainer_bench.py
	$(PY) benchmarks/lightning_bench.py
	$(PY) benchmarks/scrape_bench.py

# Regenerate deploy/kubernetes/{base,examples} from the code (rules, dashboards, ports).
deploy-manifests: venv
	$(PY) deploy/render.py

# On a machine with an NVIDIA GPU (each skips with exit 0 and the reason without one):
#   gpu_check.py          the agent against real NVML, every catalogue GPU metric
#   gpu_check_trainer.py  the trainer with NCCL at world size 1, seen by the agent; step time, MFU
gpu-check: venv
	$(PY) scripts/gpu_check.py
	$(PY) scripts/gpu_check_trainer.py

clean:
	-$(SUDO) $(VENV)/bin/stormwatch lab down --run-dir run/demo 2>/dev/null
	rm -rf build dist *.egg-info .pytest_cache .ruff_cache .mypy_cache

distclean: clean
	rm -rf $(VENV) run
