"""Maintainers' scripts (`make book`, `make check-vllm-refs`, the chapters' tables): run from the repository,
never installed with the package. The tests import them as `scripts.NAME`."""
