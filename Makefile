# Two commands do all set-up: `make demo` and `make test`. Both create .venv when needed.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
DEMO_SECONDS ?= 30

.PHONY: setup debian-packages kafka demo test test-fast exactly-once soak soak-standby lint crd e2e bench bench-quick bench-backpressure clean operator-scale

JVM_ARCHIVE := $(VENV)/share/dstream/spark-classes.jsa

setup: $(STAMP) $(JVM_ARCHIVE)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --progress-bar off -e '.[test]'
	touch $(STAMP)

# Spark's classes, parsed and verified, for the JVMs of drivers and executors to map instead of
# loading them (dstream/service/jvm_archive.py): made again whenever the packages are, or the
# module that makes it (its class path is the JVMs'). Without it (no Java yet) everything
# works, only the JVMs start slower.
$(JVM_ARCHIVE): $(STAMP) driver/dstream/service/jvm_archive.py
	SPARK_LOCAL_IP=127.0.0.1 $(BIN)/python -m dstream.service.jvm_archive --output $@ \
		|| echo "warning: no class archive for the JVMs (make setup tries again)" >&2

DEMO_CHECKPOINT := .demo/checkpoint

# The demo starts from scratch each time: a checkpoint left by an earlier demo would make it
# first catch up on every batch time it missed.
demo: setup
	rm -rf $(DEMO_CHECKPOINT)
	$(BIN)/dstream run examples/wordcount.yaml --duration $(DEMO_SECONDS) \
		--checkpoint $(DEMO_CHECKPOINT)

# The Debian packages the tests need (.ci/debian-packages), installed when missing.
debian-packages:
	bash .ci/install-debian-packages

# The Kafka broker the connector tests start (.ci/install-kafka: Maven Central, cached in
# /var/cache/dstream-kafka), and Structured Streaming's Kafka connector, which the Kafka benchmark
# gives its peer (.ci/install-spark-kafka, cached in /var/cache/dstream-spark-kafka).
kafka: debian-packages
	bash .ci/install-kafka >/dev/null
	bash .ci/install-spark-kafka >/dev/null

# Most tests wait on batch intervals and JVM starts more than they use the CPU, so they run on
# TEST_WORKERS xdist workers; the `solo` tests (they assert rates and delays) then run alone.
# Each part prints its progress and its slowest tests. The first run also builds Kubernetes
# (cached in /var/cache/dstream-k8s) and the image (/var/cache/dstream-image): see the README.
TEST_WORKERS ?= 3
test: setup debian-packages kafka
	@parallel=0; alone=0; \
	$(BIN)/python -m pytest -ra --durations=25 -n $(TEST_WORKERS) --dist loadgroup \
		-m "not solo" || parallel=$$?; \
	$(BIN)/python -m pytest -ra --durations=10 -m solo || alone=$$?; \
	exit $$((parallel || alone))

test-fast: setup
	$(BIN)/python -m pytest -ra -m "not k8s and not slow"

# The connectors' exactly-once run at the issue's full size: 200,000 records into Redis, JetStream
# and Kafka, the driver SIGKILLed three times, the broker restarted (make test runs a small one).
exactly-once: setup debian-packages kafka
	DSTREAM_E2E_RECORDS=200000 DSTREAM_E2E_RATE=2000 DSTREAM_E2E_KILLS=3 \
		$(BIN)/python -m pytest -ra tests/connectors/test_exactly_once.py

# The soak (docs/fault-tolerance.md): 20 driver kills, 20 executor kills and a 20 s sink outage
# on local-cluster[2,1,1024] while input arrives, output checked exactly against it, for each
# feed: files -> files, Redis Streams -> PostgreSQL, Kafka -> Kafka (make test: the redis feed
# at 2 + 2 and 5 s, the kafka feed at 2 + 2 and 3 s, the files feed with standby at 2 + 2).
soak: setup debian-packages kafka
	SOAK_FEEDS=files,redis,kafka SOAK_DRIVER_KILLS=20 SOAK_EXECUTOR_KILLS=20 SOAK_OUTAGE_S=20 \
		$(BIN)/python -m pytest -s -ra tests/fault/test_soak.py

# The same with a hot standby beside every driver (`dstream run --standby`): it takes over.
soak-standby: setup debian-packages kafka
	SOAK_FEEDS=files+standby,redis+standby,kafka+standby SOAK_DRIVER_KILLS=20 \
		SOAK_EXECUTOR_KILLS=20 SOAK_OUTAGE_S=20 $(BIN)/python -m pytest -s -ra tests/fault/test_soak.py

# The operator at the issue's scale (docs/operator-scale.md): 200 StreamingJobs applied at once
# on the offline control plane, changed, deleted; one, then two operator replicas (make test: 30).
operator-scale: setup debian-packages
	for replicas in 1 2; do \
		DSTREAM_SCALE_JOBS=200 DSTREAM_SCALE_REPLICAS=$$replicas \
			$(BIN)/python -m pytest -s -ra tests/k8s/test_scale.py || exit 1; \
	done

# Chaos end-to-end on the offline cluster with a real node (e2e/README.md; kind: bash e2e/kind.sh).
e2e: setup
	bash e2e/offline.sh

# Benchmarks against pyspark.streaming and Structured Streaming (bench/README.md); progress on
# stderr. `make bench` writes bench/results/<date>.md; `make bench-quick` proves the harness
# (short trials, no confirmation: not a result). BENCH_ARGS passes options (python -m bench -h).
BENCH_ARGS ?=
BENCH_STAMP := $(VENV)/.bench-stamp

$(BENCH_STAMP): $(STAMP)
	$(BIN)/pip install --progress-bar off -e '.[test,bench]'
	touch $(BENCH_STAMP)

bench: setup $(BENCH_STAMP) kafka
	$(BIN)/python -m bench $(BENCH_ARGS)

bench-quick: setup $(BENCH_STAMP) kafka
	$(BIN)/python -m bench --quick $(BENCH_ARGS)

# An overload step, dstream against pyspark.streaming (a few minutes; bench/README.md), and the
# plot of dstream's run in docs/.
bench-backpressure: setup $(BENCH_STAMP)
	$(BIN)/python -m bench.backpressure --docs-png docs/backpressure-step.png $(BENCH_ARGS)

# The CRD is generated from the job-spec model (tests/operator/test_crd.py checks they agree).
crd: setup
	$(BIN)/python -m dstream_operator.crd > crds/streamingjob.yaml

# ruff, then the layers contract (pyproject.toml's [tool.importlinter]: no package imports a
# layer above it, and the operator never reaches the engine or PySpark).
lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

clean:
	rm -rf $(VENV) build *.egg-info
