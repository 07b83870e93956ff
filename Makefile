# One-command set-up: every target works alone on a fresh machine.
VENV   ?= .venv
PY     := $(VENV)/bin/python
MPIEXEC := $(VENV)/bin/mpiexec
# torch with the torchvision built for it (python -m mnist_nn downloads MNIST through torchvision,
# as the reference does): the CPU builds from PyTorch's CPU index where it is reachable, else PyPI's
# pair (x86_64: CUDA builds, 5.9 GB in the venv instead of 1.5 GB, each import torch about 1.3x the
# CPU time; aarch64: CPU builds). A torchvision beside a torch it was not built for does not import
# ('operator torchvision::nms does not exist'), so the two always come together.
TORCH  ?= torch==2.13.0
TORCHVISION ?= torchvision==0.28.0
CPU_INDEX ?= https://download.pytorch.org/whl/cpu
TORCH_PAIR ?= $(if $(filter aarch64,$(shell uname -m)),torch==2.9.1 torchvision==0.24.1,torch==2.14.1 torchvision==0.29.1)
INSTALL_TORCH = $(PY) -m pip install -q --retries 1 --timeout 30 --index-url $(CPU_INDEX) "$(TORCH)+cpu" "$(TORCHVISION)+cpu" \
	2>/dev/null || { echo "note: $(CPU_INDEX) not reachable: torch and torchvision from PyPI ($(TORCH_PAIR))"; \
	$(PY) -m pip install -q $(TORCH_PAIR); }

.PHONY: install install-torchvision lint quick check test bench bench-peers demo gpu-check clean

# The checkout's Python compiled ahead, into __pycache__, by every target built on install: where
# PYTHONDONTWRITEBYTECODE is set (as here, and in many container images) or the checkout is
# read-only to its users, every rank, worker and test program would otherwise compile the engine's
# modules again as it starts (launch to first result 0.49 -> 0.34 s here). Up to date: 0.05 s.
SOURCES := common mnist_nn mnist_svm benchmarks examples tests

install: $(VENV)/.installed
	@$(PY) -m compileall -q $(SOURCES)

$(VENV)/.installed: setup.cfg pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(INSTALL_TORCH)
	$(PY) -m pip install -q mpi4py mpich
	$(PY) -m pip install -q -e ".[test,yaml]"
	touch $@

# A venv made by an older make install (torch without torchvision): the pair above, into it.
install-torchvision: install
	@$(PY) -c "import torchvision" 2>/dev/null || { $(INSTALL_TORCH); }

# ruff (installed by make install through the test extra): rules and exceptions in pyproject.toml
lint: install
	$(VENV)/bin/ruff check .

# Tests in JOBS pytest-xdist workers (2: this project's 2-core machines; JOBS=1 for one process).
# --dist loadfile keeps each test file in one worker, so that a module-scoped fixture's real run is
# made once (--dist loadgroup's xdist_group marks are ignored by pytest-xdist 3.8 under pytest 9).
JOBS   ?= 2
PARALLEL := $(if $(filter 1,$(JOBS)),-p no:xdist,-n $(JOBS) --dist loadfile)

# The quick inner loop: lint and every test that starts no MPI job, Slurm or virtual cluster (the
# tiers inprocess and processes, which tests/conftest.py gives each test from its code: tests/tiers.py).
check: lint
	$(PY) -m pytest -q $(PARALLEL) -m "inprocess or processes" tests

# The quickest loop (about 30 s here): lint and the tests that start no process at all.
quick: lint
	$(PY) -m pytest -q -m inprocess tests

