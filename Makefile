# Two commands on a fresh machine:
#   make lab    set up .venv with the tested versions and open the lessons in JupyterLab
#   make test   set up .venv (or reuse it) and run every test
# Another Python than 3.11: make PYTHON=python3.12 lab (any of 3.10-3.13).
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
# Stamp file: the environment is rebuilt when the pins or the package metadata change.
STAMP := $(VENV)/.installed

.PHONY: venv lab test test-unit test-notebooks test-browser check-data bench notebooks data clean-venv

# A .venv without pip is what `python -m venv` leaves when Debian/Ubuntu's
# python3.X-venv package is missing; reusing it would fail forever with "No module named pip".
$(STAMP): constraints.txt pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "$(PYTHON) not found: install Python 3.11 or run 'make PYTHON=python3 ...'"; exit 1; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@$(BIN)/python -m pip --version >/dev/null 2>&1 || { \
	  v=$$($(BIN)/python -c 'import sys; print("%d.%d" % sys.version_info[:2])'); \
	  echo "$(VENV) has no pip: it was made by a Python without venv support."; \
	  echo "Install it (on Debian/Ubuntu: sudo apt install python$$v-venv), then run 'make clean-venv' and try again."; \
	  exit 1; }
	$(BIN)/python -m pip install --quiet --upgrade pip
	# torch first and alone: the CPU build unless there is an NVIDIA GPU (see the script).
	$(BIN)/python scripts/install_torch.py
	$(BIN)/python -m pip install --quiet -c constraints.txt -e ".[test]"
	# The course kernel, offline and with the tests' OpenMP wait policy (scripts/open_lab.py).
	$(BIN)/python scripts/open_lab.py --install-kernel
	touch $(STAMP)

venv: $(STAMP)

# The learner's own copies in my-notebooks/ (made on first use; notebooks/ stays as
# git has it), the course kernel offline, JupyterLab without its internet features,
# --allow-root as root: all in scripts/open_lab.py, which the conda route runs too.
# make lab ONLINE=1 lets the kernels use the Hugging Face hub.
lab: $(STAMP)
	$(BIN)/python scripts/open_lab.py $(if $(ONLINE),--online)

# Every test: unit tests, the browser test, and the re-run test of every lesson.
# The ~150 s rebuild of the offline assets is not part of it (make check-data, which
# .ci/run also runs): it tests data/build_assets.py, which only changes when the assets
# do, and would be a quarter of every make test.
# The course never downloads anything, so the hub libraries are told they are offline.
# OMP_WAIT_POLICY=PASSIVE: idle OpenMP threads sleep instead of spinning, which otherwise
# starves the other processes (Jupyter kernels, the 2-process lesson) on a 2-core machine.
# The tests that fork worker processes run in a pytest process of their own: a child
# forked from a process that has run many other tests (thread pools of datasets,
# tokenizers, torch) was seen to hang in its first tensor operation.
FORKING_TESTS := tests/test_parallel.py tests/test_launcher.py tests/test_train_cli.py tests/test_exercises_lesson6.py
TEST_ENV := OMP_WAIT_POLICY=PASSIVE HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1

# The rest runs on two pytest workers (pytest-xdist), one per core: each test
# module, each notebook and each lesson of the re-run test stays whole on one
# worker (--dist loadscope), and the longest (the re-run test, then the
# notebooks) are handed out first (listed first, no reordering).
PARALLEL := -n 2 --dist loadscope --no-loadscope-reorder
# The notebooks, in make test: the re-run test drives each solved copy (each cell
# twice, then each section again; its first pass checks what nbval checks: no
# error, checked outputs as committed), and the browser test runs each learner
# copy in JupyterLab. nbval itself (make test-notebooks) would run every lesson
# twice more, checking little they do not (the learner copy's own checked cells
# against the committed outputs): a lesson costs about 3 runs in the re-run test,
# and make test has 10 minutes on 2 cores.
NOTEBOOK_TESTS := tests/test_rerun_lessons.py

# The course kernel is (re)installed first (a no-op when it is as wanted): the
# lessons run in it, offline, also in a .venv made before the kernel had its env.
test: $(STAMP)
	-@bash scripts/ensure_chromium.sh
	@$(BIN)/python scripts/open_lab.py --install-kernel
	$(TEST_ENV) $(BIN)/python -m pytest $(FORKING_TESTS)
	$(TEST_ENV) $(BIN)/python -m pytest $(PARALLEL) $(NOTEBOOK_TESTS) tests $(addprefix --ignore=,$(FORKING_TESTS))

test-unit: $(STAMP)
	$(TEST_ENV) $(BIN)/python -m pytest $(FORKING_TESTS)
	$(TEST_ENV) $(BIN)/python -m pytest $(PARALLEL) tests --ignore=tests/browser --ignore=$(NOTEBOOK_TESTS) $(addprefix --ignore=,$(FORKING_TESTS))

# nbval on the learner and solved copies, and the re-run test.
test-notebooks: $(STAMP)
	@$(BIN)/python scripts/open_lab.py --install-kernel
	$(TEST_ENV) $(BIN)/python -m pytest $(PARALLEL) $(NOTEBOOK_TESTS) --nbval-lax notebooks

test-browser: $(STAMP)
	@$(BIN)/python scripts/open_lab.py --install-kernel
	@bash scripts/ensure_chromium.sh
	$(TEST_ENV) $(BIN)/python -m pytest tests/browser

# Rebuilds data/ in a temporary folder and compares: data and tokenizer byte for byte,
# weights and the pre-training's MLM losses within measured tolerances (data/README.md).
check-data: $(STAMP)
	$(TEST_ENV) OMP_NUM_THREADS=1 $(BIN)/python data/build_assets.py --check

bench: $(STAMP)
	@$(BIN)/python scripts/open_lab.py --install-kernel
	$(TEST_ENV) $(BIN)/python benchmarks/run_all.py

# make notebooks ONLY=02 rebuilds one lesson.
notebooks: $(STAMP)
	$(BIN)/python scripts/build_notebooks.py $(if $(ONLY),--only $(ONLY))

data: $(STAMP)
	$(BIN)/python data/build_assets.py

clean-venv:
	rm -rf $(VENV)
