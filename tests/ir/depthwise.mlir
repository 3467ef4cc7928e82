// Stage depthwise (the cpu target's): a channels-last depthwise convolution — the linalg.generic with loops
// (n, oh, ow, kh, kw, c) that emit builds — becomes a call of @__pbsdk_dw<N>: per output row, per vector of
// channels (the last ones masked) and per register tile of adjacent pixels, the accumulators are loaded once,
// carried through the kernel-row loop (kernel columns unrolled: one weight load, then one input load and one
// FMA per pixel) and stored once. Anything else stays a linalg.generic.
// RUN: %pbsdk opt %s --split-input-file --target cpu --spec intel/xeon-avx512 -p depthwise | filecheck %s

// 20 channels on 16 lanes: one full vector and a masked one of 4; 3x3 taps, stride 1, rows of 4 pixels (one
// tile of 4). 4 rows of work on one core.
// CHECK-LABEL: func.func @dw3x3(
// CHECK-SAME:      %[[X:.*]]: memref<1x6x6x20xf32>, %[[W:.*]]: memref<3x3x20xf32>, %[[O:.*]]: memref<1x4x4x20xf32>)
// CHECK-NOT:     linalg.generic
// CHECK:         %[[ZERO:.*]] = arith.constant 0 : index
// CHECK-NEXT:    call @__pbsdk_dw0(%[[X]], %[[W]], %[[O]], %[[ZERO]])
// CHECK-LABEL: func.func @__pbsdk_dw0(
// CHECK-SAME:      %[[KX:.*]]: memref<1x6x6x20xf32>, %[[KW:.*]]: memref<3x3x20xf32>, %[[KO:.*]]: memref<1x4x4x20xf32>, %{{.*}}: index)
// CHECK:         vector.constant_mask [4] : vector<16xi1>
// CHECK:         scf.for %[[ROW:.*]] = %{{.*}} to %{{.*}} step
// CHECK:           scf.for %[[C0:.*]] = %{{.*}} to %{{.*}} step
// CHECK:             scf.for %[[OW:.*]] = %{{.*}} to %{{.*}} step
// CHECK-COUNT-4:       vector.load %[[KO]]
// CHECK:               %[[ACC:.*]]:4 = scf.for %[[KH:.*]] = {{.*}} iter_args(
// CHECK:                 vector.load %[[KW]][%[[KH]]
// CHECK-COUNT-4:         vector.fma
// CHECK:                 vector.load %[[KW]][%[[KH]]
// CHECK-COUNT-4:         vector.fma
// CHECK:                 vector.load %[[KW]][%[[KH]]
// CHECK-COUNT-4:         vector.fma
// CHECK-NOT:             vector.store
// CHECK:                 scf.yield
// CHECK-COUNT-4:       vector.store %[[ACC]]#{{[0-3]}}, %[[KO]]
// CHECK:           vector.maskedload %[[KO]]
// CHECK:           vector.maskedload %[[KW]]
// CHECK:           vector.maskedstore %[[KO]]
#x = affine_map<(d0, d1, d2, d3, d4, d5) -> (d0, d1 + d3, d2 + d4, d5)>
#w = affine_map<(d0, d1, d2, d3, d4, d5) -> (d3, d4, d5)>
#o = affine_map<(d0, d1, d2, d3, d4, d5) -> (d0, d1, d2, d5)>
func.func @dw3x3(%x: memref<1x6x6x20xf32>, %w: memref<3x3x20xf32>, %o: memref<1x4x4x20xf32>) {
  linalg.generic {indexing_maps = [#x, #w, #o],
                  iterator_types = ["parallel", "parallel", "parallel", "reduction", "reduction", "parallel"]}
      ins(%x, %w : memref<1x6x6x20xf32>, memref<3x3x20xf32>) outs(%o : memref<1x4x4x20xf32>) {
  ^bb0(%a: f32, %b: f32, %acc: f32):
    %m = arith.mulf %a, %b : f32
    %s = arith.addf %acc, %m : f32
    linalg.yield %s : f32
  }
  return
}

// -----

// Stride 2, 5x5 taps, rows of 7 pixels, 32 channels (two whole vectors, no mask), a batch of 8: enough work for
// both cores of the spec, so the rows (8 x 7) are split over them (scf.forall of calls).
// CHECK-LABEL: func.func @dw5x5s2(
// CHECK:         scf.forall (%[[T:.*]]) in (2) {
// CHECK-NEXT:      func.call @__pbsdk_dw0(%{{.*}}, %{{.*}}, %{{.*}}, %[[T]])
// CHECK-LABEL: func.func @__pbsdk_dw0(
// CHECK-NOT:     vector.constant_mask
// CHECK-NOT:     vector.maskedload
// CHECK-COUNT-35: vector.fma
// CHECK-NOT:     vector.fma
#x = affine_map<(d0, d1, d2, d3, d4, d5) -> (d0, d1 * 2 + d3, d2 * 2 + d4, d5)>
#w = affine_map<(d0, d1, d2, d3, d4, d5) -> (d3, d4, d5)>
#o = affine_map<(d0, d1, d2, d3, d4, d5) -> (d0, d1, d2, d5)>
func.func @dw5x5s2(%x: memref<8x17x17x32xf32>, %w: memref<5x5x32xf32>, %o: memref<8x7x7x32xf32>) {
  linalg.generic {indexing_maps = [#x, #w, #o],
                  iterator_types = ["parallel", "parallel", "parallel", "reduction", "reduction", "parallel"]}
      ins(%x, %w : memref<8x17x17x32xf32>, memref<5x5x32xf32>) outs(%o : memref<8x7x7x32xf32>) {
  ^bb0(%a: f32, %b: f32, %acc: f32):
    %m = arith.mulf %a, %b : f32
    %s = arith.addf %acc, %m : f32
    linalg.yield %s : f32
  }
  return
}

// -----

// The same convolution with the channel loop outside the taps (no vector of channels innermost) is not one
// the stage knows: it stays.
// CHECK-LABEL: func.func @channel_outer(
// CHECK-NOT:     call
// CHECK:         linalg.generic
#x = affine_map<(d0, d1, d2, d3, d4, d5) -> (d0, d1 + d4, d2 + d5, d3)>
#w = affine_map<(d0, d1, d2, d3, d4, d5) -> (d4, d5, d3)>
#o = affine_map<(d0, d1, d2, d3, d4, d5) -> (d0, d1, d2, d3)>
func.func @channel_outer(%x: memref<1x6x6x20xf32>, %w: memref<3x3x20xf32>, %o: memref<1x4x4x20xf32>) {
  linalg.generic {indexing_maps = [#x, #w, #o],
                  iterator_types = ["parallel", "parallel", "parallel", "parallel", "reduction", "reduction"]}
      ins(%x, %w : memref<1x6x6x20xf32>, memref<3x3x20xf32>) outs(%o : memref<1x4x4x20xf32>) {
  ^bb0(%a: f32, %b: f32, %acc: f32):
    %m = arith.mulf %a, %b : f32
    %s = arith.addf %acc, %m : f32
    linalg.yield %s : f32
  }
  return
}

// -----

// f64 (not the stage's dtype) and a body that is not a multiply-accumulate stay too.
// CHECK-LABEL: func.func @f64(
// CHECK-NOT:     call
// CHECK:         linalg.generic
// CHECK-LABEL: func.func @max_body(
// CHECK-NOT:     call
// CHECK:         linalg.generic
#x = affine_map<(d0, d1, d2, d3, d4, d5) -> (d0, d1 + d3, d2 + d4, d5)>
#w = affine_map<(d0, d1, d2, d3, d4, d5) -> (d3, d4, d5)>
#o = affine_map<(d0, d1, d2, d3, d4, d5) -> (d0, d1, d2, d5)>
func.func @f64(%x: memref<1x6x6x20xf64>, %w: memref<3x3x20xf64>, %o: memref<1x4x4x20xf64>) {
  linalg.generic {indexing_maps = [#x, #w, #o],
                  iterator_types = ["parallel", "parallel", "parallel", "reduction", "reduction", "parallel"]}
      ins(%x, %w : memref<1x6x6x20xf64>, memref<3x3x20xf64>) outs(%o : memref<1x4x4x20xf64>) {
  ^bb0(%a: f64, %b: f64, %acc: f64):
    %m = arith.mulf %a, %b : f64
    %s = arith.addf %acc, %m : f64
    linalg.yield %s : f64
  }
  return
}
func.func @max_body(%x: memref<1x6x6x20xf32>, %w: memref<3x3x20xf32>, %o: memref<1x4x4x20xf32>) {
  linalg.generic {indexing_maps = [#x, #w, #o],
                  iterator_types = ["parallel", "parallel", "parallel", "reduction", "reduction", "parallel"]}
      ins(%x, %w : memref<1x6x6x20xf32>, memref<3x3x20xf32>) outs(%o : memref<1x4x4x20xf32>) {
  ^bb0(%a: f32, %b: f32, %acc: f32):
    %m = arith.mulf %a, %b : f32
    %s = arith.maximumf %acc, %m : f32
    linalg.yield %s : f32
  }
  return
}

// -----

// The output's zero fill right before the convolution is dropped: the accumulators start at zero.
// CHECK-LABEL: func.func @zero_filled(
// CHECK-NOT:     linalg.fill
// CHECK:         call @__pbsdk_dw0(
// CHECK-LABEL: func.func @__pbsdk_dw0(
// CHECK:         %[[Z:.*]] = arith.constant dense<0.000000e+00> : vector<16xf32>
// CHECK-NOT:     vector.load %arg2
// CHECK:         scf.for {{.*}} iter_args(%{{.*}} = %[[Z]], %{{.*}} = %[[Z]], %{{.*}} = %[[Z]], %{{.*}} = %[[Z]])
// CHECK-COUNT-4: vector.store {{.*}}, %arg2
#x = affine_map<(d0, d1, d2, d3, d4, d5) -> (d0, d1 + d3, d2 + d4, d5)>
#w = affine_map<(d0, d1, d2, d3, d4, d5) -> (d3, d4, d5)>
#o = affine_map<(d0, d1, d2, d3, d4, d5) -> (d0, d1, d2, d5)>
func.func @zero_filled(%x: memref<1x6x6x16xf32>, %w: memref<3x3x16xf32>, %o: memref<1x4x4x16xf32>) {
  %zero = arith.constant 0.0 : f32
  linalg.fill ins(%zero : f32) outs(%o : memref<1x4x4x16xf32>)
  linalg.generic {indexing_maps = [#x, #w, #o],
                  iterator_types = ["parallel", "parallel", "parallel", "reduction", "reduction", "parallel"]}
      ins(%x, %w : memref<1x6x6x16xf32>, memref<3x3x16xf32>) outs(%o : memref<1x4x4x16xf32>) {
  ^bb0(%a: f32, %b: f32, %acc: f32):
    %m = arith.mulf %a, %b : f32
    %s = arith.addf %acc, %m : f32
    linalg.yield %s : f32
  }
  return
}
