# trident: spec → Triton model repository → tritonserver.
# `make run` is the main job on the embedded default; `make test` runs the tests.

# The embedded default runs on Python 3.11 only: the bundled tritonserver's 3.12 stub
# corrupts string (BYTES) inputs, and the CPU torch wheel in the lock is built for 3.11.
PYTHON  ?= $(shell for p in python3.11 python3; do \
             $$p -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null \
             && { echo $$p; break; }; done)
VENV    := .venv
BIN     := $(VENV)/bin
SPEC    ?= deploy/default.yaml
REPO    ?= model_repository
STAMP   := $(VENV)/.installed
AIPERF_VENV    := .venv-aiperf
AIPERF_VERSION := 0.13.0
# The lock's torch pin: its +cpu build comes from the extra index the lock names. pip asks
# every index for every pin, and an unreachable index costs ~10 s of retries a pin, so
# where pip's configuration already has this torch (a local wheel folder), make install
# leaves the lock's --extra-index-url line out.
TORCH_PIN := $(shell grep -m1 '^torch==' requirements.lock)

.PHONY: install redis-server repo validate serve run test test-fast bench stress aiperf plan clean

# Fast when nothing changed: the stamp depends on the lock file and the package metadata.
install: $(STAMP)

$(STAMP): requirements.lock setup.cfg pyproject.toml
	@test -n "$(PYTHON)" || { echo "make install: trident's embedded default needs Python 3.11 \
	(none found on PATH as python3.11 or python3): install Python 3.11, or run \
	make PYTHON=/path/to/python3.11" >&2; exit 2; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@$(BIN)/python -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' || { echo \
	"make install: $(VENV) is not a Python 3.11 environment (the embedded default needs 3.11): remove it and run make again" >&2; \
	exit 2; }
	lock=requirements.lock; \
	if $(BIN)/pip install --quiet --disable-pip-version-check --dry-run --no-deps \
	     --no-index --ignore-installed "$(TORCH_PIN)" >/dev/null 2>&1; then \
	  lock=$(VENV)/requirements.local; grep -v '^--extra-index-url' requirements.lock > $$lock; \
	fi; \
	$(BIN)/pip install --quiet --disable-pip-version-check --no-deps -r $$lock
	$(BIN)/pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	$(BIN)/trident assets
	touch $@

# The tenants' tests start their own Redis (support/redis_server.py): Debian's
# redis-server, installed when missing (needs root, as on CI).
redis-server:
	@command -v redis-server >/dev/null || test -x /usr/bin/redis-server || \
	  { apt-get update && apt-get install -y redis-server; }

repo: install
	$(BIN)/trident repo --spec $(SPEC) --out $(REPO)

validate: install
	$(BIN)/trident validate $(REPO)

serve: repo
	$(BIN)/trident serve --repo $(REPO)

# The main job: install, render the embedded default, serve it, answer one question.
run: repo
	$(BIN)/python -m builder.serve.demo --repo $(REPO)

# The tenants' tests need redis-server: a fresh machine gets it before the suite runs.
# Two pytest-xdist workers; the real-vLLM servers' tests, the doubles' servers' tests and
# the S3 tests each stay on one worker (lanes: tests/server/conftest.py; what they saved:
# tests/README.md).
test: install redis-server
	$(BIN)/python -m pytest -q --durations=15 -n 2 --dist loadgroup

test-fast: install
	$(BIN)/python -m pytest -q -m "not server and not vllm and not s3"

# BENCH: some of bench/run.py's benchmarks (default: all), e.g. `make bench BENCH=gpu_rate`;
# TRIDENT_GPU_RATE_QUICK=1 makes gpu_rate a short smoke run. aiperf_point needs AIPerf:
# installed first when it is to run; if that fails, the benchmark says why and the rest run.
bench: install
	@case " $(or $(BENCH),aiperf_point) " in *" aiperf_point "*) \
	  $(MAKE) --no-print-directory aiperf || echo "make bench: AIPerf did not install \
	(see above); aiperf_point will report it" >&2;; esac
	$(BIN)/python -m bench.run $(BENCH)

# Stub deaths under traffic (bench/stub_kills.py): 30 kills beside 2 CPU burners, about
# 10 minutes; not a benchmark of speed, so not in `make bench`.
stress: install
	$(BIN)/python -m bench.stub_kills --kills 30 --burn 2 --out bench_results/stub_kills

# AIPerf (NVIDIA's load generator) for bench/aiperf_point.py, in its own virtual
# environment: its pins (numpy, protobuf, transformers, ...) clash with requirements.lock,
# and the suite never imports it.
aiperf: $(AIPERF_VENV)/.installed

$(AIPERF_VENV)/.installed:
	test -x $(AIPERF_VENV)/bin/python || $(PYTHON) -m venv $(AIPERF_VENV)
	$(AIPERF_VENV)/bin/pip install --quiet --disable-pip-version-check "aiperf==$(AIPERF_VERSION)"
	touch $@

plan: install
	$(BIN)/trident plan --spec deploy/examples/h100x8.yaml

clean:
	rm -rf $(REPO) bench_results
