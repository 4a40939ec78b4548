# `make demo` runs the whole pipeline (tokenizer, pretraining, fine-tuning) with no download;
# `make test` runs the test suite (`make test-all` with its slow tests). All create .venv on first use.
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: demo test test-all setup clean

$(VENV)/.installed: pyproject.toml scripts/setup.sh
	bash scripts/setup.sh

setup: $(VENV)/.installed

demo: $(VENV)/.installed
	$(VENV)/bin/bert-kit demo --output runs/demo

# The suite in two worker processes (pytest-xdist; tests/conftest.py says how they share the
# cores). `make test` leaves out the end-to-end tests marked slow (several processes, servers,
# whole runs); `make test-all` runs them too, as CI does. WORKERS=0: one process.
WORKERS ?= 2
PYTEST := $(PY) -m pytest -q -n $(WORKERS) --dist loadgroup --no-loadscope-reorder
# the tests start many Python processes: let them reuse bytecode compiled once
unexport PYTHONDONTWRITEBYTECODE

test: $(VENV)/.installed
	$(PYTEST) -m "not slow"

# (with the 25 slowest tests listed: CI's time is bounded)
test-all: $(VENV)/.installed
	$(PYTEST) --durations=25

clean:
	rm -rf runs .pytest_cache
