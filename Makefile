# engine-state: the two commands a new user needs are `make demo` and `make test`.
# Everything else here is what they are made of.

SHELL := /bin/bash
CARGO ?= cargo
PYTHON ?= python3
VENV ?= .venv
PY := $(abspath $(VENV))/bin/python
# vLLM (~10 GB with torch) lives outside the clone so that later runs reuse it.
VLLM_VENV ?= $(HOME)/.cache/engine-state/vllm-venv
VLLM_VERSION ?= 0.33.0
DURATION ?= 15
PROFILE := release
# Honour CARGO_TARGET_DIR (parallel checkouts build into their own folders).
TARGET_DIR := $(or $(CARGO_TARGET_DIR),target)
BIN := $(TARGET_DIR)/$(PROFILE)

export ENGINE_STATE_PYTHON := $(PY)

.PHONY: help build bins py venv lint-venv test test-rust test-loom test-py test-go test-capi test-vllm \
        vllm-venv lint lint-rust lint-py lint-shm-only lint-capi capi-header fmt miri bench bench-vllm \
        demo demo-smoke demo-fleet demo-fleet-smoke sim sim-residency sim-share vllm-router-venv real clean fuzz

help:
	@echo "make demo        four demo engines, live in esdump --watch for DURATION=$(DURATION) s"
	@echo "make demo-fleet  a fake vLLM fleet, esroute in front, a trace replayed through it (DURATION s)"
	@echo "make test        every test (Rust, loom, Miri, Python, Go, vLLM contract, demo smoke)"
	@echo "make bench       benchmarks against their baselines (see BENCHMARKS.md)"
	@echo "make sim         the essim routing sweeps behind docs/ROUTING.md (minutes)"
	@echo "make sim-residency  the cache-residency sweeps (issue 21; minutes)"
	@echo "make sim-share   replicas sharing their reservations (issue 22; minutes)"
	@echo "make real        esroute vs vllm-router on the fake fleet, real processes (issue 23; ~22 min)"
	@echo "make lint        cargo fmt --check, clippy -D warnings, ruff, stubtest, the C header is current"
	@echo "make capi-header regenerate capi/include/engine_state.h (cbindgen) after an ABI change"
	@echo "make miri        the seqlock module under Miri (needs nightly with miri)"
	@echo "make fuzz        the file parser, the Redis record decoder, the digest parsers, 100k cases each"

# ---- build -------------------------------------------------------------------

bins:
	$(CARGO) build --release --bins

$(VENV)/.ok:
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "maturin>=1.5,<2" "pytest>=7"
	touch $@

venv: $(VENV)/.ok

# Python lint tools, pinned (a venv made before they were added gets them here).
$(VENV)/.lint-ok: $(VENV)/.ok
	$(PY) -m pip install -q "ruff==0.17.5" "mypy==2.4.1"
	touch $@

lint-venv: $(VENV)/.lint-ok

# The Python package (engine_state, with its compiled _native module) in .venv.
py: venv
	VIRTUAL_ENV=$(abspath $(VENV)) $(VENV)/bin/maturin develop --release -q -m publisher-py/Cargo.toml

build: bins py

# ---- tests -------------------------------------------------------------------

test: lint build test-rust test-loom miri test-py test-go test-capi test-vllm demo-smoke demo-fleet-smoke

test-rust: bins py
	$(CARGO) test --release --workspace --exclude engine-state-py

# The seqlock protocol, model-checked.
test-loom:
	RUSTFLAGS="--cfg loom" $(CARGO) test --release -p engine-state-shm-format --lib seqlock \
	    --target-dir target/loom

test-py: py bins
	ENGINE_STATE_BIN=$(abspath $(BIN)) $(PY) -m pytest -q publisher-py/tests

# The Go reader (go/enginestate, no cgo): gofmt, go vet, and go test — the
# golden vectors, bad files, and against the Rust binaries: a million reads
# of espublish --stress, esdump-go diffed with esdump --json. Standard library
# only: nothing is downloaded.
test-go: bins
	@command -v go >/dev/null || { echo "test-go: Go is missing; install it (Debian: apt-get install golang-go; .ci/run does)"; exit 1; }
	@cd go && test -z "$$(gofmt -l .)" || { echo "test-go: gofmt -l lists files to format:"; gofmt -l .; exit 1; }
	cd go && go vet ./...
	cd go && ENGINE_STATE_BIN=$(abspath $(BIN)) go test -count=1 ./...

