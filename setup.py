"""The native pieces, both optional: where no C compiler is found the install goes on without them.

- plain-JSON tensors' number parser (src/recserve/serving/wire/_json_arrays.c); without it the node reads JSON
  tensors with simdjson or as lists (serving/wire/json_numbers.py probes it in a child process before using it);
- the row cache's key index (src/recserve/embedding/_row_index.c); without it the cache indexes rows in a Python
  dict, which takes ~114 B per row instead of ~17 (embedding/row_index.py probes it in a child process)."""

import platform

from setuptools import Extension, setup

# x86-64: SSE4.1 (every x86-64 CPU since 2008-2011) reads 16 digits in four vector steps; a CPU without it fails
# the child-process probe, and the node reads JSON tensors with simdjson instead
# -fno-wrapv: Python's own CFLAGS ask for wrapping signed overflow, which the parser never relies on (its sums are
# unsigned or bounded) and which costs its float path ~10% (docs/decisions/2026-11-29-json-numbers-native.md)
ARGS = ["-O3", "-std=c11", "-fno-wrapv"] + (["-msse4.1"] if platform.machine().lower() in ("x86_64", "amd64") else [])

setup(ext_modules=[Extension("recserve.serving.wire._json_arrays", ["src/recserve/serving/wire/_json_arrays.c"],
                             depends=["src/recserve/serving/wire/_json_arrays_pow5.h"],  # rebuilt, and shipped
                             extra_compile_args=ARGS, optional=True),
                   Extension("recserve.embedding._row_index", ["src/recserve/embedding/_row_index.c"],
                             extra_compile_args=["-O3", "-std=c11"], optional=True)])
