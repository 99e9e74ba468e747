# Two entry points a fresh clone needs: `make run` and `make test`. Both bootstrap .venv.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Two stamps: `make run` installs what serving needs (the package and its runtime dependencies);
# test, lint and the rest install the dev tools too. The dev install includes the runtime one, so
# it refreshes both stamps; a runtime install alone leaves the dev stamp missing for `make test`.
STAMP := $(VENV)/.installed
RUNTIME_STAMP := $(VENV)/.installed-runtime
CERT_DIR ?= certs
STATE ?= examples/cluster
HOST ?= 127.0.0.1
PORT ?= 8443
PYTEST_ARGS ?=

.PHONY: run test lint unit e2e control-plane koordinator helm test-tools certs bench fuzz-atheris property-long clean image push dist

$(RUNTIME_STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e .
	touch $(RUNTIME_STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP) $(RUNTIME_STAMP)

$(CERT_DIR)/tls.crt: | $(RUNTIME_STAMP)
	$(BIN)/gpuquota certs generate --out $(CERT_DIR) --dns localhost --ip 127.0.0.1 > /dev/null

certs: $(CERT_DIR)/tls.crt

## run: serve the webhook over TLS on https://127.0.0.1:8443 from the example cluster in examples/
run: $(RUNTIME_STAMP) $(CERT_DIR)/tls.crt
	$(BIN)/gpuquota serve --state $(STATE) --cert-dir $(CERT_DIR) --host $(HOST) --port $(PORT)

## image: build the webhook's image from Containerfile with podman, buildah or docker (a daemon that answers): make image IMAGE=registry.example.com/team/koord-gpuquota:0.1.0
IMAGE ?=
image:
	hack/build-image.sh "$(IMAGE)"

## push: push that image with the same builder (make push IMAGE=...)
push:
	hack/build-image.sh --push "$(IMAGE)"

## dist: the wheel, a self-contained zipapp of the CLI (kubectl-gpuquota), its krew archive and manifest, SHA256SUMS, in dist/
DIST_DIR ?= dist
dist: $(STAMP)
	DIST_DIR="$(DIST_DIR)" PYTHON="$(BIN)/python" hack/dist.sh

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports

## control-plane: build etcd, kube-apiserver, kube-scheduler, kube-controller-manager from the Go module proxy (cached by the pins' hash)
control-plane:
	hack/build-control-plane.sh

## koordinator: build koord-scheduler and koord-manager from Koordinator's Go module (tools/koordinator pins it), cached by the pins' hash
koordinator:
	hack/build-koordinator.sh

## helm: build helm from the Go module proxy (tools/helm pins helm.sh/helm/v4), cached by the pins' hash
helm:
	hack/build-helm.sh

## test-tools: processes the tests run besides the control plane (HAProxy, wrk, promtool), installed if missing
test-tools:
	hack/install-test-tools.sh

## test: lint, type-check, build the control plane and Koordinator, then every test (unit, TLS, e2e, fuzz budget, bench/loadgen)
test: lint control-plane koordinator helm test-tools
	cd bench/loadgen && go vet . && go test .
	$(BIN)/pytest $(PYTEST_ARGS)

unit: $(STAMP) helm
	$(BIN)/pytest tests --ignore=tests/e2e $(PYTEST_ARGS)

e2e: $(STAMP) control-plane koordinator helm test-tools
	$(BIN)/pytest tests/e2e $(PYTEST_ARGS)

## fuzz-atheris: coverage-guided fuzzing of the decoder, pod walker and quantity parser (not part of make test)
RUNS ?= 200000
fuzz-atheris: $(STAMP)
	$(BIN)/python -c 'import atheris' 2>/dev/null || $(BIN)/pip install --quiet atheris
	corpus=$$(mktemp -d) && cp examples/requests/*.json "$$corpus"/ && \
	  $(BIN)/python hack/fuzz-atheris.py -runs=$(RUNS) -seed=1 -max_len=8192 "$$corpus"; \
	  status=$$?; rm -rf "$$corpus"; exit $$status

## property-long: every view against the webhook's verdict on many more generated clusters, randomized (not part of make test)
CLUSTERS ?= 20000
SERVED_CLUSTERS ?= 40
property-long: $(STAMP)
	GPUQUOTA_VIEWS_EXAMPLES=$(CLUSTERS) GPUQUOTA_SERVED_EXAMPLES=$(SERVED_CLUSTERS) \
	GPUQUOTA_PROPERTY_EXAMPLES=$(CLUSTERS) GPUQUOTA_PROPERTY_RANDOM=1 \
	  $(BIN)/pytest -q --timeout 0 tests/cli/test_one_verdict_property.py \
	    tests/webhook/admission/test_one_verdict_served.py tests/core/test_one_truth.py $(PYTEST_ARGS)

## bench: the production shape against native ResourceQuota, the two-webhook limit and koord-manager x3 (bench/production_shape.py), then admission over TLS (bench/run.py)
bench: $(STAMP) control-plane koordinator test-tools
	bench/run.sh

clean:
	rm -rf dist $(VENV) .cache .mypy_cache .ruff_cache .pytest_cache .hypothesis