# The C ABI (capi/): the C example linked statically and the C++ example
# (RAII wrapper, and a router's prefix hit in a live engine's cache digest)
# linked dynamically, built with the system compilers and run against live
# espublish engines; then both again under ASan and UBSan (any report fails
# the run). The Rust side of the ABI (golden vectors,
# bad input, threads) is in test-rust.
CAPI_OUT := $(TARGET_DIR)/capi-examples
CAPI_CFLAGS := -Wall -Wextra -Werror -Icapi/include
# What rustc says a static Rust library needs (cargo rustc -- --print native-static-libs).
CAPI_STATIC := $(BIN)/libengine_state.a -lgcc_s -lutil -lrt -lpthread -lm -ldl
SANITIZE := -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=all

test-capi: bins
	$(CARGO) build --release -p engine-state-capi
	@# The library's soname (capi/build.rs): what the loader looks for.
	ln -sf libengine_state.so $(BIN)/libengine_state.so.1
	@mkdir -p $(CAPI_OUT)
	cc -std=c11 -O2 $(CAPI_CFLAGS) examples/c/esdump.c $(CAPI_STATIC) -o $(CAPI_OUT)/esdump-c
	c++ -std=c++17 -O2 $(CAPI_CFLAGS) examples/cpp/esdump.cpp -L$(BIN) -lengine_state \
	    -Wl,-rpath,$(abspath $(BIN)) -o $(CAPI_OUT)/esdump-cpp
	cc -std=c11 $(SANITIZE) $(CAPI_CFLAGS) examples/c/esdump.c $(CAPI_STATIC) -o $(CAPI_OUT)/esdump-c-asan
	c++ -std=c++17 $(SANITIZE) $(CAPI_CFLAGS) examples/cpp/esdump.cpp -L$(BIN) -lengine_state \
	    -Wl,-rpath,$(abspath $(BIN)) -o $(CAPI_OUT)/esdump-cpp-asan
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
	    capi/tests/live_examples.sh $(BIN) $(CAPI_OUT)/esdump-c $(CAPI_OUT)/esdump-cpp $(CAPI_OUT)/esdump-c-asan \
	    $(CAPI_OUT)/esdump-cpp-asan

$(VLLM_VENV)/.ok:
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q --upgrade pip
	$(VLLM_VENV)/bin/pip install -q "vllm==$(VLLM_VERSION)" "maturin>=1.5,<2" "pytest>=7"
	touch $@

vllm-venv: $(VLLM_VENV)/.ok

# The hook against the real vLLM scheduler (installs vLLM once, ~3 min), then
# essim's engine model against the same scheduler, step by step (own session:
# no plugin loaded).
test-vllm: vllm-venv bins
	VIRTUAL_ENV=$(VLLM_VENV) $(VLLM_VENV)/bin/maturin develop --release -q -m publisher-py/Cargo.toml
	ENGINE_STATE_BIN=$(abspath $(BIN)) $(VLLM_VENV)/bin/python -m pytest -q publisher-py/tests_vllm
	ENGINE_STATE_BIN=$(abspath $(BIN)) $(VLLM_VENV)/bin/python -m pytest -q sim/tests_vllm

lint: lint-rust lint-py lint-shm-only lint-capi

lint-rust:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

# ruff (ruff.toml) over every Python file; stubtest checks _native.pyi against
# the compiled module, so it needs the package built (py).
lint-py: lint-venv py
	$(VENV)/bin/ruff check .
	$(PY) -m mypy.stubtest engine_state._native

# A shared-memory-only build has no Redis client and no TLS in its dependency
# tree, and it still builds: the reader without default features, the router
# (which depends on the reader without them) and the C ABI without its
# default `redis` feature (with it, libengine_state reads redis:// URIs by
# design).
SHM_ONLY = engine-state-reader engine-state-router engine-state-capi
lint-shm-only:
	@for p in $(SHM_ONLY); do \
		tree=$$($(CARGO) tree -p $$p --no-default-features -e normal --prefix none) || exit 1; \
		if grep -E '^(redis|rustls|engine-state-redis) ' <<< "$$tree"; then \
			echo "$$p without default features depends on the above"; exit 1; fi; \
	done
	@for p in $(SHM_ONLY); do \
		$(CARGO) clippy -p $$p --no-default-features --all-targets -- -D warnings || exit 1; \
	done

