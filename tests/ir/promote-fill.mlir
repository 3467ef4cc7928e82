// Pass promote folds the fill that initialises a contraction's accumulator into the staged C tile: the
// outermost level holding C (sram on example/npu) fills its tile with the constant instead of reading C
// from main memory, and the fill in main memory goes. When that level walks k in several steps (the
// KSTEPS run, sram tiles of k 32), only the first k step fills; the later ones read back the partial sums.
// RUN: %pbsdk opt %s --spec npu -p promote --split-input-file | filecheck %s
// RUN: %pbsdk opt %s --target template -p promote --split-input-file \
// RUN:   --options 'tiles={"sram": [64, 64, 32], "spm": [32, 32, 32]}' | filecheck %s --check-prefix=KSTEPS

// CHECK-LABEL: func.func @mm(
// CHECK-SAME:      %[[A:.*]]: memref<64x64xbf16>, %[[B:.*]]: memref<64x64xbf16>, %[[C:.*]]: memref<64x64xf32>)
// CHECK-NOT:     linalg.fill
// CHECK-NEXT:    call @__pbsdk_promoted_0(%[[A]], %[[B]], %[[C]])
// CHECK-LABEL: func.func private @__pbsdk_promoted_0(
// CHECK:         %[[C1:.*]] = memref.alloc() {{.*}} : memref<64x64xf32, 1>
// CHECK:         %[[ZERO:.*]] = arith.constant 0.000000e+00 : f32
// CHECK-NEXT:    linalg.fill ins(%[[ZERO]] : f32) outs(%[[C1]] : memref<64x64xf32, 1>)
// CHECK-NOT:     pbsdk.dma = "dram->sram"} ins(%[[C]]
// CHECK:         linalg.copy {pbsdk.dma = "sram->dram"} ins(%[[C1]] : memref<64x64xf32, 1>) outs(%[[C]] :

// KSTEPS-LABEL: func.func private @__pbsdk_promoted_0(
// KSTEPS-SAME:      %{{.*}}: memref<64x64xbf16>, %{{.*}}: memref<64x64xbf16>, %[[C:.*]]: memref<64x64xf32>)
// KSTEPS:         %[[C0:.*]] = arith.constant 0 : index
// KSTEPS:         %[[C1:.*]] = memref.alloc() {{.*}} : memref<64x64xf32, 1>
// KSTEPS:         scf.for %[[K:.*]] = %[[C0]] to
// KSTEPS:           %[[ZERO:.*]] = arith.constant 0.000000e+00 : f32
// KSTEPS-NEXT:      %[[FIRST:.*]] = arith.cmpi eq, %[[K]], %[[C0]] : index
// KSTEPS-NEXT:      scf.if %[[FIRST]] {
// KSTEPS-NEXT:        linalg.fill ins(%[[ZERO]] : f32) outs(%[[C1]] : memref<64x64xf32, 1>)
// KSTEPS-NEXT:      } else {
// KSTEPS-NEXT:        linalg.copy {pbsdk.dma = "dram->sram"} ins(%[[C]] : memref<64x64xf32>) outs(%[[C1]] :
// KSTEPS:           linalg.copy {pbsdk.dma = "sram->dram"} ins(%[[C1]] : memref<64x64xf32, 1>) outs(%[[C]] :
func.func @mm(%a: memref<64x64xbf16>, %b: memref<64x64xbf16>, %c: memref<64x64xf32>) {
  %zero = arith.constant 0.0 : f32
  linalg.fill ins(%zero : f32) outs(%c : memref<64x64xf32>)
  linalg.matmul ins(%a, %b : memref<64x64xbf16>, memref<64x64xbf16>) outs(%c : memref<64x64xf32>)
  return
}

// -----

// C is read between the fill and the matmul: the fill stays and C is copied in.
// CHECK-LABEL: func.func @read_between(
// CHECK:         %[[ZERO:.*]] = arith.constant 0.000000e+00 : f32
// CHECK-NEXT:    linalg.generic {{.*}} ins(%[[ZERO]] : f32) outs(%arg2 : memref<64x64xf32>)
// CHECK:         memref.copy
// CHECK:         call @__pbsdk_promoted_0
// CHECK-LABEL: func.func private @__pbsdk_promoted_0(
// CHECK:         linalg.copy {pbsdk.dma = "dram->sram"} ins(%arg2 : memref<64x64xf32>)
func.func @read_between(%a: memref<64x64xbf16>, %b: memref<64x64xbf16>, %c: memref<64x64xf32>,
                        %d: memref<64x64xf32>) {
  %zero = arith.constant 0.0 : f32
  linalg.fill ins(%zero : f32) outs(%c : memref<64x64xf32>)
  memref.copy %c, %d : memref<64x64xf32> to memref<64x64xf32>
  linalg.matmul ins(%a, %b : memref<64x64xbf16>, memref<64x64xbf16>) outs(%c : memref<64x64xf32>)
  return
}

// -----

// A fill of a value that is not a constant (an argument): not folded.
// CHECK-LABEL: func.func @not_constant(
// CHECK-NEXT:    linalg.generic {{.*}} ins(%arg3 : f32) outs(%arg2 : memref<64x64xf32>)
// CHECK:         call @__pbsdk_promoted_0
// CHECK-LABEL: func.func private @__pbsdk_promoted_0(
// CHECK:         linalg.copy {pbsdk.dma = "dram->sram"} ins(%arg2 : memref<64x64xf32>)
func.func @not_constant(%a: memref<64x64xbf16>, %b: memref<64x64xbf16>, %c: memref<64x64xf32>, %v: f32) {
  linalg.fill ins(%v : f32) outs(%c : memref<64x64xf32>)
  linalg.matmul ins(%a, %b : memref<64x64xbf16>, memref<64x64xbf16>) outs(%c : memref<64x64xf32>)
  return
}

// -----

// Accumulating into C as the caller gave it (no fill): C is read in.
// CHECK-LABEL: func.func private @__pbsdk_promoted_0(
// CHECK:         linalg.copy {pbsdk.dma = "dram->sram"} ins(%arg2 : memref<64x64xf32>)
func.func @accumulate(%a: memref<64x64xbf16>, %b: memref<64x64xbf16>, %c: memref<64x64xf32>) {
  linalg.matmul ins(%a, %b : memref<64x64xbf16>, memref<64x64xbf16>) outs(%c : memref<64x64xf32>)
  return
}
