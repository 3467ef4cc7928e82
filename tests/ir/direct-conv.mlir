// Stage direct-conv (the cpu target's): a channels-last convolution the planner sent to a direct kernel — the
// linalg.generic with loops (n, oh, ow, g, o, kh, kw, c) that emit builds over (N, Hp, Wp, G, CG) input,
// (KH, KW, CG, G, OG) weights and (N, OH, OW, G, OG) output — becomes a call of @__pbsdk_conv<N>: per output
// row, per group and per register tile of adjacent pixels, the accumulators are loaded once, carried through
// the kernel-row, kernel-column and input-channel loops, where per input channel one weight vector is loaded
// and one input value broadcast into each pixel's accumulator, and stored once. Inputs the stage must leave alone
// are in direct-conv-reject.mlir.
// RUN: %pbsdk opt %s --split-input-file --target cpu --spec intel/xeon-avx512 -p direct-conv | filecheck %s

// 2 groups of 2 -> 16 channels, 3x3, stride 1, rows of 4 pixels (one tile of 4, one 16-lane vector a pixel).
// CHECK-LABEL: func.func @g2(
// CHECK-SAME:      %[[X:.*]]: memref<1x6x6x2x2xf32>, %[[W:.*]]: memref<3x3x2x2x16xf32>, %[[O:.*]]: memref<1x4x4x2x16xf32>)
// CHECK-NOT:     linalg.generic
// CHECK:         %[[ZERO:.*]] = arith.constant 0 : index
// CHECK-NEXT:    call @__pbsdk_conv0(%[[X]], %[[W]], %[[O]], %[[ZERO]])
// CHECK-LABEL: func.func @__pbsdk_conv0(
// CHECK-SAME:      %[[KX:.*]]: memref<1x6x6x2x2xf32>, %[[KW:.*]]: memref<3x3x2x2x16xf32>, %[[KO:.*]]: memref<1x4x4x2x16xf32>, %{{.*}}: index)
// CHECK:         scf.for %[[ROW:.*]] = %{{.*}} to %{{.*}} step
// CHECK:           scf.for %[[G:.*]] = %{{.*}} to %{{.*}} step
// CHECK:             scf.for %[[OW:.*]] = %{{.*}} to %{{.*}} step
// CHECK-COUNT-4:       vector.load %[[KO]]{{.*}} : memref<1x4x4x2x16xf32>, vector<16xf32>
// CHECK:               %[[ACC:.*]]:4 = scf.for %[[KH:.*]] = {{.*}} iter_args(
// CHECK:                 scf.for %[[KC:.*]] = {{.*}} iter_args(
// CHECK:                   scf.for %[[C:.*]] = {{.*}} iter_args(
// CHECK:                     %[[WV:.*]] = vector.load %[[KW]][%[[KH]], %[[KC]], %[[C]], %[[G]], %{{.*}}]
// CHECK:                     %[[XS0:.*]] = memref.load %[[KX]][%{{.*}}, %{{.*}}, %{{.*}}, %[[G]], %[[C]]]
// CHECK-NEXT:                %[[XB0:.*]] = vector.broadcast %[[XS0]] : f32 to vector<16xf32>
// CHECK-NEXT:                vector.fma %[[XB0]], %[[WV]]
// CHECK:                     %[[XS1:.*]] = memref.load %[[KX]][%{{.*}}, %{{.*}}, %{{.*}}, %[[G]], %[[C]]]
// CHECK-NEXT:                %[[XB1:.*]] = vector.broadcast %[[XS1]] : f32 to vector<16xf32>
// CHECK-NEXT:                vector.fma %[[XB1]], %[[WV]]
// CHECK:                     %[[XS2:.*]] = memref.load %[[KX]][%{{.*}}, %{{.*}}, %{{.*}}, %[[G]], %[[C]]]
// CHECK-NEXT:                %[[XB2:.*]] = vector.broadcast %[[XS2]] : f32 to vector<16xf32>
// CHECK-NEXT:                vector.fma %[[XB2]], %[[WV]]
// CHECK:                     %[[XS3:.*]] = memref.load %[[KX]][%{{.*}}, %{{.*}}, %{{.*}}, %[[G]], %[[C]]]
// CHECK-NEXT:                %[[XB3:.*]] = vector.broadcast %[[XS3]] : f32 to vector<16xf32>
// CHECK-NEXT:                vector.fma %[[XB3]], %[[WV]]
// CHECK-NOT:                 vector.fma
// CHECK:                     scf.yield
// CHECK-NOT:               vector.store
// CHECK:                   scf.yield
// CHECK-COUNT-4:       vector.store %[[ACC]]#{{[0-3]}}, %[[KO]]
#x = affine_map<(d0, d1, d2, d3, d4, d5, d6, d7) -> (d0, d1 + d5, d2 + d6, d3, d7)>
#w = affine_map<(d0, d1, d2, d3, d4, d5, d6, d7) -> (d5, d6, d7, d3, d4)>
#o = affine_map<(d0, d1, d2, d3, d4, d5, d6, d7) -> (d0, d1, d2, d3, d4)>
func.func @g2(%x: memref<1x6x6x2x2xf32>, %w: memref<3x3x2x2x16xf32>, %o: memref<1x4x4x2x16xf32>) {
  linalg.generic {indexing_maps = [#x, #w, #o],
                  iterator_types = ["parallel", "parallel", "parallel", "parallel", "parallel",
                                    "reduction", "reduction", "reduction"]}
      ins(%x, %w : memref<1x6x6x2x2xf32>, memref<3x3x2x2x16xf32>) outs(%o : memref<1x4x4x2x16xf32>) {
  ^bb0(%a: f32, %b: f32, %acc: f32):
    %m = arith.mulf %a, %b : f32
    %s = arith.addf %acc, %m : f32
    linalg.yield %s : f32
  }
  return
}

// -----

// Groups of 3 output channels: a 4-lane vector, its last lane masked off (weights and output). Stride 2 with
// dilation 2; a batch of 8 rows of 8 pixels, enough work for both cores of the spec: the rows are split over
// them (scf.forall of calls).
// CHECK-LABEL: func.func @g4_masked_s2(
// CHECK:         scf.forall (%[[T:.*]]) in (2) {
// CHECK-NEXT:      func.call @__pbsdk_conv0(%{{.*}}, %{{.*}}, %{{.*}}, %[[T]])
// CHECK-LABEL: func.func @__pbsdk_conv0(
// CHECK:         vector.constant_mask [3] : vector<4xi1>
// CHECK:         arith.muli %{{.*}}, %c2{{.*}} : index
// CHECK:         vector.maskedload {{.*}} : memref<3x3x4x4x3xf32>, vector<4xi1>, vector<4xf32> into vector<4xf32>
// CHECK:         vector.fma {{.*}} : vector<4xf32>
// CHECK:         vector.maskedstore {{.*}} : memref<8x8x8x4x3xf32>, vector<4xi1>, vector<4xf32>
#x = affine_map<(d0, d1, d2, d3, d4, d5, d6, d7) -> (d0, d1 * 2 + d5 * 2, d2 * 2 + d6 * 2, d3, d7)>
#w = affine_map<(d0, d1, d2, d3, d4, d5, d6, d7) -> (d5, d6, d7, d3, d4)>
#o = affine_map<(d0, d1, d2, d3, d4, d5, d6, d7) -> (d0, d1, d2, d3, d4)>
func.func @g4_masked_s2(%x: memref<8x19x19x4x4xf32>, %w: memref<3x3x4x4x3xf32>, %o: memref<8x8x8x4x3xf32>) {
  linalg.generic {indexing_maps = [#x, #w, #o],
                  iterator_types = ["parallel", "parallel", "parallel", "parallel", "parallel",
                                    "reduction", "reduction", "reduction"]}
      ins(%x, %w : memref<8x19x19x4x4xf32>, memref<3x3x4x4x3xf32>) outs(%o : memref<8x8x8x4x3xf32>) {
  ^bb0(%a: f32, %b: f32, %acc: f32):
    %m = arith.mulf %a, %b : f32
    %s = arith.addf %acc, %m : f32
    linalg.yield %s : f32
  }
  return
}

// -----

// The output's zero fill right before the convolution is dropped: the accumulators start at zero (no load of
// the output) and are stored once. A fill of another value (below) stays, and the accumulators start from
// the output it wrote.
// CHECK-LABEL: func.func @zero_filled(
// CHECK-NOT:     linalg.fill
// CHECK:         call @__pbsdk_conv0(
// CHECK-LABEL: func.func @one_filled(
// CHECK:         linalg.fill
// CHECK-NEXT:    arith.constant 0 : index
// CHECK-NEXT:    call @__pbsdk_conv1(
// CHECK-LABEL: func.func @__pbsdk_conv0(
// CHECK:         %[[Z:.*]] = arith.constant dense<0.000000e+00> : vector<16xf32>
// CHECK-NOT:     vector.load %arg2
// CHECK:         scf.for {{.*}} iter_args(%{{.*}} = %[[Z]], %{{.*}} = %[[Z]], %{{.*}} = %[[Z]], %{{.*}} = %[[Z]])
// CHECK-COUNT-4: vector.store {{.*}}, %arg2
// CHECK-LABEL: func.func @__pbsdk_conv1(
// CHECK-COUNT-4: vector.load %arg2
#x = affine_map<(d0, d1, d2, d3, d4, d5, d6, d7) -> (d0, d1 + d5, d2 + d6, d3, d7)>
#w = affine_map<(d0, d1, d2, d3, d4, d5, d6, d7) -> (d5, d6, d7, d3, d4)>
#o = affine_map<(d0, d1, d2, d3, d4, d5, d6, d7) -> (d0, d1, d2, d3, d4)>
func.func @zero_filled(%x: memref<1x6x6x2x2xf32>, %w: memref<3x3x2x2x16xf32>, %o: memref<1x4x4x2x16xf32>) {
  %zero = arith.constant 0.0 : f32
  linalg.fill ins(%zero : f32) outs(%o : memref<1x4x4x2x16xf32>)
  linalg.generic {indexing_maps = [#x, #w, #o],
                  iterator_types = ["parallel", "parallel", "parallel", "parallel", "parallel",
                                    "reduction", "reduction", "reduction"]}
      ins(%x, %w : memref<1x6x6x2x2xf32>, memref<3x3x2x2x16xf32>) outs(%o : memref<1x4x4x2x16xf32>) {
  ^bb0(%a: f32, %b: f32, %acc: f32):
    %m = arith.mulf %a, %b : f32
    %s = arith.addf %acc, %m : f32
    linalg.yield %s : f32
  }
  return
}
func.func @one_filled(%x: memref<1x6x6x2x2xf32>, %w: memref<3x3x2x2x16xf32>, %o: memref<1x4x4x2x16xf32>) {
  %one = arith.constant 1.0 : f32
  linalg.fill ins(%one : f32) outs(%o : memref<1x4x4x2x16xf32>)
  linalg.generic {indexing_maps = [#x, #w, #o],
                  iterator_types = ["parallel", "parallel", "parallel", "parallel", "parallel",
                                    "reduction", "reduction", "reduction"]}
      ins(%x, %w : memref<1x6x6x2x2xf32>, memref<3x3x2x2x16xf32>) outs(%o : memref<1x4x4x2x16xf32>) {
  ^bb0(%a: f32, %b: f32, %acc: f32):
    %m = arith.mulf %a, %b : f32
    %s = arith.addf %acc, %m : f32
    linalg.yield %s : f32
  }
  return
}

// -----

// Strided views whose innermost dimension is contiguous (a weight sliced per output phase of a transposed
// convolution) are taken as they are: the kernel's vector loads run along that dimension.
// CHECK-LABEL: func.func @strided_weights(
// CHECK-NOT:     linalg.generic
// CHECK:         call @__pbsdk_conv0(
// CHECK-LABEL: func.func @__pbsdk_conv0(
// CHECK-SAME:      memref<2x1x4x1x16xf32, strided<[128, 64, 16, 16, 1], offset: 32>>
// CHECK:         vector.load %arg1{{.*}} : memref<2x1x4x1x16xf32, strided<[128, 64, 16, 16, 1], offset: 32>>, vector<16xf32>
#x = affine_map<(d0, d1, d2, d3, d4, d5, d6, d7) -> (d0, d1 + d5, d2 + d6, d3, d7)>
#w = affine_map<(d0, d1, d2, d3, d4, d5, d6, d7) -> (d5, d6, d7, d3, d4)>
#o = affine_map<(d0, d1, d2, d3, d4, d5, d6, d7) -> (d0, d1, d2, d3, d4)>
func.func @strided_weights(%x: memref<1x5x4x1x4xf32>, %w: memref<2x1x4x1x16xf32, strided<[128, 64, 16, 16, 1], offset: 32>>,
                           %o: memref<1x4x4x1x16xf32>) {
  linalg.generic {indexing_maps = [#x, #w, #o],
                  iterator_types = ["parallel", "parallel", "parallel", "parallel", "parallel",
                                    "reduction", "reduction", "reduction"]}
      ins(%x, %w : memref<1x5x4x1x4xf32>, memref<2x1x4x1x16xf32, strided<[128, 64, 16, 16, 1], offset: 32>>)
      outs(%o : memref<1x4x4x1x16xf32>) {
  ^bb0(%a: f32, %b: f32, %acc: f32):
    %m = arith.mulf %a, %b : f32
    %s = arith.addf %acc, %m : f32
    linalg.yield %s : f32
  }
  return
}

// -----

// An NCHW graph input read where it lies: `fuse` folded the layout transpose the emitter put before the
// convolution into its input map, (n, g, c, h, w) = (d0, d3, d7, d1 + d5, d2 + d6). The kernel broadcasts
// one input value at a time, so it reads the input in that order (KernelBench's Conv2d(3, 16, 3)).
// CHECK-LABEL: func.func @nchw_input(
// CHECK:         call @__pbsdk_conv0(
// CHECK-LABEL: func.func @__pbsdk_conv0(
// CHECK-SAME:      %[[KX:.*]]: memref<2x1x3x8x8xf32>, %[[KW:.*]]: memref<3x3x3x1x16xf32>, %{{.*}}: memref<2x6x6x1x16xf32>
// CHECK:               scf.for %{{.*}} = {{.*}} iter_args(
// CHECK:                 scf.for %{{.*}} = {{.*}} iter_args(
// CHECK:                   scf.for %[[C:.*]] = {{.*}} iter_args(
// CHECK:                     memref.load %[[KX]][%{{.*}}, %{{.*}}, %[[C]], %{{.*}}, %{{.*}}] : memref<2x1x3x8x8xf32>
// CHECK-NEXT:                vector.broadcast
// CHECK-NEXT:                vector.fma
#x = affine_map<(d0, d1, d2, d3, d4, d5, d6, d7) -> (d0, d3, d7, d1 + d5, d2 + d6)>
#w = affine_map<(d0, d1, d2, d3, d4, d5, d6, d7) -> (d5, d6, d7, d3, d4)>
#o = affine_map<(d0, d1, d2, d3, d4, d5, d6, d7) -> (d0, d1, d2, d3, d4)>
func.func @nchw_input(%x: memref<2x1x3x8x8xf32>, %w: memref<3x3x3x1x16xf32>, %o: memref<2x6x6x1x16xf32>) {
  linalg.generic {indexing_maps = [#x, #w, #o],
                  iterator_types = ["parallel", "parallel", "parallel", "parallel", "parallel",
                                    "reduction", "reduction", "reduction"]}
      ins(%x, %w : memref<2x1x3x8x8xf32>, memref<3x3x3x1x16xf32>) outs(%o : memref<2x6x6x1x16xf32>) {
  ^bb0(%a: f32, %b: f32, %acc: f32):
    %m = arith.mulf %a, %b : f32
    %s = arith.addf %acc, %m : f32
    linalg.yield %s : f32
  }
  return
}
