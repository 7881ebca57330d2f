# minou: `make run` starts a broker, `make test` runs the whole suite.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
CKSUM  := $(shell cat pyproject.toml | cksum | cut -d' ' -f1)
# One stamp per install set: `make run` installs minou alone; the test and Spark stacks
# (pyspark, pyarrow, playwright: most of a 1 GB .venv) only for the targets that use them.
STAMP       := $(VENV)/.installed-core-$(CKSUM)
TEST_STAMP  := $(VENV)/.installed-test-$(CKSUM)
SPARK_STAMP := $(VENV)/.installed-spark-$(CKSUM)
MUTATE_STAMP := $(VENV)/.installed-mutate-$(CKSUM)
# Python keeps compiled modules in __pycache__ (ignored by git). An environment that
# turns that off (PYTHONDONTWRITEBYTECODE, as some CI images do) has every process
# compile minou's ~300 modules again: a broker then takes 0.55 s to start instead of
# 0.35 s, and the suite starts about a thousand of them.
unexport PYTHONDONTWRITEBYTECODE
APT    := $(shell command -v apt-get 2>/dev/null)
SUDO   := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: run test test-redis fuzz lint bench clean system-deps java dashboard spark-demo

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e .
	rm -f $(VENV)/.installed-core-*
	touch $@

$(TEST_STAMP): $(STAMP) Makefile
	$(BIN)/python -m pip install -q -e '.[test,spark,bench,redis,resp]'
	rm -f $(VENV)/.installed-test-*
	touch $@

$(MUTATE_STAMP): $(TEST_STAMP)
	$(BIN)/python -m pip install -q -e '.[test,spark,bench,redis,resp,mutation]'
	rm -f $(VENV)/.installed-mutate-*
	touch $@

$(SPARK_STAMP): $(STAMP) Makefile
	$(BIN)/python -m pip install -q -e '.[spark]'
	rm -f $(VENV)/.installed-spark-*
	touch $@

## run: create .venv, install minou, start a development broker on ./data (loopback, no auth)
run: $(STAMP)
	$(BIN)/minou start --dev --data ./data

## system-deps: Debian packages the tests need: chromium (dashboard tests), Java 17 (Spark
## tests), unshare and mount (the Spark cluster's workers run in mount namespaces),
## redis-server (the storage contract and system suites on Redis), redis-tools (redis-cli
## against the Redis protocol door)
TEST_DEBS := chromium util-linux mount redis-server redis-tools
system-deps: java
	@missing=""; for d in $(TEST_DEBS); do \
	  dpkg-query -W -f='$${Status}' $$d 2>/dev/null | grep -q 'install ok installed' \
	    || missing="$$missing $$d"; \
	done; \
	if [ -n "$$missing" ]; then \
	  if [ -z "$(APT)" ]; then echo "no apt-get: install$$missing yourself"; exit 1; fi; \
	  echo "installing$$missing"; \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing \
	  || { $(SUDO) apt-get update -q && $(SUDO) env DEBIAN_FRONTEND=noninteractive \
	       apt-get install -y -q --no-install-recommends $$missing; }; \
	fi

## java: Java 17, which Spark runs on (installed with apt-get when `java` is missing)
java:
	@command -v java >/dev/null 2>&1 || { \
	  if [ -z "$(APT)" ]; then \
	    echo "Spark needs Java 17 and there is no apt-get: install a Java 17 runtime"; exit 1; \
	  fi; \
	  echo "installing openjdk-17-jre-headless (Spark needs Java 17)"; \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
	    openjdk-17-jre-headless \
	  || { $(SUDO) apt-get update -q && $(SUDO) env DEBIAN_FRONTEND=noninteractive \
	       apt-get install -y -q --no-install-recommends openjdk-17-jre-headless; }; }

## spark-demo: a broker, some orders, the example Spark pipeline (examples/spark_orders.py), results
spark-demo: $(SPARK_STAMP) java
	$(BIN)/python examples/spark_demo.py

## dashboard: vendor the dashboard's JavaScript dependency from npm (output is committed)
dashboard:
	bash dashboard/build.sh

