# Two commands on a fresh machine:
#   make lab    set up .venv with the tested versions and open the lessons in JupyterLab
#   make test   set up .venv (or reuse it) and run every test
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
# Stamp file: the environment is rebuilt when the pins or the package metadata change.
STAMP := $(VENV)/.installed

.PHONY: lab test test-unit test-notebooks test-browser bench notebooks data clean-venv

$(STAMP): constraints.txt pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "$(PYTHON) not found: install Python 3.11 or run 'make PYTHON=python3 ...'"; exit 1; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# torch first and alone: pinned to the CPU build, so nothing later can pull a CUDA one.
	$(BIN)/python -m pip install --quiet -c constraints.txt torch
	$(BIN)/python -m pip install --quiet -c constraints.txt -e ".[test]"
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (course)" >/dev/null
	touch $(STAMP)

venv: $(STAMP)

lab: $(STAMP)
	$(BIN)/jupyter lab --notebook-dir=notebooks notebooks/README.md

test: $(STAMP)
	$(BIN)/python scripts/run_tests.py

test-unit: $(STAMP)
	$(BIN)/python -m pytest tests -q

test-notebooks: $(STAMP)
	$(BIN)/python -m pytest -q --nbval-lax notebooks

test-browser: $(STAMP)
	$(BIN)/python -m pytest -q tests/browser

bench: $(STAMP)
	$(BIN)/python benchmarks/run_all.py

notebooks: $(STAMP)
	$(BIN)/python scripts/build_notebooks.py

data: $(STAMP)
	$(BIN)/python data/build_assets.py

clean-venv:
	rm -rf $(VENV)
