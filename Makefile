# `make demo` runs the whole pipeline (tokenizer, pretraining, fine-tuning) with no download;
# `make test` runs the test suite. Both create .venv on first use.
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: demo test setup clean

$(VENV)/.installed: pyproject.toml scripts/setup.sh
	bash scripts/setup.sh

setup: $(VENV)/.installed

demo: $(VENV)/.installed
	$(VENV)/bin/bert-kit demo --output runs/demo

test: $(VENV)/.installed
	$(PY) -m pytest -q

clean:
	rm -rf runs .pytest_cache
