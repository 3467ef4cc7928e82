"""`KernelConfig`: the packed matmul kernel's arguments checked once, without building any IR (MLIR types
only): each combination that makes no kernel is a ValueError naming the kernel and what does not fit, and
the derived facts (layouts, packed buffers, arguments) follow from the configuration."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from typing import Any

import pytest
from mlir import ir

from pbsdk.core.plan.contraction import Blocking
from pbsdk.core.plan.window import ConvGeometry
from pbsdk.targets.cpu.matmul_kernel import (
    Epilogue,
    EpilogueOp,
    KernelConfig,
    MatmulShape,
    Window,
    build_matmul_kernel,
    packed_b_shape,
)

M, N, K = 37, 45, 29
#: mr 6, nr 16 (2 vectors of 8 lanes), kc 16.
BLK = Blocking(mr=6, nv=2, lanes=8, mc=12, nc=32, kc=16)
#: A 3x3 window over a 16-channel input (run: 16 channels a tap).
GEOM = ConvGeometry(kh=3, kw=3, sh=1, sw=1, dh=1, dw=1, oh=9, ow=11)


@pytest.fixture(autouse=True)
def context() -> Iterator[None]:
    with ir.Context(), ir.Location.unknown():
        yield


def _f32(*shape: int) -> ir.MemRefType:
    return ir.MemRefType.get(list(shape), ir.F32Type.get())


def _shape(batch: int = 0, a_layout: Any = "mk", b_layout: Any = "kn", c_layout: Any = "mn",
           b_type: ir.MemRefType | None = None, m: int = M, k: int = K) -> MatmulShape:
    lead = [batch] if batch else []
    a = _f32(*lead, *((k, m) if a_layout == "km" else (m, k)))
    b = b_type or _f32(*lead, *((N, k) if b_layout == "nk" else (k, N)))
    c = _f32(*lead, *((N, m) if c_layout == "nm" else (m, N)))
    return MatmulShape(m, N, k, batch, a, b, c, a_layout, b_layout, c_layout)


def _window(x_shape: tuple[int, int, int, int] = (1, 11, 13, 16), geometry: ConvGeometry = GEOM,
            row_runs: bool = False) -> Window:
    return Window(geometry, _f32(*x_shape), row_runs=row_runs)


def _conv_shape(**kw: Any) -> MatmulShape:
    """The product of `GEOM`'s window: one row per output pixel, one column per tap and channel."""
    return _shape(m=GEOM.oh * GEOM.ow, k=GEOM.kh * GEOM.kw * 16, **kw)


def _raises(message: str) -> Any:
    return pytest.raises(ValueError, match=re.escape(message))


def test_a_plain_configuration_is_valid_and_derives_its_layout() -> None:
    cfg = KernelConfig("k_part", _shape(), BLK)
    assert not (cfg.a_km or cfg.b_nk or cfg.c_nm or cfg.batched)
    assert cfg.packs_a and cfg.packs_b and not cfg.stages_sums
    assert str(cfg.dtype) == "f32" and not cfg.shape.widened
    # A stored [m, k] goes through L x L transposes: its panels run a head and a whole block past kc.
    assert cfg.a_packed_type.shape == [2, 16 + 8, 6]
    assert cfg.b_packed_type.shape == [2, 16, 16]
    assert [str(t) for t in cfg.arg_types] == ["memref<37x29xf32>", "memref<29x45xf32>", "memref<37x45xf32>",
                                               "index"]


def test_narrow_operands_are_widened_into_packed_buffers_of_cs_type() -> None:
    bf16 = ir.BF16Type.get()
    shape = MatmulShape(M, N, K, 0, ir.MemRefType.get([M, K], bf16), ir.MemRefType.get([K, N], bf16), _f32(M, N))
    cfg = KernelConfig("k_part", shape, BLK)
    assert shape.widened and str(cfg.dtype) == "f32"
    assert str(cfg.a_packed_type.element_type) == str(cfg.b_packed_type.element_type) == "f32"
    with _raises("k_part: operands of bf16 widened to f32 need no window, and A and B packed"):
        KernelConfig("k_part", shape, dataclasses.replace(BLK, pack_a=False))
    with _raises("k_part: operands of bf16 widened to f32"):
        KernelConfig("k_part", shape, dataclasses.replace(BLK, pack_b=False))


def test_stored_layouts_change_the_packed_buffers() -> None:
    cfg = KernelConfig("k_part", _shape(a_layout="km", b_layout="nk", c_layout="nm"), BLK)
    assert cfg.a_km and cfg.b_nk and cfg.c_nm
    assert cfg.a_packed_type.shape == [2, 16, 6]
    assert cfg.b_packed_type.shape == [2, 16 + 8, 16]


def test_f64_packs_f64() -> None:
    f64 = ir.F64Type.get()
    shape = MatmulShape(8, 8, 8, 0, *(ir.MemRefType.get([8, 8], f64) for _ in range(3)))
    cfg = KernelConfig("k_part", shape, Blocking(mr=4, nv=2, lanes=4, mc=8, nc=8, kc=8))
    assert str(cfg.a_packed_type.element_type) == str(cfg.b_packed_type.element_type) == "f64"


