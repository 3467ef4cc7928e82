// The template target's stage matrix-unit refuses a unit op it cannot map onto the spec's units: the error
// names the stage, the op and what is wrong (example/npu has mxu bf16->f32, f16->f32 and i8->i32).
// RUN: not %pbsdk opt %s --split-input-file --target template -p matrix-unit 2>&1 | filecheck %s

// A unit the spec does not have.
// CHECK: pbsdk: error: in stage 'matrix-unit', op 'linalg.generic': spec 'example/npu' has no matrix unit tpu bf16->f32 (its units: mxu bf16->f32, mxu f16->f32, mxu i8->i32)
#a = affine_map<(m, n, k) -> (m, k)>
#b = affine_map<(m, n, k) -> (k, n)>
#c = affine_map<(m, n, k) -> (m, n)>
func.func @unknown_unit(%a: memref<32x32xbf16, 2>, %b: memref<32x32xbf16, 2>, %c: memref<32x32xf32, 2>) {
  linalg.generic {indexing_maps = [#a, #b, #c], iterator_types = ["parallel", "parallel", "reduction"]}
      ins(%a, %b : memref<32x32xbf16, 2>, memref<32x32xbf16, 2>) outs(%c : memref<32x32xf32, 2>)
      attrs = {pbsdk.matrix_unit = "tpu", pbsdk.unit_operand = "bf16", pbsdk.unit_accumulator = "f32"} {
  ^bb0(%x: bf16, %y: bf16, %acc: f32):
    %xe = arith.extf %x : bf16 to f32
    %ye = arith.extf %y : bf16 to f32
    %p = arith.mulf %xe, %ye : f32
    %s = arith.addf %acc, %p : f32
    linalg.yield %s : f32
  }
  return
}

// -----

// A known unit with dtypes it does not take.
// CHECK: // -----
// CHECK-NEXT: pbsdk: error: in stage 'matrix-unit', op 'linalg.generic': spec 'example/npu' has no matrix unit mxu f32->f32 (its units: mxu bf16->f32, mxu f16->f32, mxu i8->i32)
#a = affine_map<(m, n, k) -> (m, k)>
#b = affine_map<(m, n, k) -> (k, n)>
#c = affine_map<(m, n, k) -> (m, n)>
func.func @wrong_dtypes(%a: memref<32x32xf32, 2>, %b: memref<32x32xf32, 2>, %c: memref<32x32xf32, 2>) {
  linalg.generic {indexing_maps = [#a, #b, #c], iterator_types = ["parallel", "parallel", "reduction"]}
      ins(%a, %b : memref<32x32xf32, 2>, memref<32x32xf32, 2>) outs(%c : memref<32x32xf32, 2>)
      attrs = {pbsdk.matrix_unit = "mxu", pbsdk.unit_operand = "f32", pbsdk.unit_accumulator = "f32"} {
  ^bb0(%x: f32, %y: f32, %acc: f32):
    %p = arith.mulf %x, %y : f32
    %s = arith.addf %acc, %p : f32
    linalg.yield %s : f32
  }
  return
}

// -----

// The unit's name without its dtypes.
// CHECK: // -----
// CHECK-NEXT: pbsdk: error: in stage 'matrix-unit', op 'linalg.generic': op marked pbsdk.matrix_unit = "mxu" lacks pbsdk.unit_operand or pbsdk.unit_accumulator (the unit's operand and accumulator dtypes)
#a = affine_map<(m, n, k) -> (m, k)>
#b = affine_map<(m, n, k) -> (k, n)>
#c = affine_map<(m, n, k) -> (m, n)>
func.func @no_dtypes(%a: memref<32x32xbf16, 2>, %b: memref<32x32xbf16, 2>, %c: memref<32x32xf32, 2>) {
  linalg.generic {indexing_maps = [#a, #b, #c], iterator_types = ["parallel", "parallel", "reduction"]}
      ins(%a, %b : memref<32x32xbf16, 2>, memref<32x32xbf16, 2>) outs(%c : memref<32x32xf32, 2>)
      attrs = {pbsdk.matrix_unit = "mxu"} {
  ^bb0(%x: bf16, %y: bf16, %acc: f32):
    %xe = arith.extf %x : bf16 to f32
    %ye = arith.extf %y : bf16 to f32
    %p = arith.mulf %xe, %ye : f32
    %s = arith.addf %acc, %p : f32
    linalg.yield %s : f32
  }
  return
}

// -----

// A unit mark on an op that is not C += A x B on three memrefs.
// CHECK: // -----
// CHECK-NEXT: pbsdk: error: in stage 'matrix-unit', op 'linalg.generic': a matrix-unit op (mxu) computes C += A x B on three memrefs; this one has operands memref<32x32xf32, 2>, memref<32x32xf32, 2>
#e = affine_map<(m, n) -> (m, n)>
func.func @two_operands(%a: memref<32x32xf32, 2>, %c: memref<32x32xf32, 2>) {
  linalg.generic {indexing_maps = [#e, #e], iterator_types = ["parallel", "parallel"]}
      ins(%a : memref<32x32xf32, 2>) outs(%c : memref<32x32xf32, 2>)
      attrs = {pbsdk.matrix_unit = "mxu", pbsdk.unit_operand = "bf16", pbsdk.unit_accumulator = "f32"} {
  ^bb0(%x: f32, %acc: f32):
    linalg.yield %x : f32
  }
  return
}
