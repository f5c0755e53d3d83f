# The two commands a newcomer needs: `make run` (serve the digits model on :8000) and `make test`
# (everything CI checks). Both set up what they need: the Rust build and a Python venv in .venv.

VENV   := .venv
PY     := $(VENV)/bin/python
CORRAL := target/release/corral

BENCH_VENV := bench/.venv
CARGO_FUZZ := fuzz/.tools/bin/cargo-fuzz
EMB_VENV   := examples/embeddings/.venv
FUZZ_SECONDS ?= 60
OHA        := bench/.tools/bin/oha

.PHONY: run run-pipeline test lint test-prometheus-rules prometheus build release venv bench bench-overload bench-chaos bench-cost-shift bench-soak bench-pipeline bench-stream bench-payload bench-mixed bench-gpu bench-gpu-probe bench-worker-batch bench-pinning bench-chunked bench-json-memory bench-protocols gpu-carry fuzz embeddings-venv run-embeddings test-embeddings bench-embeddings clean

run: release venv
	$(CORRAL) --workers 2 -- $(PY) examples/digits/worker.py

# The two-stage example: scan → prepare (2 workers) → classify (digits, batched).
run-pipeline: release venv
	$(CORRAL) --config examples/pipeline/corral.toml

test: lint test-prometheus-rules build venv
	cargo test --workspace
	$(PY) -m pytest

lint: venv
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets -- -D warnings
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# The Prometheus rules in deploy/prometheus/: checked, unit-tested, and the example configuration
# checked (tests/test_prometheus.py runs them in a real Prometheus). promtool comes with Debian's
# prometheus package, which .ci/run installs; without it this is skipped with a notice, except
# under CI (CI set, not false or 0), where it fails.
PROM_DIR := deploy/prometheus

test-prometheus-rules:
	@if command -v promtool >/dev/null; then \
		promtool check rules $(PROM_DIR)/corral-rules.yml && \
		promtool test rules $(PROM_DIR)/corral-rules.test.yml && \
		promtool check config $(PROM_DIR)/prometheus.yml; \
	else \
		case "$${CI:-}" in ""|0|false|False|FALSE) \
			echo "SKIPPED the Prometheus rule checks: promtool is not installed." \
				"\`make prometheus\` installs Debian's prometheus package (apt; sudo when not root)." >&2;; \
		*) echo "promtool is not installed, and CI must check the rules: run .ci/install-prometheus" >&2; \
			exit 1;; \
		esac; \
	fi

# Debian's prometheus package (prometheus and promtool), when missing: for the checks above and
# tests/test_prometheus.py. The system service it brings is not started.
prometheus:
	.ci/install-prometheus

build:
	cargo build --workspace

release:
	cargo build --release -p corral

venv: $(VENV)/.installed

$(VENV)/.installed: requirements-dev.txt examples/requirements.txt python-client/pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e ./python-client \
		-r requirements-dev.txt -r examples/requirements.txt
	touch $@

# Corral against MOSEC in one run (see BENCHMARKS.md); BENCH_ARGS passes options to bench/bench.py.
bench: release $(BENCH_VENV)/.installed $(OHA)
	$(BENCH_VENV)/bin/python bench/bench.py --oha $(OHA) $(BENCH_ARGS)

# Overload without collapse: load shedding against MOSEC (see BENCHMARKS.md, "Overload").
bench-overload: release $(BENCH_VENV)/.installed $(OHA)
	$(BENCH_VENV)/bin/python bench/overload.py --oha $(OHA) $(BENCH_ARGS)

# Workers killed at random under steady load (see BENCHMARKS.md, "Chaos").
bench-chaos: release $(BENCH_VENV)/.installed
	$(BENCH_VENV)/bin/python bench/chaos.py $(BENCH_ARGS)

# A model that becomes five times slower while it serves, and fast again ("Cost shift").
bench-cost-shift: release $(BENCH_VENV)/.installed
	$(BENCH_VENV)/bin/python bench/cost_shift.py $(BENCH_ARGS)

# A long run of mixed traffic, checked for lost or wrong answers and leaks ("Soak").
bench-soak: release $(BENCH_VENV)/.installed
	$(BENCH_VENV)/bin/python bench/soak.py $(BENCH_ARGS)

# A two-stage pipeline against the same work in one stage ("Pipeline").
bench-pipeline: release $(BENCH_VENV)/.installed $(OHA)
	$(BENCH_VENV)/bin/python bench/pipeline.py --oha $(OHA) $(BENCH_ARGS)

# The generation example streamed through Corral and through MOSEC's SSE ("Streaming").
bench-stream: release $(BENCH_VENV)/.installed
	$(BENCH_VENV)/bin/python bench/stream.py $(BENCH_ARGS)

# 100 kB to 10 MB bodies (raw bytes, v2 binary tensors, JSON) through Corral, MOSEC and a bare
# loopback server ("Large payloads"); BENCH_ARGS='--quick' for a smoke run.
bench-payload: release $(BENCH_VENV)/.installed $(OHA)
	$(BENCH_VENV)/bin/python bench/payload.py --oha $(OHA) $(BENCH_ARGS)

# The measured GPU run (needs torch with CUDA and a GPU; exits 2 saying so otherwise).
bench-gpu: release $(BENCH_VENV)/.installed $(OHA)
	$(BENCH_VENV)/bin/python bench/gpu.py --oha $(OHA) $(BENCH_ARGS)

