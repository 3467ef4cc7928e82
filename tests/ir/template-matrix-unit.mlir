// The template target's stage matrix-unit (hook matrix_unit_op): every linalg.generic marked
// pbsdk.matrix_unit (with pbsdk.unit_operand / pbsdk.unit_accumulator naming the unit's dtypes: what
// promote and promote-vector leave) becomes a call to a private function @__pbsdk_<unit>_<N>, one per
// distinct signature, that the hook built. The emulation's hook counts one unit op (the global
// @__pbsdk_counters, slot of the counter matrix_unit:<unit>) and computes C += A x B at the unit's shape,
// each operand rounded to the unit's operand dtype and accumulated in its accumulator dtype. The spec is
// the template's default, example/npu: unit mxu, 32x32x32, bf16->f32 or f16->f32; space 2 = spm.
// RUN: %pbsdk opt %s --target template -p matrix-unit | filecheck %s

// CHECK:       memref.global @__pbsdk_counters : memref<64xi64> = dense<0>
// CHECK-LABEL: func.func @pieces(
// CHECK-SAME:      %[[A:[^:]*]]: memref<32x32xbf16, 2>, %[[B:[^:]*]]: memref<32x32xbf16, 2>, %[[C:[^:]*]]: memref<32x32xf32, 2>, %[[X:[^:]*]]: memref<32x32xf32, 2>, %[[Y:[^:]*]]: memref<32x32xf32, 2>)
// Two ops of one signature share one function; f32 operands on the f16 unit get another.
// CHECK-NEXT:    call @__pbsdk_mxu_0(%[[A]], %[[B]], %[[C]]) : (memref<32x32xbf16, 2>, memref<32x32xbf16, 2>, memref<32x32xf32, 2>) -> ()
// CHECK-NEXT:    call @__pbsdk_mxu_0(%[[A]], %[[B]], %[[C]])
// CHECK-NEXT:    call @__pbsdk_mxu_1(%[[X]], %[[Y]], %[[C]]) : (memref<32x32xf32, 2>, memref<32x32xf32, 2>, memref<32x32xf32, 2>) -> ()
// An op without the mark is not the stage's.
// CHECK-NEXT:    linalg.generic {{.*}} attrs = {pbsdk.compute = "vector"} {
// CHECK-NOT:     pbsdk.matrix_unit
// CHECK-LABEL: func.func private @__pbsdk_mxu_0(
// CHECK-SAME:      %[[A0:[^:]*]]: memref<32x32xbf16, 2>, %[[B0:[^:]*]]: memref<32x32xbf16, 2>, %[[C0:[^:]*]]: memref<32x32xf32, 2>) {
// CHECK-NEXT:    %[[ONE:.*]] = arith.constant 1 : i64
// CHECK-NEXT:    %[[G:.*]] = memref.get_global @__pbsdk_counters : memref<64xi64>
// CHECK-NEXT:    %[[SLOT:.*]] = arith.constant 0 : index
// CHECK-NEXT:    %[[OLD:.*]] = memref.load %[[G]][%[[SLOT]]] : memref<64xi64>
// CHECK-NEXT:    %[[NEW:.*]] = arith.addi %[[OLD]], %[[ONE]] : i64
// CHECK-NEXT:    memref.store %[[NEW]], %[[G]][%[[SLOT]]] : memref<64xi64>
// CHECK-NEXT:    linalg.generic {{{.*}}iterator_types = ["parallel", "parallel", "reduction"]} ins(%[[A0]], %[[B0]] : {{.*}}) outs(%[[C0]] : memref<32x32xf32, 2>) {
// CHECK-NEXT:    ^bb0(%[[P:.*]]: bf16, %[[Q:.*]]: bf16, %[[ACC:.*]]: f32):
// CHECK-NEXT:      %[[PE:.*]] = arith.extf %[[P]] : bf16 to f32
// CHECK-NEXT:      %[[QE:.*]] = arith.extf %[[Q]] : bf16 to f32
// CHECK-NEXT:      %[[M:.*]] = arith.mulf %[[PE]], %[[QE]] : f32
// CHECK-NEXT:      %[[S:.*]] = arith.addf %[[ACC]], %[[M]] : f32
// CHECK-NEXT:      linalg.yield %[[S]] : f32
// CHECK-NEXT:    }
// CHECK-NEXT:    return
// The same counter (matrix_unit:mxu, slot 0); the f32 operands rounded to f16 before the product.
// CHECK-LABEL: func.func private @__pbsdk_mxu_1(
// CHECK:         memref.get_global @__pbsdk_counters
// CHECK-NEXT:    %[[SLOT1:.*]] = arith.constant 0 : index
// CHECK:         linalg.generic
// CHECK-NEXT:    ^bb0(%[[P1:.*]]: f32, %[[Q1:.*]]: f32, %{{.*}}: f32):
// CHECK-NEXT:      %[[PR:.*]] = arith.truncf %[[P1]] : f32 to f16
// CHECK-NEXT:      %[[PX:.*]] = arith.extf %[[PR]] : f16 to f32
// CHECK-NEXT:      %[[QR:.*]] = arith.truncf %[[Q1]] : f32 to f16
// CHECK-NEXT:      %[[QX:.*]] = arith.extf %[[QR]] : f16 to f32
// CHECK-NEXT:      arith.mulf %[[PX]], %[[QX]] : f32
#a = affine_map<(m, n, k) -> (m, k)>
#b = affine_map<(m, n, k) -> (k, n)>
#c = affine_map<(m, n, k) -> (m, n)>
#e = affine_map<(m, n) -> (m, n)>
func.func @pieces(%a: memref<32x32xbf16, 2>, %b: memref<32x32xbf16, 2>, %c: memref<32x32xf32, 2>,
                  %x: memref<32x32xf32, 2>, %y: memref<32x32xf32, 2>) {
  linalg.generic {indexing_maps = [#a, #b, #c], iterator_types = ["parallel", "parallel", "reduction"]}
      ins(%a, %b : memref<32x32xbf16, 2>, memref<32x32xbf16, 2>) outs(%c : memref<32x32xf32, 2>)
      attrs = {pbsdk.matrix_unit = "mxu", pbsdk.unit_operand = "bf16", pbsdk.unit_accumulator = "f32"} {
  ^bb0(%p: bf16, %q: bf16, %acc: f32):
    %pe = arith.extf %p : bf16 to f32
    %qe = arith.extf %q : bf16 to f32
    %m = arith.mulf %pe, %qe : f32
    %s = arith.addf %acc, %m : f32
    linalg.yield %s : f32
  }
  linalg.generic {indexing_maps = [#a, #b, #c], iterator_types = ["parallel", "parallel", "reduction"]}
      ins(%a, %b : memref<32x32xbf16, 2>, memref<32x32xbf16, 2>) outs(%c : memref<32x32xf32, 2>)
      attrs = {pbsdk.matrix_unit = "mxu", pbsdk.unit_operand = "bf16", pbsdk.unit_accumulator = "f32"} {
  ^bb0(%p: bf16, %q: bf16, %acc: f32):
    %pe = arith.extf %p : bf16 to f32
    %qe = arith.extf %q : bf16 to f32
    %m = arith.mulf %pe, %qe : f32
    %s = arith.addf %acc, %m : f32
    linalg.yield %s : f32
  }
  linalg.generic {indexing_maps = [#a, #b, #c], iterator_types = ["parallel", "parallel", "reduction"]}
      ins(%x, %y : memref<32x32xf32, 2>, memref<32x32xf32, 2>) outs(%c : memref<32x32xf32, 2>)
      attrs = {pbsdk.matrix_unit = "mxu", pbsdk.unit_operand = "f16", pbsdk.unit_accumulator = "f32"} {
  ^bb0(%p: f32, %q: f32, %acc: f32):
    %m = arith.mulf %p, %q : f32
    %s = arith.addf %acc, %m : f32
    linalg.yield %s : f32
  }
  linalg.generic {indexing_maps = [#e, #e], iterator_types = ["parallel", "parallel"]}
      ins(%x : memref<32x32xf32, 2>) outs(%y : memref<32x32xf32, 2>) attrs = {pbsdk.compute = "vector"} {
  ^bb0(%p: f32, %o: f32):
    %n = arith.negf %p : f32
    linalg.yield %n : f32
  }
  return
}
