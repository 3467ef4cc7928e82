"""Import torchvision's model definitions beside a CPU build of torch.

The torchvision wheel on PyPI is a CUDA build: its C extension (``torchvision::nms`` and friends) does not
load against the CPU torch this project pins, and ``import torchvision`` then fails while registering fake
kernels for two operators that were never defined (``RuntimeError: operator torchvision::nms does not
exist``). The model definitions (ResNet, MobileNet, ViT, ...) are plain torch and need none of the C ops, so
`import_torchvision` defines the schemas of those two operators, with no kernel, when the extension did not
load, and imports the package. Calling a detection op such as ``torchvision.ops.nms`` still fails, loudly.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

#: The operators torchvision's import registers fake kernels for without checking that they exist.
_SCHEMAS = ("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
            "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")

_library: Any = None  # kept alive: the definitions last as long as the Library object


def import_torchvision() -> ModuleType:
    """The ``torchvision`` module (ImportError, with the reason, when it is not installed)."""
    global _library
    import torch

    if _library is None and not _defined(torch, "nms"):  # the C extension did not load
        _library = torch.library.Library("torchvision", "FRAGMENT")
        for schema in _SCHEMAS:
            if not _defined(torch, schema.split("(")[0]):
                _library.define(schema)
    import torchvision

    return torchvision


def _defined(torch: Any, name: str) -> bool:
    try:
        getattr(torch.ops.torchvision, name)
    except (AttributeError, RuntimeError):
        return False
    return True


def import_transformers() -> ModuleType:
    """The ``transformers`` module, after `import_torchvision` (transformers imports torchvision when it is
    installed, and with torchvision's C extension missing that import fails); ImportError when it is not
    installed."""
    import_torchvision()
    import transformers

    return transformers

