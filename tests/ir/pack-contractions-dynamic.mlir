// Pass pack-contractions on a matmul whose row count is dynamic (the others static): one packed kernel per
// size bucket of the dynamic plan (`pbsdk.core.plan.dynamic`), each planned at its bucket's largest row
// count, with the rows read from C at run time; a dispatch function picks the bucket by C's row count. A
// dynamic n or k is read from C or A at run time too, as is a dynamic batch (every operand's: the kernel
// loops over C's batch dimension).
// RUN: %pbsdk opt %s --split-input-file --target cpu --spec intel/xeon-avx512 -p pack-contractions | filecheck %s

// The zero fill goes (the kernels store their first k block).
// CHECK-LABEL: func.func @mm(
// CHECK-SAME:      %[[A:[^:]*]]: memref<?x64xf32>, %[[B:[^:]*]]: memref<64x48xf32>, %[[C:[^:]*]]: memref<?x48xf32>)
// CHECK-NOT:     linalg.
// CHECK:         call @__pbsdk_mm0(%[[A]], %[[B]], %[[C]])
// A bucket's part reads the row count from C.
// CHECK-LABEL: func.func @__pbsdk_mm0_m0_part(
// CHECK:         memref.dim %{{.*}}, %{{.*}} : memref<?x48xf32>
// CHECK-LABEL: func.func private @__pbsdk_mm0(
// CHECK-NEXT:    %[[C0:.*]] = arith.constant 0 : index
// CHECK-NEXT:    %[[M:.*]] = memref.dim %{{.*}}, %[[C0]] : memref<?x48xf32>
// CHECK-NEXT:    %[[ONE:.*]] = arith.constant 1 : index
// CHECK-NEXT:    %[[SMALL:.*]] = arith.cmpi sle, %[[M]], %[[ONE]] : index
// CHECK-NEXT:    scf.if %[[SMALL]] {
// CHECK-NEXT:      func.call @__pbsdk_mm0_m0(
// CHECK-NEXT:    } else {
// CHECK:           arith.cmpi sle, %[[M]], %{{.*}} : index
// CHECK:           func.call @__pbsdk_mm0_m1(
func.func @mm(%a: memref<?x64xf32>, %b: memref<64x48xf32>, %c: memref<?x48xf32>) {
  %z = arith.constant 0.0 : f32
  linalg.fill ins(%z : f32) outs(%c : memref<?x48xf32>)
  linalg.matmul ins(%a, %b : memref<?x64xf32>, memref<64x48xf32>) outs(%c : memref<?x48xf32>)
  return
}

// -----

// A dynamic reduction size (a decoder's attention over its cache: P @ V) and a dynamic column count (its
// scores, Q @ K^T): one kernel of the static rows, the dynamic sizes read from A and C at run time.
// CHECK-LABEL: func.func @dynamic_k(
// CHECK:         call @__pbsdk_mm0(
// CHECK-LABEL: func.func @__pbsdk_mm0_m0_part(
// CHECK-SAME:      %[[A:[^:]*]]: memref<8x?xf32>, %{{[^:]*}}: memref<?x48xf32>, %[[C:[^:]*]]: memref<8x48xf32>
// CHECK:         %[[K:.*]] = memref.dim %[[A]], %{{.*}} : memref<8x?xf32>
// CHECK:         scf.for %{{.*}} = %{{.*}} to %[[K]] step
// One bucket (the rows are static): no dispatch.
// CHECK-LABEL: func.func private @__pbsdk_mm0(
// CHECK-NEXT:    call @__pbsdk_mm0_m0(
// CHECK-NEXT:    return
func.func @dynamic_k(%a: memref<8x?xf32>, %b: memref<?x48xf32>, %c: memref<8x48xf32>) {
  linalg.matmul ins(%a, %b : memref<8x?xf32>, memref<?x48xf32>) outs(%c : memref<8x48xf32>)
  return
}

// -----

// CHECK-LABEL: func.func @dynamic_n(
// CHECK:         call @__pbsdk_mm0(
// CHECK-LABEL: func.func @__pbsdk_mm0_m0_part(
// CHECK-SAME:      %{{[^:]*}}: memref<8x64xf32>, %{{[^:]*}}: memref<64x?xf32>, %[[C:[^:]*]]: memref<8x?xf32>
// CHECK:         memref.dim %[[C]], %{{.*}} : memref<8x?xf32>
func.func @dynamic_n(%a: memref<8x64xf32>, %b: memref<64x?xf32>, %c: memref<8x?xf32>) {
  linalg.matmul ins(%a, %b : memref<8x64xf32>, memref<64x?xf32>) outs(%c : memref<8x?xf32>)
  return
}

// -----

// A dynamic batch (attention heads times a batch of sequences): the kernels loop over C's batch dimension,
// read once at run time.
// CHECK-LABEL: func.func @dynamic_batch(
// CHECK-NOT:     linalg.batch_matmul
// CHECK:         call @__pbsdk_mm{{[0-9]+}}(
// CHECK:       func.func @__pbsdk_mm{{[0-9]+}}_m0_part(%{{.*}}: memref<?x8x64xf32>, %{{.*}}: memref<?x64x48xf32>, %[[C:[^:]*]]: memref<?x8x48xf32>, %{{.*}}: index)
// CHECK:         memref.dim %[[C]], %{{.*}} : memref<?x8x48xf32>
func.func @dynamic_batch(%a: memref<?x8x64xf32>, %b: memref<?x64x48xf32>, %c: memref<?x8x48xf32>) {
  linalg.batch_matmul ins(%a, %b : memref<?x8x64xf32>, memref<?x64x48xf32>) outs(%c : memref<?x8x48xf32>)
  return
}

// -----

// Two products of one shape (a mixture of experts' groups, each with its own weight): the kernels built for
// them are the same, so they are merged into one (leaves first, then their callers) and both calls call it.
// CHECK-LABEL: func.func @experts(
// CHECK:         call @__pbsdk_mm0(%{{.*}}, %{{.*}}, %{{.*}}) : (memref<?x64xf32>, memref<64x48xf32>, memref<?x48xf32>)
// CHECK:         call @__pbsdk_mm0(%{{.*}}, %{{.*}}, %{{.*}}) : (memref<?x64xf32>, memref<64x48xf32>, memref<?x48xf32>)
// CHECK-NOT:     func.func private @__pbsdk_mm1(
// CHECK-NOT:     func.func @__pbsdk_mm1_
func.func @experts(%a0: memref<?x64xf32>, %b0: memref<64x48xf32>, %c0: memref<?x48xf32>,
                   %a1: memref<?x64xf32>, %b1: memref<64x48xf32>, %c1: memref<?x48xf32>) {
  %z = arith.constant 0.0 : f32
  linalg.fill ins(%z : f32) outs(%c0 : memref<?x48xf32>)
  linalg.matmul ins(%a0, %b0 : memref<?x64xf32>, memref<64x48xf32>) outs(%c0 : memref<?x48xf32>)
  linalg.fill ins(%z : f32) outs(%c1 : memref<?x48xf32>)
  linalg.matmul ins(%a1, %b1 : memref<?x64xf32>, memref<64x48xf32>) outs(%c1 : memref<?x48xf32>)
  return
}