# capi/include/engine_state.h is what cbindgen makes of capi/src now.
lint-capi:
	$(CARGO) test -q -p engine-state-capi --test header

capi-header:
	ENGINE_STATE_BLESS=1 $(CARGO) test -q -p engine-state-capi --test header

fmt:
	$(CARGO) fmt --all

# Miri runs the seqlock, snapshot and layout modules' tests (the code behind
# the unsafe word access; mmap itself is outside what Miri can execute). It
# needs the nightly toolchain's miri component: installed here when rustup can,
# otherwise it says so and the seqlock model is still checked by loom.
miri:
	@if ! $(CARGO) +nightly miri --version >/dev/null 2>&1; then \
	    rustup component add --toolchain nightly miri rust-src >/dev/null 2>&1 || true; \
	fi
	@if $(CARGO) +nightly miri --version >/dev/null 2>&1; then \
	    $(CARGO) +nightly miri test -p engine-state-shm-format --lib -- seqlock:: snapshot:: layout:: reservations::; \
	else \
	    echo "make miri: no nightly toolchain with miri here (rustup toolchain install nightly --component miri rust-src);"; \
	    echo "the seqlock model is still checked by loom: make test-loom"; \
	fi

# The parsers of what other processes write, fuzzed longer than in `cargo test`
# (256 cases there): the reader's file parser, the Redis record decoder and
# the cache digest's parsers (file and value), with arbitrary bytes and
# mutated valid inputs.
fuzz:
	PROPTEST_CASES=$${PROPTEST_CASES:-100000} $(CARGO) test --release -p engine-state-shm-format --test fuzz_file
	PROPTEST_CASES=$${PROPTEST_CASES:-100000} $(CARGO) test --release -p engine-state-shm-format --test fuzz_digest
	PROPTEST_CASES=$${PROPTEST_CASES:-100000} $(CARGO) test --release -p engine-state-shm-format --test fuzz_router
	PROPTEST_CASES=$${PROPTEST_CASES:-100000} $(CARGO) test --release -p engine-state-reader --lib redis_schema::tests::fuzz

# ---- demo --------------------------------------------------------------------

DEMO_DIR ?= /dev/shm/engine_state_demo

demo: build
	@rm -rf $(DEMO_DIR); mkdir -p $(DEMO_DIR)
	@$(PY) examples/demo_engines.py --uri file://$(DEMO_DIR) --engines 4 --duration $$(( $(DURATION) + 2 )) & \
	demo=$$!; trap "kill $$demo 2>/dev/null; wait $$demo 2>/dev/null; rm -rf $(DEMO_DIR)" EXIT; \
	sleep 1; \
	$(BIN)/esdump --uri file://$(DEMO_DIR) --watch --interval 500 --count $$(( $(DURATION) * 2 ))

# What CI runs to keep `make demo` true: the same, short, and checked.
demo-smoke: build
	DURATION=3 $(MAKE) --no-print-directory demo DEMO_DIR=/dev/shm/engine_state_demo_smoke > $(TARGET_DIR)/demo-smoke.txt
	@grep -c " fresh " $(TARGET_DIR)/demo-smoke.txt >/dev/null
	@for i in 0 1 2 3; do grep -q "demo-$$i .* fresh" $(TARGET_DIR)/demo-smoke.txt || { echo "demo-$$i not fresh in make demo"; exit 1; }; done
	@echo "demo smoke: 4 engines fresh"

# The fake fleet end to end: essim serve engines, esroute in front of them,
# essim replay sending the agentic trace through it, esdump --watch live.
DEMO_FLEET_DIR ?= /dev/shm/engine_state_demo_fleet
demo-fleet: bins
	examples/demo_fleet.sh $(abspath $(BIN)) $(DEMO_FLEET_DIR) $(DURATION) 4

