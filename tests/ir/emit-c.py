# pbsdk.core.emit_c: the tiled form lowered to loops, printed as portable C (one kernel per chunk).
# RUN: %python %s | filecheck %s
from mlir import ir

from pbsdk.core.emit_c import CEmitError, prepare, print_c


def show(title: str, text: str, **kwargs: object) -> None:
    print(f"// ----- {title}")
    with ir.Context():
        module = ir.Module.parse(text)
        prepare(module)
        try:
            source = print_c(module, **kwargs)  # type: ignore[arg-type]
        except CEmitError as err:
            print(f"error: {err}")
            return
    print(source[source.index("pb_alloc(size_t") :].split("\n}\n", 1)[1])  # what follows the prologue


# A bias add on a tile staged in a scratchpad array: the DMA is a call of the chip's intrinsic (declared
# from its MLIR type when no header is given), views are pointer arithmetic, a counter is a global.
show("tile", """
memref.global @__pbsdk_counters : memref<4xi64> = dense<0>
memref.global "private" @npu_spm : memref<4096xi8> {alignment = 64 : i64}
func.func private @npu_dma(index, index, index)
func.func @main(%x: memref<8x16xf32>, %b: memref<16xf32>, %y: memref<8x16xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c2 = arith.constant 2 : index
  %c4 = arith.constant 4 : index
  %c8 = arith.constant 8 : index
  %c16 = arith.constant 16 : index
  %spm = memref.get_global @npu_spm : memref<4096xi8>
  %tile = memref.view %spm[%c0][] : memref<4096xi8> to memref<2x16xf32>
  scf.for %r = %c0 to %c8 step %c2 {
    %rows = memref.subview %x[%r, 0] [2, 16] [1, 1] : memref<8x16xf32> to memref<2x16xf32, strided<[16, 1], offset: ?>>
    %src = memref.extract_aligned_pointer_as_index %x : memref<8x16xf32> -> index
    %dst = memref.extract_aligned_pointer_as_index %tile : memref<2x16xf32> -> index
    %n = arith.constant 128 : index
    func.call @npu_dma(%dst, %src, %n) : (index, index, index) -> ()
    %counters = memref.get_global @__pbsdk_counters : memref<4xi64>
    %old = memref.load %counters[%c1] : memref<4xi64>
    %inc = arith.constant 128 : i64
    %new = arith.addi %old, %inc : i64
    memref.store %new, %counters[%c1] : memref<4xi64>
    scf.for %i = %c0 to %c2 step %c1 {
      scf.for %j = %c0 to %c16 step %c1 {
        %v = memref.load %rows[%i, %j] : memref<2x16xf32, strided<[16, 1], offset: ?>>
        %w = memref.load %b[%j] : memref<16xf32>
        %s = arith.addf %v, %w : f32
        %o = arith.addi %r, %i : index
        memref.store %s, %y[%o, %j] : memref<8x16xf32>
      }
    }
  }
  return
}
""")
# CHECK-LABEL: ----- tile
# CHECK:       int64_t __pbsdk_counters[4] = {0};
# CHECK-NEXT:  static _Alignas(64) int8_t npu_spm[4096];
# CHECK-NEXT:  void npu_dma(intptr_t p0, intptr_t p1, intptr_t p2);
# CHECK:       void pbsdk_main(float *arg0, float *arg1, float *arg2) {
# CHECK:         for (intptr_t [[R:v[0-9]+]] = 0; [[R]] < 8; [[R]] += 2) {
# CHECK:           npu_dma([[DST:v[0-9]+]], [[SRC:v[0-9]+]], 128);
# CHECK:           int64_t [[OLD:v[0-9]+]] = __pbsdk_counters[1];
# CHECK-NEXT:      int64_t [[NEW:v[0-9]+]] = (int64_t)((uint64_t)[[OLD]] + (uint64_t)128);
# CHECK-NEXT:      __pbsdk_counters[1] = [[NEW]];
# CHECK:           for (intptr_t [[I:v[0-9]+]] = 0; [[I]] < 2; [[I]] += 1) {
# CHECK-NEXT:        for (intptr_t [[J:v[0-9]+]] = 0; [[J]] < 16; [[J]] += 1) {
# CHECK-NEXT:          float [[X:v[0-9]+]] = arg0[{{.*}}[[I]] * 16 + [[J]]];
# CHECK-NEXT:          float [[B:v[0-9]+]] = arg1[[[J]]];
# CHECK-NEXT:          float [[S:v[0-9]+]] = [[X]] + [[B]];
# CHECK-NEXT:          intptr_t [[O:v[0-9]+]] = [[R]] + [[I]];
# CHECK-NEXT:          arg2[[[O]] * 16 + [[J]]] = [[S]];

