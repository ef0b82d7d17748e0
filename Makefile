# robot_wm: two commands do all the set-up.
#   make demo   - create/update .venv, build the interfaces, run the main job on the embedded arm
#   make test   - create/update .venv, build the interfaces, run the whole test suite
# Both are idempotent: each step re-runs only when its inputs changed.

VENV ?= .venv
PYTHON_SYS ?= $(shell command -v python3.11 || command -v python3)
PY := $(VENV)/bin/python
DEPS_STAMP := $(VENV)/.robot_wm-deps
INSTALL_STAMP := $(VENV)/.robot_wm-install
SYS_STAMP := $(VENV)/.robot_wm-sysdeps
PYTEST_ARGS ?=

.PHONY: all setup interfaces demo test test-adversarial bench doctor colcon-check clean

all: setup

$(PY):
	@$(PYTHON_SYS) -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' || \
	  { echo "robot_wm needs Python 3.11 (the ROS 2 Kilted wheels are cp311); found $$($(PYTHON_SYS) --version)"; exit 1; }
	$(PYTHON_SYS) -m venv $(VENV)

$(SYS_STAMP): tools/ensure_system_deps.sh | $(PY)
	bash tools/ensure_system_deps.sh
	@touch $@

$(DEPS_STAMP): requirements.txt requirements-test.txt | $(PY)
	$(PY) -m pip install -q --upgrade "pip>=24" wheel "setuptools<80"
	$(PY) -m pip install -q -r requirements.txt -r requirements-test.txt
	@touch $@

interfaces: $(DEPS_STAMP) $(SYS_STAMP)
	bash tools/build_interfaces.sh $(VENV)

$(INSTALL_STAMP): setup.py setup.cfg $(DEPS_STAMP)
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	@touch $@

setup: interfaces $(INSTALL_STAMP)

demo: setup
	$(VENV)/bin/robot-wm demo

test: setup
	$(PY) -m pytest $(PYTEST_ARGS)

test-adversarial: setup
	$(PY) -m pytest -m adversarial -s test/test_adversarial_e2e.py

doctor: setup
	$(VENV)/bin/robot-wm doctor

bench: setup
	@for b in bench/bench_*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

colcon-check: setup
	bash .ci/colcon_check.sh

clean:
	rm -rf build install log out
