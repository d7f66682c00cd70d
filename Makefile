# Jacana's entry points. Every target that runs Python first makes sure .venv is current
# (scripts/bootstrap.sh returns at once when nothing changed).
SHELL := /bin/bash
PY := .venv/bin/python
PYTEST_ARGS ?=

.DEFAULT_GOAL := help
.PHONY: help bootstrap up test test-gpu test-slow proto lint fmt bench clean distclean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

bootstrap: ## create or update .venv (torch, pinned requirements, local packages, default model)
	@bash scripts/bootstrap.sh

up: bootstrap ## run the engine and the gateway on this machine (Ctrl-C stops them)
	@$(PY) scripts/stack.py

test: bootstrap ## the whole suite that needs no GPU (pytest exit 5, no tests, fails too)
	$(PY) -m pytest $(PYTEST_ARGS)

test-gpu: bootstrap ## tests marked gpu (on a machine with an NVIDIA GPU)
	$(PY) -m pytest -m gpu $(PYTEST_ARGS)

test-slow: bootstrap ## tests marked slow (minutes on a 2-core CPU)
	$(PY) -m pytest -m slow $(PYTEST_ARGS)

proto: bootstrap ## regenerate the gRPC stubs in libs/common from proto/
	$(PY) tools/gen_proto.py

lint: bootstrap ## ruff check and format check
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

fmt: bootstrap ## apply ruff's fixes and formatting
	$(PY) -m ruff check --fix .
	$(PY) -m ruff format .

bench: bootstrap ## CPU decode benchmark, Jacana vs transformers (writes bench/results/)
	$(PY) bench/decode_cpu.py

clean: ## remove caches, logs and build output (keeps .venv)
	rm -rf .run .pytest_cache .ruff_cache build dist bench/results/*.tmp
	find . -path ./.venv -prune -o \( -name __pycache__ -o -name '*.egg-info' \) -type d -print0 | xargs -0 rm -rf

distclean: clean ## also remove .venv
	rm -rf .venv
