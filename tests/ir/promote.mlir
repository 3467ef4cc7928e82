// Pass promote (core; the template target's first stage): each contraction is tiled by its plan's
// memory-level tiles and its tiles are staged in one buffer per software-managed level (memory space i =
// spec.memory[i]: example/npu has dram 0, sram 1, spm 2) with explicit copies marked pbsdk.dma; the
// innermost compute is one op of exactly the matrix unit's 32x32x32, marked pbsdk.matrix_unit. The spm
// tiles' m and n loops run as an scf.forall over the 4 cores (2 x 2 parts, pbsdk.compute_level = "core")
// whose body allocates each core's spm buffers; the device-wide sram buffers stay outside it
// (promote-parallel.mlir covers the split itself).
// RUN: %pbsdk opt %s --spec npu -p promote | filecheck %s
// RUN: %pbsdk opt %s --target template -p promote | filecheck %s
// The template target's `tiles` option overrides the plan's tile of a level (m 33 rounds up to 64).
// RUN: %pbsdk opt %s --target template -p promote --options 'tiles={"spm": [33, 32, 32]}' \
// RUN:   | filecheck %s --check-prefix=TILES
// A spec with no software-managed level besides main memory (caches only): nothing to promote into.
// RUN: %pbsdk opt %s --spec intel/xeon-avx512 -p promote | filecheck %s --check-prefix=CACHES

// CHECK-LABEL: func.func @mm(
// CHECK-SAME:      %[[A:.*]]: memref<64x64xbf16>, %[[B:.*]]: memref<64x64xbf16>, %[[C:.*]]: memref<64x64xf32>)
// CHECK-NEXT:    call @__pbsdk_promoted_0(%[[A]], %[[B]], %[[C]])
// CHECK-NEXT:    return
// CHECK-LABEL: func.func private @__pbsdk_promoted_0(
// CHECK-DAG:     %[[A1:.*]] = memref.alloc() {{.*}} : memref<64x64xbf16, 1>
// CHECK-DAG:     %[[C1:.*]] = memref.alloc() {{.*}} : memref<64x64xf32, 1>
// CHECK:         linalg.copy {pbsdk.dma = "dram->sram"} ins(%[[A]] : memref<64x64xbf16>) outs(%[[A1]] :
// CHECK:         scf.forall (%{{.*}}, %{{.*}}) in (2, 2) {
// CHECK-NEXT:      %[[A2:.*]] = memref.alloc() {{.*}} : memref<32x64xbf16, 2>
// CHECK-NEXT:      %[[B2:.*]] = memref.alloc() {{.*}} : memref<64x32xbf16, 2>
// CHECK-NEXT:      %[[C2:.*]] = memref.alloc() {{.*}} : memref<32x32xf32, 2>
// CHECK:           linalg.copy {pbsdk.dma = "sram->spm"} ins(%{{.*}}) outs(%[[A2]] :
// CHECK:           scf.for
// CHECK:             linalg.generic {{.*}} outs(%[[C2]] : memref<32x32xf32, 2>) {{.*}}pbsdk.matrix_unit = "mxu"
// CHECK:           linalg.copy {pbsdk.dma = "spm->sram"} ins(%[[C2]] :
// CHECK:           memref.dealloc %[[A2]]
// CHECK:         } {pbsdk.compute_level = "core"}
// CHECK:         linalg.copy {pbsdk.dma = "sram->dram"} ins(%[[C1]] : memref<64x64xf32, 1>) outs(%[[C]] :
// CHECK-NOT:     linalg.matmul

// TILES-LABEL: func.func private @__pbsdk_promoted_0(
// TILES-DAG:     memref.alloc() {{.*}} : memref<64x32xbf16, 2>
// TILES-DAG:     memref.alloc() {{.*}} : memref<32x32xbf16, 2>
// TILES-DAG:     memref.alloc() {{.*}} : memref<64x32xf32, 2>

// CACHES-LABEL: func.func @mm(
// CACHES-NOT:     call
// CACHES:         linalg.generic
// CACHES-NOT:     pbsdk.
// CACHES-NOT:   __pbsdk_promoted
func.func @mm(%a: memref<64x64xbf16>, %b: memref<64x64xbf16>, %c: memref<64x64xf32>) {
  linalg.matmul ins(%a, %b : memref<64x64xbf16>, memref<64x64xbf16>) outs(%c : memref<64x64xf32>)
  return
}
