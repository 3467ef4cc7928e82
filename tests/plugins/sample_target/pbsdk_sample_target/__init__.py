"""A third-party target that reuses the host CPU lowering under its own name.

It shows the smallest useful plugin: subclass an existing target, change what differs (here only the
name), register it in the ``pbsdk.targets`` entry-point group.
"""

from pbsdk.targets.cpu import CpuTarget


class SampleTarget(CpuTarget):
    name = "sample"
    description = "sample third-party plugin (host CPU lowering under another name)"
