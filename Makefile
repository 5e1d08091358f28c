# Two commands on a fresh machine:
#   make lab    set up .venv with the tested versions and open the lessons in JupyterLab
#   make test   set up .venv (or reuse it) and run every test
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
# Stamp file: the environment is rebuilt when the pins or the package metadata change.
STAMP := $(VENV)/.installed

.PHONY: venv lab test test-unit test-notebooks test-browser bench notebooks data clean-venv

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

# The settings in jupyterlab-settings/ open Markdown rendered, so the landing page's links work.
lab: $(STAMP)
	$(BIN)/jupyter lab --notebook-dir=notebooks --LabApp.app_settings_dir=jupyterlab-settings notebooks/README.md

# Every test: unit tests, the browser test, and nbval on the learner and solution notebooks.
# The course never downloads anything, so the hub libraries are told they are offline.
# OMP_WAIT_POLICY=PASSIVE: idle OpenMP threads sleep instead of spinning, which otherwise
# starves the other processes (Jupyter kernels, the 2-process lesson) on a 2-core machine.
# The tests that fork worker processes run in a pytest process of their own: a child
# forked from a process that has run many other tests (thread pools of datasets,
# tokenizers, torch) was seen to hang in its first tensor operation.
FORKING_TESTS := tests/test_parallel.py tests/test_train_cli.py tests/test_exercises_lesson6.py
TEST_ENV := OMP_WAIT_POLICY=PASSIVE HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1

# The rest runs on two pytest workers (pytest-xdist), one per core: each test
# module and each notebook stays whole on one worker (--dist loadscope), and the
# notebooks, the longest, are handed out first (listed first, no reordering).
PARALLEL := -n 2 --dist loadscope --no-loadscope-reorder

test: $(STAMP)
	-@bash scripts/ensure_chromium.sh
	$(TEST_ENV) $(BIN)/python -m pytest $(FORKING_TESTS)
	$(TEST_ENV) $(BIN)/python -m pytest $(PARALLEL) --nbval-lax notebooks tests $(addprefix --ignore=,$(FORKING_TESTS))

test-unit: $(STAMP)
	$(TEST_ENV) $(BIN)/python -m pytest $(FORKING_TESTS)
	$(TEST_ENV) $(BIN)/python -m pytest $(PARALLEL) tests --ignore=tests/browser $(addprefix --ignore=,$(FORKING_TESTS))

test-notebooks: $(STAMP)
	$(TEST_ENV) $(BIN)/python -m pytest --nbval-lax notebooks

test-browser: $(STAMP)
	@bash scripts/ensure_chromium.sh
	$(TEST_ENV) $(BIN)/python -m pytest tests/browser

bench: $(STAMP)
	$(TEST_ENV) $(BIN)/python benchmarks/run_all.py

# make notebooks ONLY=02 rebuilds one lesson.
notebooks: $(STAMP)
	$(BIN)/python scripts/build_notebooks.py $(if $(ONLY),--only $(ONLY))

data: $(STAMP)
	$(BIN)/python data/build_assets.py

clean-venv:
	rm -rf $(VENV)
