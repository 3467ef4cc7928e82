#!/usr/bin/env python
"""The kernel benchmark suite of issue #3: pbsdk vs numpy, torch eager and Inductor, 1 and 2 threads.

    .venv/bin/python benchmarks/suite.py [--quick] [--threads 1,2] [--only NAME...] [--out DIR]

The same as ``pbsdk bench``; the implementation is `pbsdk.bench` (method and outputs described there and in
docs/benchmarks.md). Writes results.json, table.md and benchmarks.png under --out (default
benchmarks/results/); rerunning regenerates all of them.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Runnable from a checkout without installing pbsdk first.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pbsdk.bench import main

if __name__ == "__main__":
    sys.exit(main(prog="benchmarks/suite.py"))