# What CI runs to keep `make demo-fleet` true: a short replay, checked.
demo-fleet-smoke: bins
	REPLAY_ARGS="--limit 12" examples/demo_fleet.sh $(abspath $(BIN)) $$(mktemp -u -d /dev/shm/es_demo_fleet_smoke.XXXXXX) 2 4 \
	    > $(TARGET_DIR)/demo-fleet-smoke.txt
	@for i in 0 1 2 3; do grep -q "sim-$$i .* fresh" $(TARGET_DIR)/demo-fleet-smoke.txt || { echo "sim-$$i not fresh in make demo-fleet"; exit 1; }; done
	@grep -q "12 requests in .* ok 12," $(TARGET_DIR)/demo-fleet-smoke.txt || { echo "make demo-fleet: not every request ok:"; cat $(TARGET_DIR)/demo-fleet-smoke.txt; exit 1; }
	@echo "demo-fleet smoke: 4 engines fresh, 12 requests ok through esroute"

# ---- benchmarks --------------------------------------------------------------

bench: build
	$(CARGO) bench -p engine-state-reader --bench read
	$(CARGO) bench -p engine-state-capi --bench capi
	$(PY) bench/publish_bench.py
	$(PY) bench/read_bench.py
	$(BIN)/redis_bench --seconds 10
	$(PY) bench/hook_bench.py
	$(PY) bench/router_compare.py
	$(CARGO) bench -p engine-state-proxy --bench proxy_cost
	cd go && go test -run '^$$' -bench . -benchtime 2s ./enginestate

# The vLLM hook's cost with vLLM's real Scheduler and Request objects.
bench-vllm: vllm-venv
	VIRTUAL_ENV=$(VLLM_VENV) $(VLLM_VENV)/bin/maturin develop --release -q -m publisher-py/Cargo.toml
	$(VLLM_VENV)/bin/python bench/hook_bench.py --vllm

# ---- simulation --------------------------------------------------------------

# The routing sweeps behind docs/ROUTING.md: tables, CSV/JSON and SVG plots in docs/routing/.
sim:
	$(CARGO) build --release -p engine-state-sim
	for t in mooncake agentic agentic-session azure; do \
	  mkdir -p docs/routing/$$t && \
	  $(BIN)/essim sweep sim/sweeps/routing-$$t.toml --out docs/routing/$$t --jobs 2 \
	    > docs/routing/$$t/table.md || exit 1; \
	done
	mkdir -p docs/routing/agentic-nomig docs/routing/mooncake-nomig
	$(BIN)/essim sweep sim/sweeps/routing-agentic.toml --no-migration --out docs/routing/agentic-nomig \
	  --jobs 2 > docs/routing/agentic-nomig/table.md
	$(BIN)/essim sweep sim/sweeps/routing-mooncake.toml --no-migration --first 300 \
	  --out docs/routing/mooncake-nomig --jobs 2 > docs/routing/mooncake-nomig/table.md
	for seed in 2 3 4; do \
	  sed "s/^seed = 1$$/seed = $$seed/" sim/sweeps/routing-agentic.toml > $(TARGET_DIR)/routing-agentic-seed$$seed.toml && \
	  mkdir -p docs/routing/agentic-nomig-seed$$seed && \
	  $(BIN)/essim sweep $(TARGET_DIR)/routing-agentic-seed$$seed.toml --no-migration --jobs 2 \
	    --out docs/routing/agentic-nomig-seed$$seed > docs/routing/agentic-nomig-seed$$seed/table.md || exit 1; \
	  rm -f docs/routing/agentic-nomig-seed$$seed/*.svg; \
	done
	$(BIN)/essim plot docs/routing/agentic-nomig docs/routing/agentic-nomig-seed2 docs/routing/agentic-nomig-seed3 \
	  docs/routing/agentic-nomig-seed4 --out docs/routing/agentic-nomig-4seeds
	rm -f docs/routing/*/summary.json  # the CSV holds the same; docs/routing/TABLES.md: sim/sweeps/pivot.py

