# Two commands on a fresh machine:
#   make lab    set up .venv with the tested versions and open the lessons in JupyterLab
#   make test   set up .venv (or reuse it) and run every test
# Another Python than 3.11: make PYTHON=python3.12 lab (any of 3.11-3.13; tools/check_python.py).
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
# Stamp file: the environment is rebuilt when the pins or the package metadata change.
STAMP := $(VENV)/.installed
# Not byte-compiled ahead (Python compiles a module on its first import, if ever): the
# libraries' own test suites and the transformers models the course never builds, 36%
# of the installed Python (90 of 250 MB); it cut compileall's CPU time by 41% here.
COMPILE_SKIP := /tests?/|/torch/testing/|/transformers/models/(?!(auto|bert|distilbert|gpt2|llama|mistral)/)

.PHONY: venv lab test test-unit test-notebooks test-browser check-data bench notebooks data clean-venv

# The recipe prints short progress lines of its own, not its commands (@): a newcomer sees
# what is happening and what went wrong, not 7 comment lines and the compileall command.
#
# A $(PYTHON) that is on the PATH but does not run is, most often, a pyenv shim for a version
# pyenv has not selected: the shim exits 127 with pyenv's own "command not found".
# A .venv without pip is what `python -m venv` leaves when Debian/Ubuntu's
# python3.X-venv package is missing; reusing it would fail forever with "No module named pip".
# pip runs through tools/pip_install.py: offline, it says so in one line (pip would retry for
# minutes, then report "conflicting dependencies").
# torch is installed first and alone: the CPU build unless there is an NVIDIA GPU (see the script).
# pip byte-compiles what it installs one file at a time (about 60 CPU-s for these
# packages); compileall does the same on every core, less COMPILE_SKIP. Exit status
# ignored as pip ignores it: some packages ship files that are not meant to compile.
# Last, the course kernel: offline, one OpenMP thread, known-harmless library lines hidden
# (tools/open_lab.py).
$(STAMP): constraints.txt pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "$(PYTHON) not found: install Python 3.11 or run 'make PYTHON=python3 ...'"; exit 1; }
	@$(PYTHON) -c '' 2>/dev/null || { \
	  status=$$?; found=$$(command -v $(PYTHON)); v=$$(basename $(PYTHON) | sed -n 's/^python\(3\.[0-9][0-9]*\)$$/\1/p'); \
	  if grep -qs pyenv "$$found"; then \
	    echo "make stopped: $(PYTHON) is a pyenv shim ($$found) for a Python pyenv has not selected here (it exits $$status)."; \
	    echo "Install and select it: pyenv install $${v:-3.11}, then pyenv global $${v:-3.11} (or pyenv local $${v:-3.11} in this folder); or name a Python that runs: make PYTHON=/path/to/python$${v:-3.11} ..."; \
	  else \
	    echo "make stopped: $(PYTHON) ($$found) is on the PATH but does not run (it exits $$status): name a Python that runs, e.g. make PYTHON=/path/to/python3.11 ..."; \
	  fi; exit 1; }
	@$(PYTHON) -m tools.check_python
	@test -x $(BIN)/python || { echo "creating $(VENV) with $(PYTHON)"; $(PYTHON) -m venv $(VENV); }
	@$(BIN)/python -m pip --version >/dev/null 2>&1 || { \
	  v=$$($(BIN)/python -c 'import sys; print("%d.%d" % sys.version_info[:2])'); \
	  echo "$(VENV) has no pip: it was made by a Python without venv support."; \
	  echo "Install it (on Debian/Ubuntu: sudo apt install python$$v-venv), then run 'make clean-venv' and try again."; \
	  exit 1; }
	@echo "installing pip, then torch, then the course and its tested versions (constraints.txt)"
	@$(BIN)/python -m tools.pip_install install --quiet --upgrade pip
	@$(BIN)/python -m tools.install_torch
	@$(BIN)/python -m tools.pip_install install --quiet --no-compile -c constraints.txt -e ".[test]"
	@echo "byte-compiling the installed packages"
	@$(BIN)/python -m compileall -qq -j 0 -x '$(COMPILE_SKIP)' "$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" || true
	@$(BIN)/python -m tools.open_lab --install-kernel
	@touch $(STAMP)
	@echo "$(VENV) is ready"

venv: $(STAMP)

# The learner's own copies in my-notebooks/ (made on first use; notebooks/ stays as
# git has it), the course kernel offline, JupyterLab without its internet features,
# --allow-root as root: all in tools/open_lab.py, which the conda route runs too.
# make lab ONLINE=1 lets the kernels use the Hugging Face hub.
lab: $(STAMP)
	$(BIN)/python -m tools.open_lab $(if $(ONLINE),--online)

# Every test: the re-run test of every lesson, the browser test, and the unit tests,
# laid out in tests/ like the code (README: "The tests") and selected by folder and
# pytest marker (pyproject.toml), never by a list of files.
# The ~150 s rebuild of the offline assets is not part of it (make check-data, which
# .ci/run also runs): it tests data/build_assets.py, which only changes when the assets
# do, and would be a quarter of every make test.
# The course never downloads anything, so the hub libraries are told they are offline.
# OMP_WAIT_POLICY=PASSIVE: idle OpenMP threads sleep instead of spinning, which otherwise
# starves the other processes (Jupyter kernels, the 2-process lesson) on a 2-core machine.
# The tests that fork worker processes (marker `forks`) run in a pytest process of their
# own: a child forked from a process that has run many other tests (thread pools of
# datasets, tokenizers, torch) was seen to hang in its first tensor operation. It collects
# (imports) every test module and runs only those marked: about 3 CPU-s more than naming
# its files did, the price of no list to keep.
FORKING := -m forks
TEST_ENV := OMP_WAIT_POLICY=PASSIVE HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1

