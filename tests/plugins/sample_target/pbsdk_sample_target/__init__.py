"""A sample third-party pbsdk target: the host CPU's pipeline under another name.

It shows the smallest real plugin: a `Target` subclass registered in the ``pbsdk.targets`` entry-point
group of its own distribution. It inherits every stage, the spec check and the loader from the built-in
cpu target, so it compiles and runs for real on the host.
"""

from __future__ import annotations

from pbsdk.targets.cpu import CpuTarget


class SampleTarget(CpuTarget):
    name = "sample"
    description = "sample third-party plugin reusing the host CPU lowering"