# Everything, every tier (CI's .ci/run runs this). The Slurm and virtual cluster tiers (one process:
# one cluster at a time) run after the others, alone on the machine. CLUSTERS_BESIDE=1 runs them
# beside the others instead (they mostly wait, for Slurm and for the timeouts that find a lost node;
# their output follows the others'): about 3 minutes sooner here, but the load made a timing test of
# the others fail once in five runs, so it is not the default.
CLUSTERS_BESIDE ?=
test: lint
	@log=$$(mktemp); \
	if [ -n "$(CLUSTERS_BESIDE)" ]; then \
	  $(PY) -m pytest -q -p no:xdist -m "slurm or vcluster" tests > $$log 2>&1 & clusters_pid=$$!; \
	  echo "the slurm and vcluster tiers run meanwhile; their output follows"; fi; \
	$(PY) -m pytest -q $(PARALLEL) -m "not slurm and not vcluster" tests; others=$$?; \
	if [ -n "$(CLUSTERS_BESIDE)" ]; then wait $$clusters_pid; clusters=$$?; cat $$log; \
	else $(PY) -m pytest -q -p no:xdist -m "slurm or vcluster" tests; clusters=$$?; fi; rm -f $$log; \
	if [ $$others != 0 ]; then exit $$others; fi; exit $$clusters

# bench_svm measures on the real Fashion-MNIST from Debian's dataset-fashion-mnist package.
FASHION := /usr/share/datasets/fashion-mnist

bench: install
	@test -d $(FASHION) || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
		apt-get update -qq && apt-get install -y -qq --no-install-recommends dataset-fashion-mnist >/dev/null; } || \
		echo "note: bench_svm needs Fashion-MNIST: apt-get install dataset-fashion-mnist"
	$(PY) -m benchmarks

# Ours beside ProcessPoolExecutor, mpi4py.futures, Dask, Ray, Parsl and joblib (interleaved rounds):
# bench-results/bench_peers.md and .png. The peers are the optional extra `peers`, installed here
# only (a peer that is not installed is skipped in one line).
bench-peers: install
	$(PY) -m pip install -q -e ".[peers]" || echo "note: some peers could not be installed; they are skipped"
	$(PY) -m benchmarks.bench_peers

# Everything that needs a GPU, into bench-results/gpu-check/gpu-check.md and .json. Installs
# nothing: it runs on the checkout with a Python that has CUDA torch (this venv's where there is
# one, else python3; or GPU_PYTHON=...). Without a GPU it says so in one line and exits 0; on a GPU
# node whose torch cannot use the GPU (a CPU build, or a CUDA build the driver does not fit), one
# line and a failure.
GPU_PYTHON ?= $(if $(wildcard $(PY)),$(PY),python3)
gpu-check:
	PYTHONPATH=. $(GPU_PYTHON) -m benchmarks.gpu_check

# Both case studies and a sweep on scikit-learn's shipped digits, 2 MPI ranks, in about 35 s on 2 idle
# cores (2026-11-29: 34 s wall, 61 s of CPU; the items of mnist_svm 3.9 s, mnist_nn 16.1 s, the sweep 5.5 s).
# mnist_nn: 3 bootstraps (odd: the majority vote has no ties) x 5 candidates, so that each model
# is chosen among enough nets and the ensemble beats its models, as the method does (2.2% test
# error against 3.1-4.0% each here); 3 folds and at most 10 epochs keep it short, and it draws only
# small nets (--max-macs: not the reference's search, whose nets of hundreds of millions of weights
# take hours on a CPU). Each demo starts afresh: results/demo/ holds only the last demo's outputs.
demo: install
	rm -rf results/demo
	$(MPIEXEC) -n 2 $(PY) -m mnist_svm 4 --dataset digits --gpu cpu --results results/demo/mnist_svm
	$(MPIEXEC) -n 2 $(PY) -m mnist_nn 3 5 --dataset digits --gpu cpu --folds 3 --max-epochs 10 --max-macs 3e5 \
		--certainty-images 10 --results results/demo/mnist_nn
	$(MPIEXEC) -n 2 $(PY) examples/sweep/svm_digits.py --gpu cpu --results results/demo/sweep
	@echo "plots and summaries: results/demo/mnist_svm/summary.md, results/demo/mnist_nn/summary.md," \
		"results/demo/sweep/summary.md (each with its report.html)"

clean:
	rm -rf $(VENV) build *.egg-info