## test: install what the tests need, lint, and run the whole suite
# Then the system tests that lean hardest on storage again, every broker on Redis (the
# whole system suite on Redis is `make test-redis`: 8 min on two workers).
REDIS_PASS := tests/system/test_smoke.py tests/system/test_durability.py \
              tests/system/test_transactions.py tests/system/test_client.py \
              tests/system/test_kv.py
# Two workers (pytest-xdist), each taking a whole file at a time: a file's tests share
# its fixtures (one Spark cluster, one Redis) and run in order: 12 min, then 1.6 min for
# the Redis pass, here (2026-11-29, docs/testing.md).
# PYTEST_WORKERS=0 runs it in this process alone.
PYTEST_WORKERS ?= 2
PYTEST_PARALLEL := $(if $(filter 0,$(PYTEST_WORKERS)),,-n $(PYTEST_WORKERS) --dist loadfile)
# The Redis pass spreads single tests: its time is three 30 s kill -9 runs in one file.
REDIS_PARALLEL := $(if $(filter 0,$(PYTEST_WORKERS)),,-n $(PYTEST_WORKERS) --dist load)
test: $(TEST_STAMP) system-deps
	$(BIN)/ruff check src tests bench examples
	$(BIN)/python -m pytest $(PYTEST_PARALLEL)
	MINOU_TEST_STORAGE=redis $(BIN)/python -m pytest -q $(REDIS_PARALLEL) $(REDIS_PASS)

## test-redis: the whole system suite with every broker the tests start on Redis
test-redis: $(TEST_STAMP) system-deps
	MINOU_TEST_STORAGE=redis $(BIN)/python -m pytest $(PYTEST_PARALLEL) tests/system

## fuzz: the fuzz targets (tests/fuzz) against real brokers, FUZZ_EXAMPLES examples each
# (`make test` runs them too, with the small default of MINOU_FUZZ_EXAMPLES)
FUZZ_EXAMPLES ?= 2000
fuzz: $(TEST_STAMP)
	MINOU_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(BIN)/python -m pytest --timeout 0 tests/fuzz

## mutate: mutation testing (mutmut, pinned) of the I/O-free parts (core, engine, names,
## protocol, rules) with the fast suite and the simulator's quick profile, then the score
## per file (docs/testing.md). MUTANTS=name-glob runs some only, e.g. 'minou.core.log*'.
MUTANTS ?=
mutate: $(MUTATE_STAMP)
	$(if $(MUTANTS),rm -f mutants/killers.tsv,rm -rf mutants)
	MINOU_SIM_SEEDS=4 MINOU_MUTATION_KILLERS=$(CURDIR)/mutants/killers.tsv \
		$(BIN)/python tests/mutation_run.py run --max-children 3 $(MUTANTS)
	$(BIN)/python tests/mutation_score.py --save-killers
	$(BIN)/python tests/mutation_score.py

.PHONY: mutate

## simulate: the deterministic simulator (tests/sim, docs/testing.md) over SEEDS seeds, with a
## progress bar; a failing seed is shrunk and printed. SEED=s replays one seed step by step;
## SIM_ARGS passes more (--first N, --clients N, --steps N, --strict, ...)
SEEDS    ?= 1000
SEED     ?=
SIM_ARGS ?=
simulate: $(STAMP)
	$(BIN)/python -m tests.sim $(if $(SEED),--seed $(SEED),--seeds $(SEEDS)) $(SIM_ARGS)

.PHONY: simulate

## chaos: three brokers on Redis (primary + replica, replicas = 1) with producers and
## consumers, native and HTTP, under kill -9, SIGSTOP past the lease and a clean stop of
## brokers; then the counts (lost, duplicates, order, stale writes refused) as a table.
## CHAOS_SECONDS long (faults spread over it), CHAOS_SEED=s replays a schedule of faults;
## CHAOS_ARGS passes more (--kills N, --pauses N, --graceful N, --rate N, --keep,
## --placement spread: the queues spread over the brokers, --redis cluster).
## tests/chaos.py, docs/cluster.md ("Chaos")
CHAOS_SECONDS ?= 300
CHAOS_SEED    ?=
CHAOS_ARGS    ?=
chaos: $(TEST_STAMP) redis-deps
	$(BIN)/python -m tests.chaos --seconds $(CHAOS_SECONDS) $(if $(CHAOS_SEED),--seed $(CHAOS_SEED)) $(CHAOS_ARGS)

