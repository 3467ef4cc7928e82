// Pass pack-contractions on a product with few columns and many rows (a 1x1 NCHW convolution at 7x7
// is 512 x 49): the planner computes it transposed, C^T = B^T A^T, so its 512 rows fill the 16 f32 lanes
// (49 columns would fill four vectors at 77 %). The kernel takes B first (read in place, a k-major A^T),
// packs A through 16 x 16 register transposes (vector.shuffle butterflies; loads from a cache line
// boundary on, found from A's address), and updates C a transposed micro-tile at a time with masked
// vector loads and stores along C's rows. C is not prefetched.
// RUN: %pbsdk opt %s --split-input-file --target cpu --spec intel/xeon-avx512 -p pack-contractions | filecheck %s
// RUN: %pbsdk opt %s --split-input-file --target cpu --spec intel/xeon-avx512 -p pack-contractions \
// RUN:   --options transpose_gemm=false | filecheck %s --check-prefix=OFF

// CHECK-LABEL: func.func @narrow(
// CHECK-SAME:      %[[A:.*]]: memref<512x256xf32>, %[[B:.*]]: memref<256x49xf32>, %[[C:.*]]: memref<512x49xf32>)
// CHECK-NOT:     linalg.
// CHECK:         call @__pbsdk_mm0(%[[B]], %[[A]], %[[C]])
// CHECK-LABEL: func.func @__pbsdk_mm0_part(
// CHECK-SAME:      %[[PB:[^:]*]]: memref<256x49xf32>, %[[PA:[^:]*]]: memref<512x256xf32>, %[[PC:[^:]*]]: memref<512x49xf32>, %{{.*}}: index)
// CHECK-NOT:     memref.prefetch
// The packed panels: 256 columns per thread (8 of 32), k rows up to a head and a whole block past kc.
// CHECK:         %[[PANELS:.*]] = memref.alloc() {alignment = 64 : i64} : memref<8x272x32xf32>
// CHECK:         memref.extract_aligned_pointer_as_index %[[PA]]
// CHECK:         vector.maskedload %[[PA]]
// CHECK:         vector.shuffle {{.*}} [0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23]
// CHECK:         vector.store %{{.*}}, %[[PANELS]]
// CHECK:         memref.load %[[PB]]
// CHECK:         vector.fma {{.*}} : vector<16xf32>
// CHECK:         vector.shuffle
// CHECK:         vector.maskedstore %[[PC]]
// CHECK-NOT:     memref.prefetch
// CHECK-LABEL: func.func private @__pbsdk_mm0(
// OFF-LABEL: func.func @narrow(
// OFF-SAME:      %[[A:.*]]: memref<512x256xf32>, %[[B:.*]]: memref<256x49xf32>, %[[C:.*]]: memref<512x49xf32>)
// OFF:         call @__pbsdk_mm0(%[[A]], %[[B]], %[[C]])
// OFF-NOT:     vector.shuffle
func.func @narrow(%a: memref<512x256xf32>, %b: memref<256x49xf32>, %c: memref<512x49xf32>) {
  %zero = arith.constant 0.0 : f32
  linalg.fill ins(%zero : f32) outs(%c : memref<512x49xf32>)
  linalg.matmul ins(%a, %b : memref<512x256xf32>, memref<256x49xf32>) outs(%c : memref<512x49xf32>)
  return
}

// -----

// A bias per row of C (per output channel of the convolution) stays fused: after the transpose each
// stored row of C gets one vector, its bias element broadcast.
// CHECK-LABEL: func.func @narrow_bias(
// CHECK-SAME:      %[[A:.*]]: memref<512x256xf32>, %[[B:.*]]: memref<256x49xf32>, %[[BIAS:.*]]: memref<512xf32>, %[[C:.*]]: memref<512x49xf32>)
// CHECK:         call @__pbsdk_mm0(%[[B]], %[[A]], %[[C]], %[[BIAS]], %[[C]])
// CHECK-LABEL: func.func @__pbsdk_mm0_part(
// CHECK-SAME:      %[[PBIAS:[^:]*]]: memref<512xf32>, %[[PD:[^:]*]]: memref<512x49xf32>, %{{.*}}: index)
// CHECK:         %[[S:.*]] = memref.load %[[PBIAS]]
// CHECK-NEXT:    %[[V:.*]] = vector.broadcast %[[S]] : f32 to vector<16xf32>
// CHECK-NEXT:    %[[R:.*]] = arith.addf %{{.*}}, %[[V]] : vector<16xf32>
// CHECK-NEXT:    vector.maskedstore %[[PD]][%{{.*}}, %{{.*}}], %{{.*}}, %[[R]]
// OFF-LABEL: func.func @narrow_bias(
// OFF:         call @__pbsdk_mm0(%{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}})
// OFF-NOT:     vector.shuffle
#id = affine_map<(d0, d1) -> (d0, d1)>
#col = affine_map<(d0, d1) -> (d0)>
func.func @narrow_bias(%a: memref<512x256xf32>, %b: memref<256x49xf32>, %bias: memref<512xf32>, %c: memref<512x49xf32>) {
  linalg.matmul ins(%a, %b : memref<512x256xf32>, memref<256x49xf32>) outs(%c : memref<512x49xf32>)
  linalg.generic {indexing_maps = [#id, #col, #id], iterator_types = ["parallel", "parallel"]}
      ins(%c, %bias : memref<512x49xf32>, memref<512xf32>) outs(%c : memref<512x49xf32>) {
  ^bb0(%x: f32, %y: f32, %o: f32):
    %s = arith.addf %x, %y : f32
    linalg.yield %s : f32
  }
  return
}
