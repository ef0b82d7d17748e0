# robot_wm: two commands do all the set-up.
#   make demo   - create/update .venv, build the interfaces, run the main job on the embedded arm
#   make test   - create/update .venv, build the interfaces (+ the ROS 2 CLI/launch tools when their
#                 source archives are here: make ros-tools), run the whole test suite
# Both are idempotent: each step re-runs only when its inputs changed.

VENV ?= .venv
PYTHON_SYS ?= $(shell command -v python3.11 || command -v python3)
PY := $(VENV)/bin/python
DEPS_STAMP := $(VENV)/.robot_wm-deps
INSTALL_STAMP := $(VENV)/.robot_wm-install
SYS_STAMP := $(VENV)/.robot_wm-sysdeps
PYTEST_ARGS ?=
# upstream source archives of the ROS 2 CLI and launch system (tools/install_ros_tools.sh)
ROS2_TOOLS_SRC ?= $(wildcard ../shared/vendor/ros2)

.PHONY: all setup interfaces ros-tools ros-tools-if-available demo test test-adversarial bench doctor colcon-check clean

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

# ros2 launch, the ros2 CLI and launch_testing in the venv (not on the package index: from source archives)
ros-tools: setup
	@test -n "$(ROS2_TOOLS_SRC)" || { echo "make ros-tools: no source archives: ../shared/vendor/ros2 does not exist; set ROS2_TOOLS_SRC=DIR (launch, launch_ros, ros2cli, composition_interfaces, rosidl_runtime_py .tar.gz)"; exit 1; }
	bash tools/install_ros_tools.sh "$(ROS2_TOOLS_SRC)" $(VENV)

# make test: install them when the archives are here; without them the launch_testing tier is skipped
ros-tools-if-available: setup
	@if [ -z "$(ROS2_TOOLS_SRC)" ]; then \
	  echo "make test: ROS 2 CLI/launch tools not installable (no ../shared/vendor/ros2, ROS2_TOOLS_SRC unset): the launch_testing tier will be skipped"; \
	else bash tools/install_ros_tools.sh "$(ROS2_TOOLS_SRC)" $(VENV) || \
	  echo "make test: installing the ROS 2 tools from $(ROS2_TOOLS_SRC) failed (above): the launch_testing tier will be skipped"; fi

test: setup ros-tools-if-available
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