## redis-deps: redis-server alone (the Debian package), for make chaos
redis-deps:
	@command -v redis-server >/dev/null 2>&1 || { \
	  if [ -z "$(APT)" ]; then echo "make chaos needs redis-server and there is no apt-get: install it"; exit 1; fi; \
	  echo "installing redis-server"; \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends redis-server \
	  || { $(SUDO) apt-get update -q && $(SUDO) env DEBIAN_FRONTEND=noninteractive \
	       apt-get install -y -q --no-install-recommends redis-server; }; }

.PHONY: chaos redis-deps

lint: $(TEST_STAMP)
	$(BIN)/ruff check src tests bench examples

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache

# ---- bench: begin -------------------------------------------------------------
# `make bench`: minou side by side with the peers (Redis Streams AOF everysec and
# no persistence, NATS JetStream; RabbitMQ too with PEERS=all) in one run; prints
# the table and writes bench/results/latest.json. See docs/benchmarks.md.
#   make bench PEERS=all                 also install and measure rabbitmq-server
#   make bench BENCH_ARGS='--runs 1 --only a,b'
#   make bench-cluster                   test g alone: 1, 2, 3 brokers over one Redis
PEERS      ?=
BENCH_ARGS ?=
BENCH_STAMP := $(VENV)/.bench-installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)
BENCH_DEBS := redis-server nats-server $(if $(filter all,$(PEERS)),rabbitmq-server)

$(BENCH_STAMP): $(STAMP)
	$(BIN)/python -m pip install -q -e '.[bench,spark]'
	rm -f $(VENV)/.bench-installed-*
	touch $@

bench-deps:
	@missing=""; for d in $(BENCH_DEBS); do \
	  dpkg-query -W -f='$${Status}' $$d 2>/dev/null | grep -q 'install ok installed' \
	    || missing="$$missing $$d"; \
	done; \
	if [ -n "$$missing" ]; then \
	  if [ -z "$(APT)" ]; then echo "no apt-get: peers$$missing are left out"; exit 0; fi; \
	  echo "installing$$missing (peers are optional: failure is tolerated)"; \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing \
	  || { $(SUDO) apt-get update -q && $(SUDO) env DEBIAN_FRONTEND=noninteractive \
	       apt-get install -y -q --no-install-recommends $$missing; } \
	  || echo "could not install$$missing: the bench runs without them"; \
	fi

## bench: minou vs the installed peers, every test, medians of 3 runs (PEERS=all adds RabbitMQ)
bench: $(BENCH_STAMP) bench-deps
	$(BIN)/python bench/minou_bench.py $(if $(filter-out all,$(PEERS)),--peers $(PEERS)) $(BENCH_ARGS)
	$(BIN)/python bench/dedup_soak.py $(or $(DEDUP_ARGS),--window 30 --settle 10)
	$(BIN)/python bench/credentials_bench.py
	$(BIN)/python bench/federation.py
	$(BIN)/python bench/kv.py
	$(BIN)/python bench/resp_bench.py

## bench-dedup: dedup window memory and restart, a key on every publish vs none, with the
## default 120 s window (~6 min; `make bench` runs it with a 30 s one). docs/benchmarks.md.
DEDUP_ARGS ?=
bench-dedup: $(STAMP)
	$(BIN)/python bench/dedup_soak.py $(DEDUP_ARGS)

## bench-cluster: 1, 2 and 3 minou brokers over one Redis (test g of minou_bench.py, about
## 3.5 min for 3 runs; not in `make bench`), to bench/results/cluster.json. docs/benchmarks.md.
bench-cluster: $(BENCH_STAMP) bench-deps
	$(BIN)/python bench/minou_bench.py --only g --peers none --out bench/results/cluster.json $(BENCH_ARGS)

.PHONY: bench-deps bench-dedup bench-cluster
# ---- bench: end ---------------------------------------------------------------
