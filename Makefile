# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
REPORT := $(VENV)/.installed-report
# processes each test tier runs in (pytest-xdist; a module's tests stay in one, with its fixtures): 1 = in this one
TEST_JOBS ?= 2
PYTEST := $(BIN)/python -m pytest -q tests $(if $(filter-out 1,$(TEST_JOBS)),-n $(TEST_JOBS) --dist loadscope)

.PHONY: demo test test-fast lint bench proto clean

# setup.py builds the native JSON number reader and row-cache index (optional: skipped where no C compiler is found)
$(STAMP): pyproject.toml setup.py src/recserve/serving/wire/_json_arrays.c src/recserve/serving/wire/_json_arrays_pow5.h \
		src/recserve/embedding/_row_index.c
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

# the demo's report draws figures: matplotlib comes with the report extra
$(REPORT): $(STAMP)
	$(BIN)/pip install -q -e '.[report]'
	touch $(REPORT)

demo: $(REPORT)
	$(BIN)/recserve demo

# both tiers: the unit tier first (fails fast), then the integration tier (tests that start nodes, processes or
# servers, or measure for seconds)
test: test-fast
	$(PYTEST) -m 'integration and not slow'

# the unit tier alone (about two minutes on a quiet 2-core host; the integration tier about six)
test-fast: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(PYTEST) -m 'not slow and not integration'

bench: $(STAMP)
	$(BIN)/pip install -q -e '.[dev,ray,bench,report]'
	$(BIN)/python -m benchmarks.run_all

# the Open Inference Protocol stubs in src/recserve/serving/wire/proto from the .proto files there (pinned grpcio-tools)
proto:
	scripts/gen_proto.sh

clean:
	rm -rf $(VENV) out results