# The rest runs on two pytest workers (pytest-xdist), one per core: each test
# module and each lesson of the re-run test stays whole on one worker (--dist
# loadscope), handed out in the order collected (no reordering), which
# tests/conftest.py sorts longest first so that the two workers finish together:
# the re-run test's lessons (marker `rerun`, a few minutes each), then the browser
# test (tests/browser/, its `slow` module first), then the `slow` unit test modules
# (tens of CPU-s each), then the rest, each group by folder and file name.
PARALLEL := -n 2 --dist loadscope --no-loadscope-reorder
POOL := -m "not forks"
# The notebooks, in make test: the re-run test drives each lesson in the course
# kernel (the learner copy checked against the committed outputs as nbval checks
# them, each quick cell twice in a row; the exercises in their solved form,
# checked against the solved copy; then the whole lesson again, in order), about
# 2 runs of each lesson (it was 3: the budget is 20 minutes for all the lessons); the
# browser test opens each learner copy in JupyterLab and runs live only what needs
# a browser (sliders, one exercise check). nbval (make test-notebooks) would run
# every lesson twice more and check nothing the re-run test does not.
# make test-unit: every test but those two (the forking ones as in make test).
UNIT := -m "not forks and not rerun" --ignore=tests/browser
# make test runs the forking tests beside the pool rather than before it: alone
# they used 131 CPU-s in about 105 s on 2 cores, leaving a core idle for about 40 s
# (waiting for the workers they start), which the pool fills. They find their
# workers by process id and their ports free, so the pool does not disturb them.
# Their output is shown when both are done.
FORKING_LOG := test-artifacts/forking-tests.log

# The course kernel is (re)installed first (a no-op when it is as wanted): the
# lessons run in it, offline, also in a .venv made before the kernel had its env.
# BROWSER_SCREENSHOTS=0: the browser test saves screenshots of failures only (make
# test-browser saves every lesson's); the others cost about 30 CPU-s and check nothing.
# The pool's output is shown as it comes and kept in test-artifacts/pool-tests.log:
# tools/test_summary.py reads both logs and ends make test with each run's pytest summary
# line, the failing tests of both runs and one total (its exit status: 1 if either failed).
test: $(STAMP)
	-@bash tools/ensure_chromium.sh
	@$(BIN)/python -m tools.open_lab --install-kernel
	@mkdir -p $(dir $(FORKING_LOG))
	@echo "tests that fork workers: running beside the others, output in $(FORKING_LOG) (shown at the end)"
	@$(TEST_ENV) $(BIN)/python -m pytest $(FORKING) > $(FORKING_LOG) 2>&1 & forking=$$!; \
	  trap 'kill $$forking 2>/dev/null; exit 130' INT TERM; \
	  rm -f test-artifacts/pool-tests.status; \
	  { $(TEST_ENV) BROWSER_SCREENSHOTS=0 $(BIN)/python -m pytest $(PARALLEL) $(POOL) 2>&1; \
	    echo $$? > test-artifacts/pool-tests.status; } | tee test-artifacts/pool-tests.log; \
	  wait $$forking; forked=$$?; \
	  echo "---- tests that fork workers ($(FORKING_LOG)):"; cat $(FORKING_LOG); \
	  $(BIN)/python -m tools.test_summary "the pool" test-artifacts/pool-tests.log \
	    "$$(cat test-artifacts/pool-tests.status 2>/dev/null || echo 1)" \
	    "the forking run" $(FORKING_LOG) $$forked

test-unit: $(STAMP)
	$(TEST_ENV) $(BIN)/python -m pytest $(FORKING)
	$(TEST_ENV) $(BIN)/python -m pytest $(PARALLEL) $(UNIT)

# nbval on the learner and solved copies (each lesson twice more), and the lessons'
# tests (tests/lessons/: the re-run test, the committed outputs and sources, the kernel).
test-notebooks: $(STAMP)
	@$(BIN)/python -m tools.open_lab --install-kernel
	$(TEST_ENV) $(BIN)/python -m pytest $(PARALLEL) tests/lessons --nbval-lax notebooks

test-browser: $(STAMP)
	@$(BIN)/python -m tools.open_lab --install-kernel
	@bash tools/ensure_chromium.sh
	$(TEST_ENV) $(BIN)/python -m pytest tests/browser

# Rebuilds data/ in a temporary folder and compares: data and tokenizer byte for byte,
# weights and the pre-training's MLM losses within measured tolerances (data/README.md).
check-data: $(STAMP)
	$(TEST_ENV) OMP_NUM_THREADS=1 $(BIN)/python -m data.build_assets --check

bench: $(STAMP)
	@$(BIN)/python -m tools.open_lab --install-kernel
	$(TEST_ENV) $(BIN)/python -m benchmarks.run_all

# make notebooks ONLY=02 rebuilds one lesson.
notebooks: $(STAMP)
	$(BIN)/python -m tools.build_notebooks $(if $(ONLY),--only $(ONLY))

data: $(STAMP)
	$(BIN)/python -m data.build_assets

clean-venv:
	rm -rf $(VENV)
