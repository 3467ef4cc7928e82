"""Chip specs: typed, validated descriptions of the chips pbsdk compiles for.

    >>> from pbsdk.core.spec import load_spec
    >>> h100 = load_spec("h100")            # a preset, by name or alias
    >>> mine = load_spec("my_chip.yaml")    # a YAML file
    >>> here = load_spec("host")            # the machine we run on

See docs/chipspec.md (generated from these models by scripts/gen_spec_docs.py).
"""

from pbsdk.core.spec.host import detect_host
from pbsdk.core.spec.loader import (
    clear_caches,
    get_preset,
    list_presets,
    load_file,
    load_spec,
    parse_spec,
    preset_dir,
    preset_names,
    spec_json_schema,
    validate_data,
)
from pbsdk.core.spec.models import (
    ChipSpec,
    ComputeLevel,
    DType,
    MatrixUnit,
    MemoryLevel,
    VectorUnit,
    dtype_bits,
)

__all__ = [
    "ChipSpec",
    "ComputeLevel",
    "DType",
    "MatrixUnit",
    "MemoryLevel",
    "VectorUnit",
    "clear_caches",
    "detect_host",
    "dtype_bits",
    "get_preset",
    "list_presets",
    "load_file",
    "load_spec",
    "parse_spec",
    "preset_dir",
    "preset_names",
    "spec_json_schema",
    "validate_data",
]
