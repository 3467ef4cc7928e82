// Pass pack-contractions (the cpu target's stage, found through --target cpu): each planned f32/f64
// matmul on buffers becomes a call to a packed, register-tiled kernel generated from the plan for the spec
// (here the 2-core AVX-512 Xeon preset: 16-lane f32 FMAs, work split over both cores when there is enough
// of it).
// RUN: %pbsdk opt %s --split-input-file --target cpu --spec intel/xeon-avx512 -p pack-contractions | filecheck %s
// RUN: %pbsdk opt %s --split-input-file --target cpu --spec intel/xeon-avx512 -p pack-contractions \
// RUN:   --options pack=false | filecheck %s --check-prefix=OFF

// The zero fill is dropped (the kernel stores its first k block instead of adding it); one part, no fork.
// CHECK-LABEL: func.func @mm(
// CHECK-SAME:      %[[A:.*]]: memref<64x32xf32>, %[[B:.*]]: memref<32x48xf32>, %[[C:.*]]: memref<64x48xf32>)
// CHECK-NOT:     linalg.
// CHECK:         call @__pbsdk_mm0(%[[A]], %[[B]], %[[C]])
// CHECK-NEXT:    return
// Each micro-tile prefetches its C lines for writing before its k loop (one per row and vector).
// CHECK-LABEL: func.func @__pbsdk_mm0_part(
// CHECK-SAME:      %[[PA:[^:]*]]: memref<64x32xf32>, %[[PB:[^:]*]]: memref<32x48xf32>, %[[PC:[^:]*]]: memref<64x48xf32>, %{{.*}}: index)
// CHECK:         memref.prefetch %[[PC]][%{{.*}}, %{{.*}}], write, locality<3>, data : memref<64x48xf32>
// CHECK:         scf.for
// CHECK:         vector.fma {{.*}} : vector<16xf32>
// CHECK-LABEL: func.func private @__pbsdk_mm0(
// CHECK-NOT:     scf.forall
// CHECK:         call @__pbsdk_mm0_part(
// OFF-LABEL: func.func @mm(
// OFF-NEXT:    arith.constant
// OFF-NEXT:    linalg.fill
// OFF-NEXT:    linalg.matmul
// OFF-NOT:     __pbsdk_mm
func.func @mm(%a: memref<64x32xf32>, %b: memref<32x48xf32>, %c: memref<64x48xf32>) {
  %zero = arith.constant 0.0 : f32
  linalg.fill ins(%zero : f32) outs(%c : memref<64x48xf32>)
  linalg.matmul ins(%a, %b : memref<64x32xf32>, memref<32x48xf32>) outs(%c : memref<64x48xf32>)
  return
}

// -----

// Enough work for both cores: the parts run under an scf.forall (the target decides how it forks).
// A is packed through 16x16 register transposes: 16 loads along k from the panel's rows (from a cache
// line boundary on), shuffles, stores of the 14 lanes of a 14-row micro-panel (k rows up to a head and a
// whole block past kc: 384 + 16; kc fills l1d: streaming a longer B micro-panel would take 14 % of l2's
// bandwidth).
// CHECK-LABEL: func.func @big(
// CHECK:         call @__pbsdk_mm0(
// B is packed 8 of its rows at a time across every 32-column panel (reads along B's rows).
// CHECK-LABEL: func.func @__pbsdk_mm0_part(
// CHECK-SAME:      %[[PA:[^:]*]]: memref<512x512xf32>, %[[PB:[^:]*]]: memref<512x512xf32>
// CHECK:         %[[AP:.*]] = memref.alloc() {alignment = 64 : i64} : memref<19x400x14xf32>
// CHECK:         %[[BP:.*]] = memref.alloc() {alignment = 64 : i64} : memref<16x384x32xf32>
// CHECK:         scf.for %[[K0:.*]] = %c0 to %{{.*}} step %c8 {
// CHECK:           scf.for %[[JB:.*]] = %c0 to %{{.*}} step %c1 {
// CHECK:             scf.for %[[KB:.*]] = %[[K0]] to %{{.*}} step %c1 {
// CHECK:               vector.maskedload %[[PB]]
// CHECK-NEXT:          vector.store %{{.*}}, %[[BP]][%[[JB]], %[[KB]], %c0]
// CHECK:         memref.extract_aligned_pointer_as_index %[[PA]]
// CHECK:         vector.maskedload %[[PA]]
// CHECK:         vector.shuffle
// CHECK:         vector.maskedstore %[[AP]]
// CHECK-LABEL: func.func private @__pbsdk_mm0(
// CHECK-NEXT:    scf.forall (%[[T:.*]]) in (2) {
// CHECK-NEXT:      func.call @__pbsdk_mm0_part(%{{.*}}, %{{.*}}, %{{.*}}, %[[T]])
// OFF-LABEL: func.func @big(
// OFF-NEXT:    linalg.matmul
func.func @big(%a: memref<512x512xf32>, %b: memref<512x512xf32>, %c: memref<512x512xf32>) {
  linalg.matmul ins(%a, %b : memref<512x512xf32>, memref<512x512xf32>) outs(%c : memref<512x512xf32>)
  return
}

