# The two commands of the README, and the checks.
.PHONY: demo test check setup

demo:
	scripts/setup.sh && .venv/bin/trainport demo

test:
	scripts/setup.sh --test && .venv/bin/python -m pytest

check:
	.venv/bin/ruff check src tests benchmarks && .venv/bin/ruff format --check src tests && .venv/bin/mypy && .venv/bin/python scripts/layers.py
