# One-command set-up: every target works alone on a fresh machine.
VENV   ?= .venv
PY     := $(VENV)/bin/python
MPIEXEC := $(VENV)/bin/mpiexec
# The CPU build of torch (a range that this satisfies installs nothing more).
TORCH  ?= torch==2.13.0

.PHONY: install lint check test bench demo gpu-check clean

install: $(VENV)/.installed

$(VENV)/.installed: setup.cfg pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q mpi4py mpich
	$(PY) -m pip install -q -e ".[test,yaml]"
	touch $@

# ruff (installed by make install through the test extra): rules and exceptions in pyproject.toml
lint: install
	$(VENV)/bin/ruff check .

# The quick inner loop: lint and every test that starts no MPI job, Slurm or virtual cluster (the
# tiers inprocess and processes, which tests/conftest.py gives each test from its code: tests/tiers.py).
check: lint
	$(PY) -m pytest -q -m "inprocess or processes" tests

# Everything, every tier (CI's .ci/run runs this).
test: lint
	$(PY) -m pytest -q tests

# bench_svm measures on the real Fashion-MNIST from Debian's dataset-fashion-mnist package.
FASHION := /usr/share/datasets/fashion-mnist

bench: install
	@test -d $(FASHION) || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
		apt-get update -qq && apt-get install -y -qq --no-install-recommends dataset-fashion-mnist >/dev/null; } || \
		echo "note: bench_svm needs Fashion-MNIST: apt-get install dataset-fashion-mnist"
	$(PY) -m benchmarks

# Everything that needs a GPU, into bench-results/gpu-check/gpu-check.md and .json. Installs
# nothing: it runs on the checkout with a Python that has CUDA torch (this venv's where there is
# one, else python3; or GPU_PYTHON=...). Without a GPU it says so in one line and exits 0.
GPU_PYTHON ?= $(if $(wildcard $(PY)),$(PY),python3)
gpu-check:
	PYTHONPATH=. $(GPU_PYTHON) -m benchmarks.gpu_check

# Both case studies on scikit-learn's shipped digits, 2 MPI ranks, in about a minute on 2 cores.
# The mnist_nn demo draws only small nets (--max-macs: not the reference's search, whose nets of
# hundreds of millions of weights take hours on a CPU); the statistics are a full run's.
# Each demo starts afresh: results/demo/ holds only the last demo's outputs.
demo: install
	rm -rf results/demo
	$(MPIEXEC) -n 2 $(PY) -m mnist_svm 4 --dataset digits --gpu cpu --results results/demo/mnist_svm
	$(MPIEXEC) -n 2 $(PY) -m mnist_nn 2 2 --dataset digits --gpu cpu --max-macs 1e6 \
		--results results/demo/mnist_nn
	@echo "plots and summaries: results/demo/mnist_svm/summary.md, results/demo/mnist_nn/summary.md"

clean:
	rm -rf $(VENV) build *.egg-info
