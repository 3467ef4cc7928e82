# ruff: noqa: F821 -- lit injects `config`
# lit configuration for pbsdk's IR tests (PyPI `lit` + `filecheck`; no LLVM build needed).
import os
import sys

import lit.formats

config.name = "pbsdk-ir"
config.test_format = lit.formats.ShTest(execute_external=False)
config.suffixes = [".mlir", ".py"]
config.excludes = ["lit.cfg.py"]
config.test_source_root = os.path.dirname(__file__)
python = sys.executable
config.substitutions.append(("%python", python))
config.substitutions.append(("%pbsdk", f"{python} -m pbsdk.cli"))
# `filecheck` is installed next to the interpreter.
bindir = os.path.dirname(python)
config.environment["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")
for var in ("HOME", "PBSDK_CACHE_DIR", "PYTHONPATH"):
    if var in os.environ:
        config.environment[var] = os.environ[var]
