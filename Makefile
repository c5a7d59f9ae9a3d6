# Two commands do all set-up: `make demo` and `make test`. Both create .venv when needed.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
DEMO_SECONDS ?= 30

.PHONY: setup demo test test-fast lint crd e2e bench bench-quick bench-backpressure clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --progress-bar off -e '.[test]'
	touch $(STAMP)

DEMO_CHECKPOINT := .demo/checkpoint

# The demo starts from scratch each time: a checkpoint left by an earlier demo would make it
# first catch up on every batch time it missed.
demo: setup
	rm -rf $(DEMO_CHECKPOINT)
	$(BIN)/dstream run examples/wordcount.yaml --duration $(DEMO_SECONDS) \
		--checkpoint $(DEMO_CHECKPOINT)

test: setup
	$(BIN)/python -m pytest -ra

test-fast: setup
	$(BIN)/python -m pytest -ra -m "not k8s and not slow"

# Chaos end-to-end on the offline cluster with a real node (e2e/README.md; kind: bash e2e/kind.sh).
e2e: setup
	bash e2e/offline.sh

# Benchmarks against pyspark.streaming and Structured Streaming (bench/README.md).
BENCH_STAMP := $(VENV)/.bench-stamp

$(BENCH_STAMP): $(STAMP)
	$(BIN)/pip install --progress-bar off -e '.[test,bench]'
	touch $(BENCH_STAMP)

bench: setup $(BENCH_STAMP)
	$(BIN)/python -m bench

bench-quick: setup $(BENCH_STAMP)
	$(BIN)/python -m bench --quick

# An overload step, dstream against pyspark.streaming (a few minutes; bench/README.md), and the
# plot of dstream's run in docs/.
bench-backpressure: setup $(BENCH_STAMP)
	$(BIN)/python -m bench.backpressure --docs-png docs/backpressure-step.png

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

clean:
	rm -rf $(VENV) build *.egg-info