# bf16 in memory is uint16_t; its arithmetic is float rounded to bf16 after each op; a loop-carried value
# is a variable assigned at the end of each iteration; scf.if is if/else; an intrinsic's header replaces
# the declarations.
show("bf16-sum", """
func.func private @npu_fence()
func.func @rowsum(%x: memref<4x8xbf16>, %y: memref<4xbf16>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c4 = arith.constant 4 : index
  %c8 = arith.constant 8 : index
  %zero = arith.constant 0.0 : bf16
  scf.for %i = %c0 to %c4 step %c1 {
    %sum = scf.for %j = %c0 to %c8 step %c1 iter_args(%acc = %zero) -> (bf16) {
      %v = memref.load %x[%i, %j] : memref<4x8xbf16>
      %a = arith.addf %acc, %v : bf16
      scf.yield %a : bf16
    }
    %neg = arith.cmpf olt, %sum, %zero : bf16
    scf.if %neg {
      memref.store %zero, %y[%i] : memref<4xbf16>
    } else {
      memref.store %sum, %y[%i] : memref<4xbf16>
    }
  }
  func.call @npu_fence() : () -> ()
  return
}
""", includes=["npu_intrinsics.h"])
# CHECK-LABEL: ----- bf16-sum
# CHECK-NOT:   npu_fence(void);
# CHECK:       void rowsum(uint16_t *arg0, uint16_t *arg1) {
# CHECK:         float [[ACC:v[0-9]+]] = 0.0f;
# CHECK-NEXT:    for (intptr_t [[J:v[0-9]+]] = 0; [[J]] < 8; [[J]] += 1) {
# CHECK-NEXT:      float [[V:v[0-9]+]] = pb_bf16_to_f32(arg0[{{.*}}[[J]]]);
# CHECK-NEXT:      float [[A:v[0-9]+]] = pb_round_bf16([[ACC]] + [[V]]);
# CHECK-NEXT:      [[ACC]] = [[A]];
# CHECK-NEXT:    }
# CHECK-NEXT:    bool [[NEG:v[0-9]+]] = ([[ACC]] < 0.0f);
# CHECK-NEXT:    if ([[NEG]]) {
# CHECK-NEXT:      arg1[[[I:v[0-9]+]]] = pb_f32_to_bf16(0.0f);
# CHECK-NEXT:    } else {
# CHECK-NEXT:      arg1[[[I]]] = pb_f32_to_bf16([[ACC]]);
# CHECK-NEXT:    }
# CHECK:       npu_fence();

# An op outside the printer's set is refused, named.
show("reject", """
func.func @f(%x: memref<4xf32>, %y: memref<4xf32>) {
  %c0 = arith.constant 0 : index
  %v = vector.load %x[%c0] : memref<4xf32>, vector<4xf32>
  vector.store %v, %y[%c0] : memref<4xf32>, vector<4xf32>
  return
}
""")
# CHECK-LABEL: ----- reject
# CHECK:       error: in op 'vector.load': the C printer does not know op 'vector.load'
