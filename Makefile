# One-command set-up: every target works alone on a fresh machine.
VENV   ?= .venv
PY     := $(VENV)/bin/python
MPIEXEC := $(VENV)/bin/mpiexec
# The CPU build of torch (a range that this satisfies installs nothing more).
TORCH  ?= torch==2.13.0

.PHONY: install test bench demo clean

install: $(VENV)/.installed

$(VENV)/.installed: setup.cfg pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q mpi4py mpich
	$(PY) -m pip install -q -e ".[test,yaml]"
	touch $@

test: install
	$(PY) -m pytest -q tests

bench: install
	$(PY) -m benchmarks

demo: install
	$(MPIEXEC) -n 2 $(PY) -m mnist_svm 4 --dataset digits --results results/demo/mnist_svm
	$(MPIEXEC) -n 2 $(PY) -m mnist_nn 2 2 --dataset digits --max-epochs 3 --results results/demo/mnist_nn

clean:
	rm -rf $(VENV) build *.egg-info
