# The two commands a newcomer types: `make demo` and `make test`. Each creates .venv when missing.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
TOY := data/toy_voc
PYTEST_ARGS ?=

.PHONY: install demo test test-fast lint bench-gpu clean-venv

$(STAMP): requirements.txt pyproject.toml
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -m pip install -q --no-deps -e .
	@touch $(STAMP)

install: $(STAMP)

lint: $(STAMP)
	$(PY) -m ruff check wsss tools tests bench configs

# pytest exits 5 when it collected nothing: that is a failure here, not a pass.
define run_pytest
	@$(PY) -m pytest $(1) $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests" >&2; exit 1; fi; exit $$rc
endef

# Every test (CI runs this).
test: $(STAMP) lint
	$(call run_pytest,)

# The edit loop: every test but those marked slow (pytest.mark.slow).
test-fast: $(STAMP) lint
	$(call run_pytest,-m "not slow")

demo: $(STAMP)
	$(PY) tools/make_toy_voc.py $(TOY)
	$(PY) tools/make_cls_labels.py $(TOY) --classes $(TOY)/classes.txt --mask-dir SegmentationClass
	$(PY) tools/train.py configs/toy_centered.py

# The training step, inference and the evaluator at the paper setting on a GPU (docs/benchmarks.md).
bench-gpu: $(STAMP)
	$(PY) bench/bench_train.py --device cuda

clean-venv:
	rm -rf $(VENV)