def test_an_epilogue_adds_its_inputs_and_output_and_stages_the_sums() -> None:
    ep = Epilogue((("col", _f32(N)), ("scalar", _f32())), (EpilogueOp("t", "arith.addf", ("acc", "in0")),),
                  "t", _f32(M, N))
    cfg = KernelConfig("k_part", _shape(), BLK, epilogue=ep, zero_init=True)
    assert [str(t) for t in cfg.arg_types[3:]] == ["memref<45xf32>", "memref<f32>", "memref<37x45xf32>", "index"]
    assert cfg.stages_sums
    # On a C stored [n, m] the epilogue is applied on the transposed registers, without a scratch tile.
    assert not KernelConfig("k_part", _shape(c_layout="nm"), BLK, epilogue=ep).stages_sums


def test_a_window_reads_its_input_in_place() -> None:
    w = _window()
    cfg = KernelConfig("k_part", _conv_shape(), BLK, window=w)
    assert not cfg.packs_a and cfg.packs_b
    assert cfg.arg_types[0] == w.x_type
    # kc 32: two whole runs of 16; kc 8: half a run.
    for kc in (32, 8):
        KernelConfig("k_part", _conv_shape(), Blocking(mr=6, nv=2, lanes=8, mc=12, nc=32, kc=kc), window=w)


def test_a_prepacked_b_is_not_packed_again() -> None:
    packed = _f32(*packed_b_shape(K, N, BLK.nr))
    cfg = KernelConfig("k_part", _shape(b_type=packed), BLK, prepacked_b=True)
    assert not cfg.packs_b and cfg.packs_a


def test_a_window_needs_a_plain_matmul() -> None:
    with _raises("k_part: a window needs a plain matmul, kc 16 in whole runs or dividing the run of 16, and "
                 "adjacent kernel columns for row runs"):
        KernelConfig("k_part", _conv_shape(batch=2), BLK, window=_window())


def test_a_window_needs_kc_in_whole_runs_or_dividing_the_run() -> None:
    blk = Blocking(mr=6, nv=2, lanes=8, mc=12, nc=32, kc=24)
    with _raises("k_part: a window needs a plain matmul, kc 24 in whole runs or dividing the run of 16"):
        KernelConfig("k_part", _conv_shape(), blk, window=_window())


def test_row_runs_need_adjacent_kernel_columns() -> None:
    dilated = ConvGeometry(kh=3, kw=3, sh=1, sw=1, dh=2, dw=2, oh=8, ow=8)
    w = _window((1, 12, 12, 16), dilated, row_runs=True)
    with _raises("k_part: a window needs a plain matmul, kc 16 in whole runs or dividing the run of 48, and "
                 "adjacent kernel columns for row runs"):
        KernelConfig("k_part", _shape(m=64, k=144), BLK, window=w)


@pytest.mark.parametrize("layouts", [("km", "kn", "mn"), ("mk", "nk", "mn"), ("mk", "kn", "nm")])
def test_a_window_reads_a_as_stored_m_by_k(layouts: tuple[str, str, str]) -> None:
    a, b, c = layouts
    with _raises(f"k_part: a window reads its input in place as A[m, k]; layouts {a}/{b}/{c} are not for it"):
        KernelConfig("k_part", _conv_shape(a_layout=a, b_layout=b, c_layout=c), BLK, window=_window())


def test_a_prepacked_b_needs_a_plain_matmul() -> None:
    packed = _f32(*packed_b_shape(K, N, BLK.nr))
    with _raises("k_part: a prepacked B needs a plain matmul and the type of B packed for nr 16 (3, 29, 16), "
                 "got memref<3x29x16xf32>"):
        KernelConfig("k_part", _shape(batch=2, b_type=packed), BLK, prepacked_b=True)


@pytest.mark.parametrize("b_shape", [(K, N), packed_b_shape(K, N, 32), (3, K + 1, 16)])
def test_a_prepacked_b_needs_the_type_packed_for_nr(b_shape: tuple[int, ...]) -> None:
    b = _f32(*b_shape)
    with _raises(f"k_part: a prepacked B needs a plain matmul and the type of B packed for nr 16 (3, 29, 16), "
                 f"got {b}"):
        KernelConfig("k_part", _shape(b_type=b), BLK, prepacked_b=True)


def test_b_stored_n_by_k_is_read_through_its_packing() -> None:
    blk = Blocking(mr=6, nv=2, lanes=8, mc=12, nc=32, kc=16, pack_b=False)
    with _raises("k_part: a B stored [n, k] is read through its packing (pack_b)"):
        KernelConfig("k_part", _shape(b_layout="nk"), blk)
    KernelConfig("k_part", _shape(b_layout="kn"), blk)  # B stored [k, n] is read in place


def test_validate_checks_in_order() -> None:
    """A window on a batched product with an A stored [k, m] names the first check that fails."""
    with _raises("k_part: a window needs a plain matmul"):
        KernelConfig("k_part", _conv_shape(batch=2, a_layout="km"), BLK, window=_window())


def test_build_matmul_kernel_raises_before_adding_anything() -> None:
    module = ir.Module.create()
    blk = Blocking(mr=6, nv=2, lanes=8, mc=12, nc=32, kc=16, pack_b=False)
    with _raises("mm_part: a B stored [n, k] is read through its packing (pack_b)"):
        build_matmul_kernel(module, "mm", _shape(b_layout="nk"), blk)
    assert not list(module.body.operations)