// -----

// The bias epilogue that follows is folded into the kernel's final store: the generic goes, the bias and
// the output become extra kernel arguments, and the kernel adds the bias vector. On the last k block the
// sums C + acc of a micro-tile (8 x 48 here) go to a scratch tile first, then a loop over the tile's rows
// applies the epilogue one row at a time (so it never holds the accumulators' registers). Before its k loop a
// micro-tile prefetches the lines its update touches: on the last k block the output's (D) and C's.
// CHECK-LABEL: func.func @mm_bias(
// CHECK-SAME:      %[[A:.*]]: memref<64x32xf32>, %[[B:.*]]: memref<32x48xf32>, %[[BIAS:.*]]: memref<48xf32>, %[[C:.*]]: memref<64x48xf32>)
// CHECK-NOT:     linalg.
// CHECK:         call @__pbsdk_mm0(%[[A]], %[[B]], %[[C]], %[[BIAS]], %[[C]])
// CHECK-NEXT:    return
// CHECK-LABEL: func.func @__pbsdk_mm0_part(
// CHECK-SAME:      %[[PA:[^:]*]]: memref<64x32xf32>, %[[PB:[^:]*]]: memref<32x48xf32>, %[[PC:[^:]*]]: memref<64x48xf32>, %[[PBIAS:[^:]*]]: memref<48xf32>, %[[PD:[^:]*]]: memref<64x48xf32>
// CHECK:         %[[TILE:.*]] = memref.alloc() {alignment = 64 : i64} : memref<8x48xf32>
// CHECK:         memref.prefetch %[[PD]]{{.*}}, write, locality<3>, data
// CHECK:         memref.prefetch %[[PC]]{{.*}}, write, locality<3>, data
// CHECK:         vector.fma {{.*}} : vector<16xf32>
// CHECK:         %[[SUM:.*]] = arith.addf {{.*}} : vector<16xf32>
// CHECK-NEXT:    vector.store %[[SUM]], %[[TILE]][%c0, %c0]
// CHECK:         scf.for %[[I:.*]] = %c0 to %c8 step %c1 {
// CHECK:           %[[T:.*]] = vector.load %[[TILE]][%[[I]], %c0]
// CHECK-NEXT:      %[[BV:.*]] = vector.load %[[PBIAS]]
// CHECK-NEXT:      %[[R:.*]] = arith.addf %[[T]], %[[BV]] : vector<16xf32>
// CHECK-NEXT:      vector.store %[[R]], %[[PD]]
// CHECK:         memref.dealloc %[[TILE]]
#id = affine_map<(d0, d1) -> (d0, d1)>
#row = affine_map<(d0, d1) -> (d1)>
func.func @mm_bias(%a: memref<64x32xf32>, %b: memref<32x48xf32>, %bias: memref<48xf32>, %c: memref<64x48xf32>) {
  linalg.matmul ins(%a, %b : memref<64x32xf32>, memref<32x48xf32>) outs(%c : memref<64x48xf32>)
  linalg.generic {indexing_maps = [#id, #row, #id], iterator_types = ["parallel", "parallel"]}
      ins(%c, %bias : memref<64x48xf32>, memref<48xf32>) outs(%c : memref<64x48xf32>) {
  ^bb0(%x: f32, %y: f32, %o: f32):
    %s = arith.addf %x, %y : f32
    linalg.yield %s : f32
  }
  return
}

// -----

// With zero_init (the fill before the matmul is dropped) and an epilogue writing another buffer, a k block
// that is both the first and the last never touches C: the tile prefetches D's lines, and C's only when the
// last block is not the first.
// CHECK-LABEL: func.func @mm_fill_bias(
// CHECK-LABEL: func.func @__pbsdk_mm0_part(
// CHECK-SAME:      %[[PC:[^:]*]]: memref<64x48xf32>, %{{[^:]*}}: memref<48xf32>, %[[PD:[^:]*]]: memref<64x48xf32>
// CHECK:         %[[LAST:.*]] = arith.cmpi sge
// CHECK-NEXT:    scf.if %[[LAST]] {
// CHECK-NEXT:      memref.prefetch %[[PD]]
// CHECK:           %[[LATER:.*]] = arith.cmpi ne
// CHECK-NEXT:      scf.if %[[LATER]] {
// CHECK-NEXT:        memref.prefetch %[[PC]]
// CHECK:         } else {
// CHECK-NEXT:      memref.prefetch %[[PC]]
// CHECK:         vector.fma
#id = affine_map<(d0, d1) -> (d0, d1)>
#row = affine_map<(d0, d1) -> (d1)>
func.func @mm_fill_bias(%a: memref<64x32xf32>, %b: memref<32x48xf32>, %bias: memref<48xf32>, %c: memref<64x48xf32>,
                        %d: memref<64x48xf32>) {
  %z = arith.constant 0.0 : f32
  linalg.fill ins(%z : f32) outs(%c : memref<64x48xf32>)
  linalg.matmul ins(%a, %b : memref<64x32xf32>, memref<32x48xf32>) outs(%c : memref<64x48xf32>)
  linalg.generic {indexing_maps = [#id, #row, #id], iterator_types = ["parallel", "parallel"]}
      ins(%c, %bias : memref<64x48xf32>, memref<48xf32>) outs(%d : memref<64x48xf32>) {
  ^bb0(%x: f32, %y: f32, %o: f32):
    %s = arith.addf %x, %y : f32
    linalg.yield %s : f32
  }
  return
}

// -----

// Left for the target's generic lowering: integer matmuls, and contractions still on tensors.
// CHECK-LABEL: func.func @ints(
// CHECK-NEXT:    linalg.matmul ins(%{{.*}}, %{{.*}} : memref<8x8xi32>, memref<8x8xi32>)
// CHECK-NEXT:    return
// CHECK-LABEL: func.func @on_tensors(
// CHECK-NEXT:    linalg.matmul ins(%{{.*}}, %{{.*}} : tensor<8x8xf32>, tensor<8x8xf32>)
// CHECK-NOT:   __pbsdk_mm
func.func @ints(%a: memref<8x8xi32>, %b: memref<8x8xi32>, %c: memref<8x8xi32>) {
  linalg.matmul ins(%a, %b : memref<8x8xi32>, memref<8x8xi32>) outs(%c : memref<8x8xi32>)
  return
}
func.func @on_tensors(%a: tensor<8x8xf32>, %b: tensor<8x8xf32>, %c: tensor<8x8xf32>) -> tensor<8x8xf32> {
  %r = linalg.matmul ins(%a, %b : tensor<8x8xf32>, tensor<8x8xf32>) outs(%c : tensor<8x8xf32>) -> tensor<8x8xf32>
  return %r : tensor<8x8xf32>
}
