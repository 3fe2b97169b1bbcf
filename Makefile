# The two commands a newcomer types: `make demo` and `make test`. Each creates .venv when missing.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DEV_STAMP := $(VENV)/.installed-dev
TOY := data/toy_voc
PYTEST_ARGS ?=
DATA ?= voc
REPRODUCE_ARGS ?=
VENV_FLAGS ?=
WHEELHOUSE ?= wheelhouse
WHEEL_PYTHON ?= python3

.PHONY: install install-offline wheelhouse demo reproduce test test-fast lint bench-gpu gpu-check clean-venv

# mmengine and mmcv-lite require opencv-python, albumentations opencv-python-headless; both own cv2/, so one
# overwrites the other's files. Keep the headless one (no GUI libraries needed) and reinstall it whole.
$(STAMP): requirements.txt pyproject.toml
	@test -x $(PY) || python3 -m venv $(VENV_FLAGS) $(VENV)
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -m pip uninstall -q -y opencv-python
	$(PY) -m pip install -q --force-reinstall --no-deps "$$(grep '^opencv-python-headless' requirements.txt)"
	$(PY) -m pip install -q --no-deps -e .
	@touch $(STAMP)

$(DEV_STAMP): $(STAMP) requirements-dev.txt
	$(PY) -m pip install -q -r requirements-dev.txt
	@touch $(DEV_STAMP)

install: $(STAMP)

# For a machine without internet (README, "On a machine without internet"). On one with internet and the target's
# Python: every requirement but torch/torchvision/triton as wheels in $(WHEELHOUSE)/.
wheelhouse:
	$(WHEEL_PYTHON) tools/wheelhouse.py $(WHEELHOUSE)

# On the machine without: pip reads only $(WHEELHOUSE)/ and keeps the installed torch (a new venv sees the system's).
install-offline:
	PIP_NO_INDEX=1 PIP_FIND_LINKS="$(abspath $(WHEELHOUSE))" $(MAKE) $(DEV_STAMP) VENV_FLAGS=--system-site-packages

lint: $(DEV_STAMP)
	$(PY) -m ruff check wsss tools tests bench configs

# pytest exits 5 when it collected nothing: that is a failure here, not a pass.
define run_pytest
	@$(PY) -m pytest $(1) $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests" >&2; exit 1; fi; exit $$rc
endef

# Every test (CI runs this).
test: $(DEV_STAMP) lint
	$(call run_pytest,)

# The edit loop: every test but those marked slow (pytest.mark.slow).
test-fast: $(DEV_STAMP) lint
	$(call run_pytest,-m "not slow")

demo: $(STAMP)
	$(PY) tools/make_toy_voc.py $(TOY)
	$(PY) tools/make_cls_labels.py $(TOY) --classes $(TOY)/classes.txt --mask-dir SegmentationClass
	$(PY) tools/train.py configs/toy_centered.py --overwrite  # the demo trains anew each time

# From nothing to the paper's tables (README, "From nothing to the report"): DATA=voc (the paper, a GPU) or DATA=toy
# (CPU, minutes). Prepare, train, test --tta --crf, eval_cams --pseudo, report; a re-run skips the finished stages.
# More options: REPRODUCE_ARGS="--archives DIR --work-dir DIR ...", see python tools/reproduce.py --help.
reproduce: $(STAMP)
	$(PY) tools/reproduce.py $(DATA) $(REPRODUCE_ARGS)

# The training step, inference and the evaluator at the paper setting on a GPU (docs/benchmarks.md).
bench-gpu: $(STAMP)
	$(PY) bench/bench_train.py --device cuda

# Everything a real GPU can show, in one report (work_dirs/gpu_check/gpu_check.md + .json); under 10 min on an H100.
# On a machine without an NVIDIA driver it stops at once with one error line, before the venv is built (the driver
# check is standard-library Python, run with python3; a driver without a usable CUDA device is refused by torch).
gpu-check:
	@python3 -m tools.gpu_check --driver-only
	@$(MAKE) --no-print-directory $(STAMP)
	$(PY) tools/gpu_check.py

clean-venv:
	rm -rf $(VENV)
