# Two commands from a fresh clone: `make train` and `make test`. Both set up .venv once.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
CORES ?= $(shell nproc 2>/dev/null || echo 2)

.PHONY: setup train test test-fast lint bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# Pin torch first: the local CPU wheel; an unpinned torch would pull several GB of CUDA.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev,hf]'
	touch $(STAMP)

train: $(STAMP)
	$(BIN)/gearshift train $(ARGS); rc=$$?; \
	echo "gearshift and torchrun are in $(BIN): run '. $(BIN)/activate' in your shell (or call $(BIN)/gearshift)"; \
	exit $$rc

# Tests on every core (pytest-xdist), then the testbed's and those that race the clock one at a time. Byte-compiled
# first: where PYTHONDONTWRITEBYTECODE is set (this machine), every worker process would compile gearshift again.
test: $(STAMP)
	$(BIN)/python -m compileall -q src tests examples > /dev/null
	$(BIN)/python -m pytest tests -n $(CORES) --dist worksteal -m "not testbed and not serial" $(PYTEST_ARGS)
	$(BIN)/python -m pytest tests -m "testbed or serial" $(PYTEST_ARGS)

# The suite without multi-process and testbed tests: under a minute.
test-fast: $(STAMP)
	$(BIN)/python -m pytest tests -n $(CORES) -m "not multiprocess and not testbed and not browser and not subprocess" $(PYTEST_ARGS)

# ruff, then the import contracts in pyproject.toml ([tool.importlinter]: layers, pure planning, no cycles).
lint: $(STAMP)
	$(BIN)/ruff check src tests bench
	$(BIN)/lint-imports

bench: $(STAMP)
	$(BIN)/python bench/pipeline_vs_torch.py

clean:
	rm -rf $(VENV) runs build *.egg-info src/*.egg-info