# One GPU worker's time, variant by variant (see bench/gpu_probe.py; needs a GPU, as bench-gpu).
bench-gpu-probe: release $(BENCH_VENV)/.installed $(OHA)
	$(BENCH_VENV)/bin/python bench/gpu_probe.py --oha $(OHA) $(BENCH_ARGS)

# The worker package's own cost of one batch (no socket, no model), current beside
# --package-before DIR (see bench/worker_batch.py).
bench-worker-batch: $(BENCH_VENV)/.installed
	$(BENCH_VENV)/bin/python bench/worker_batch.py $(BENCH_ARGS)

# What a GPU machine without network needs carried (bench/gpu_device.sh runs there): the worker
# package and MOSEC with the wheels it needs that the machine lacks (the versions of the bench
# venv's), for its Python 3.12.
gpu-carry: release $(BENCH_VENV)/.installed $(OHA)
	rm -rf .whl && mkdir -p .whl
	$(BENCH_VENV)/bin/python -m pip wheel --quiet --no-deps -w .whl ./python-client
	$(BENCH_VENV)/bin/python -m pip download --quiet --no-deps --only-binary=:all: \
	  --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 \
	  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
	  $$($(BENCH_VENV)/bin/python -m pip freeze | grep -iE '^(mosec|msgspec|defspec|offapi)==')

# A pinned worker beside the proxy, this build against --corral-before BIN (see BENCHMARKS.md).
bench-pinning: release venv $(BENCH_VENV)/.installed $(OHA)
	$(BENCH_VENV)/bin/python bench/pinning.py --oha $(OHA) $(BENCH_ARGS)

# The proxy's peak memory for 16 MiB JSON requests (see BENCHMARKS.md, "JSON memory").
bench-json-memory: release $(BENCH_VENV)/.installed
	$(BENCH_VENV)/bin/python bench/json_memory.py $(BENCH_ARGS)

# Proxy CPU per request on the protocol paths with large values (see BENCHMARKS.md, "Protocol
# paths, proxy CPU").
bench-protocols: release $(BENCH_VENV)/.installed $(OHA)
	$(BENCH_VENV)/bin/python bench/protocol_paths.py --oha $(OHA) $(BENCH_ARGS)

# Large raw bodies sent chunked against sent with a length (see BENCHMARKS.md, "Chunked bodies").
bench-chunked: release $(BENCH_VENV)/.installed
	$(BENCH_VENV)/bin/python bench/chunked.py $(BENCH_ARGS)

# Priority classes at 2x saturation and weight budgets (see BENCHMARKS.md).
bench-mixed: release $(BENCH_VENV)/.installed $(OHA)
	$(BENCH_VENV)/bin/python bench/mixed.py --oha $(OHA) $(BENCH_ARGS)

# The bench venv installs the package (not editable, as a user would): its sources are inputs.
PY_CLIENT_SOURCES := $(wildcard python-client/src/corral/*.py)

$(BENCH_VENV)/.installed: bench/requirements.txt python-client/pyproject.toml $(PY_CLIENT_SOURCES)
	python3 -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/python -m pip install --quiet --disable-pip-version-check --force-reinstall --no-deps ./python-client
	$(BENCH_VENV)/bin/python -m pip install --quiet --disable-pip-version-check ./python-client -r bench/requirements.txt
	touch $@

# The embeddings example is opt-in: torch from PyPI pulls ~3 GB (about two minutes to install).
embeddings-venv: $(EMB_VENV)/.installed

$(EMB_VENV)/.installed: examples/embeddings/requirements.txt requirements-dev.txt bench/requirements.txt python-client/pyproject.toml
	python3 -m venv $(EMB_VENV)
	$(EMB_VENV)/bin/python -m pip install --quiet --disable-pip-version-check -e ./python-client \
		-r examples/embeddings/requirements.txt -r requirements-dev.txt -r bench/requirements.txt
	touch $@

# Serves /infer and OpenAI's /v1/embeddings on :8000 (examples/embeddings/corral.toml).
run-embeddings: release embeddings-venv
	$(CORRAL) --config examples/embeddings/corral.toml

test-embeddings: build embeddings-venv
	$(EMB_VENV)/bin/python -m pytest -m embeddings tests/test_embeddings.py

bench-embeddings: release embeddings-venv $(OHA)
	$(EMB_VENV)/bin/python bench/embeddings.py --oha $(OHA) $(BENCH_ARGS)

# Each fuzz target for FUZZ_SECONDS (libFuzzer through cargo-fuzz). RUSTC_BOOTSTRAP lets the
# stable toolchain take the sanitizer flags cargo-fuzz passes. A crash leaves its input in
# fuzz/artifacts/TARGET/: fix the bug, then copy the input to fuzz/regressions/TARGET/, where
# `cargo test` re-runs it for good.
fuzz: $(CARGO_FUZZ)
	cd fuzz && for target in frame_decoder body_transcoding v2_request worker_results; do \
		mkdir -p corpus/$$target && \
		RUSTC_BOOTSTRAP=1 ../$(CARGO_FUZZ) run -O $$target corpus/$$target seeds/$$target \
			-- -max_total_time=$(FUZZ_SECONDS) || exit 1; \
	done

$(CARGO_FUZZ):
	cargo install --locked cargo-fuzz --version 0.13.2 --root fuzz/.tools

# The load generator, built from crates.io (a few minutes, once).
$(OHA):
	cargo install --locked oha --version 1.16.0 --root bench/.tools

clean:
	cargo clean
	rm -rf $(VENV) .whl