# The cache-residency sweeps (issue 21): agentic seeds 1-4 at 1x and 2x, Mooncake at 0.5x,
# each knowledge mode; the replicas-over-one-router plots over the 4 seeds in
# docs/routing/residency-agentic-4seeds.
sim-residency:
	$(CARGO) build --release -p engine-state-sim
	mkdir -p docs/routing/residency-agentic docs/routing/residency-mooncake
	$(BIN)/essim sweep sim/sweeps/residency-agentic.toml --out docs/routing/residency-agentic --jobs 2 \
	  > docs/routing/residency-agentic/table.md
	$(BIN)/essim sweep sim/sweeps/residency-mooncake.toml --out docs/routing/residency-mooncake --jobs 2 \
	  > docs/routing/residency-mooncake/table.md
	for seed in 2 3 4; do \
	  sed "s/^seed = 1$$/seed = $$seed/" sim/sweeps/residency-agentic.toml > $(TARGET_DIR)/residency-agentic-seed$$seed.toml && \
	  mkdir -p docs/routing/residency-agentic-seed$$seed && \
	  $(BIN)/essim sweep $(TARGET_DIR)/residency-agentic-seed$$seed.toml --jobs 2 \
	    --out docs/routing/residency-agentic-seed$$seed > docs/routing/residency-agentic-seed$$seed/table.md || exit 1; \
	  rm -f docs/routing/residency-agentic-seed$$seed/*.svg; \
	done
	$(BIN)/essim plot docs/routing/residency-agentic docs/routing/residency-agentic-seed2 \
	  docs/routing/residency-agentic-seed3 docs/routing/residency-agentic-seed4 \
	  --out docs/routing/residency-agentic-4seeds
	rm -f docs/routing/residency-*/summary.json  # the CSV holds the same

sim-share:
	$(CARGO) build --release -p engine-state-sim
	mkdir -p docs/routing/share-agentic
	$(BIN)/essim sweep sim/sweeps/share-agentic.toml --out docs/routing/share-agentic --jobs 2 \
	  > docs/routing/share-agentic/table.md
	for seed in 2 3 4; do \
	  sed "s/^seed = 1$$/seed = $$seed/" sim/sweeps/share-agentic.toml > $(TARGET_DIR)/share-agentic-seed$$seed.toml && \
	  mkdir -p docs/routing/share-agentic-seed$$seed && \
	  $(BIN)/essim sweep $(TARGET_DIR)/share-agentic-seed$$seed.toml --jobs 2 \
	    --out docs/routing/share-agentic-seed$$seed > docs/routing/share-agentic-seed$$seed/table.md || exit 1; \
	  rm -f docs/routing/share-agentic-seed$$seed/*.svg; \
	done
	$(BIN)/essim plot docs/routing/share-agentic docs/routing/share-agentic-seed2 \
	  docs/routing/share-agentic-seed3 docs/routing/share-agentic-seed4 \
	  --out docs/routing/share-agentic-4seeds
	rm -f docs/routing/share-agentic*/summary.json  # the CSV holds the same

# ---- real processes ----------------------------------------------------------

# vllm-router (vllm-project/router on PyPI, a Rust binary in a wheel), pinned,
# outside the clone like the vLLM venv.
VLLM_ROUTER_VENV ?= $(HOME)/.cache/engine-state/vllm-router-venv
VLLM_ROUTER_VERSION ?= 0.1.17
REAL_OUT ?= sim/sweeps/real/out

$(VLLM_ROUTER_VENV)/.ok:
	$(PYTHON) -m venv $(VLLM_ROUTER_VENV)
	$(VLLM_ROUTER_VENV)/bin/pip install -q "vllm-router==$(VLLM_ROUTER_VERSION)"
	touch $@

vllm-router-venv: $(VLLM_ROUTER_VENV)/.ok

# esroute and vllm-router side by side on the fake fleet, with essim's
# prediction (docs/ROUTING.md, "Real processes"): sim/sweeps/real/matrix.json,
# every run's logs in $(REAL_OUT)/runs; the table, CSV and plot into docs/routing/real.
real: bins vllm-router-venv
	$(PYTHON) sim/sweeps/real/side_by_side.py --bin $(BIN) \
	  --vllm-router $(VLLM_ROUTER_VENV)/bin/vllm-router --out $(REAL_OUT)
	mkdir -p docs/routing/real
	cp $(REAL_OUT)/table.md $(REAL_OUT)/results.csv $(REAL_OUT)/ttft_p90.svg docs/routing/real/

clean:
	$(CARGO) clean
	rm -rf $(VENV)
