// Pass transpose-blocks (core; the cpu target runs it after collapse-loops): a copy that moves its innermost
// dimension becomes 16 x 16 blocks (the spec's f32 lanes) through the vector registers: 16 vector loads
// along the input's contiguous loop, the shuffle butterfly, 16 vector stores along the output's. Blocks at
// a ragged end load and store under lane masks and skip the rows past the end.
// RUN: %pbsdk opt %s --split-input-file --target cpu --spec intel/xeon-avx512 -p transpose-blocks | filecheck %s
// RUN: %pbsdk opt %s --split-input-file --target cpu --spec intel/xeon-avx512 -p transpose-blocks \
// RUN:   --options transpose_blocks=false | filecheck %s --check-prefix=OFF

// An NCHW image to NHWC, as collapse-loops leaves it (h*w one loop): whole blocks, no masks.
// CHECK-LABEL: func.func @nchw_to_nhwc(
// CHECK-SAME:      %[[X:.*]]: memref<32x48xf32>, %[[Y:.*]]: memref<48x32xf32>)
// CHECK-NOT:     linalg.generic
// CHECK:         scf.for %[[A:.*]] = %c0 to %c48 step %c16 {
// CHECK-NEXT:      scf.for %[[Q:.*]] = %c0 to %c32 step %c16 {
// CHECK-NEXT:        vector.load %[[X]][%[[Q]], %[[A]]] : memref<32x48xf32>, vector<16xf32>
// CHECK:             vector.shuffle
// CHECK-NOT:         vector.maskedstore
// CHECK:             vector.store %{{.*}}, %[[Y]][%[[A]], %[[Q]]] : memref<48x32xf32>, vector<16xf32>
// OFF-LABEL: func.func @nchw_to_nhwc(
// OFF:         linalg.generic
#in = affine_map<(d0, d1) -> (d1, d0)>
#id = affine_map<(d0, d1) -> (d0, d1)>
func.func @nchw_to_nhwc(%x: memref<32x48xf32>, %y: memref<48x32xf32>) {
  linalg.generic {indexing_maps = [#in, #id], iterator_types = ["parallel", "parallel"]}
      ins(%x : memref<32x48xf32>) outs(%y : memref<48x32xf32>) {
  ^bb0(%a: f32, %b: f32):
    linalg.yield %a : f32
  }
  return
}

// -----

// linalg.transpose with a batch loop around the blocks; 40 and 20 are not multiples of 16: masked loads
// along the input's 40, columns past 20 read the last again (minsi), stores masked to the valid columns
// and guarded to the valid rows.
// CHECK-LABEL: func.func @ragged(
// CHECK-SAME:      %[[X:.*]]: memref<2x20x40xf32>, %[[Y:.*]]: memref<2x40x20xf32>)
// CHECK-NOT:     linalg.transpose
// CHECK:         scf.for %[[B:.*]] = %c0 to %c2 step %c1 {
// CHECK-NEXT:      scf.for %[[A:.*]] = %c0 to %c40 step %c16 {
// CHECK-NEXT:        scf.for %[[Q:.*]] = %c0 to %c20 step %c16 {
// CHECK:               arith.minsi %[[Q]], %c19
// CHECK:               vector.maskedload %[[X]][%[[B]], %{{.*}}, %[[A]]]
// CHECK:               vector.shuffle
// CHECK:               scf.if
// CHECK-NEXT:            vector.maskedstore %[[Y]][%[[B]], %[[A]], %[[Q]]]
// OFF-LABEL: func.func @ragged(
// OFF:         linalg.transpose
func.func @ragged(%x: memref<2x20x40xf32>, %y: memref<2x40x20xf32>) {
  linalg.transpose ins(%x : memref<2x20x40xf32>) outs(%y : memref<2x40x20xf32>) permutation = [0, 2, 1]
  return
}

// -----

// Left as they are: the innermost dimension stays innermost (a contiguous copy), a dimension narrower than
// a block (a 3x3 kernel's), a body that computes, an input whose innermost stride is not 1.
// CHECK-LABEL: func.func @rejects(
// CHECK:         linalg.transpose ins(%{{.*}} : memref<4x8x32xf32>)
// CHECK:         linalg.transpose ins(%{{.*}} : memref<3x64xf32>)
// CHECK:         linalg.generic
// CHECK:           arith.negf
// CHECK:         linalg.generic
// CHECK-NOT:     vector.shuffle
#in2 = affine_map<(d0, d1) -> (d1, d0)>
#id2 = affine_map<(d0, d1) -> (d0, d1)>
func.func @rejects(%a: memref<4x8x32xf32>, %b: memref<8x4x32xf32>, %c: memref<3x64xf32>, %d: memref<64x3xf32>,
                   %e: memref<32x48xf32>, %f: memref<48x32xf32>, %g: memref<32x48xf32, strided<[1, 32]>>) {
  linalg.transpose ins(%a : memref<4x8x32xf32>) outs(%b : memref<8x4x32xf32>) permutation = [1, 0, 2]
  linalg.transpose ins(%c : memref<3x64xf32>) outs(%d : memref<64x3xf32>) permutation = [1, 0]
  linalg.generic {indexing_maps = [#in2, #id2], iterator_types = ["parallel", "parallel"]}
      ins(%e : memref<32x48xf32>) outs(%f : memref<48x32xf32>) {
  ^bb0(%x: f32, %y: f32):
    %n = arith.negf %x : f32
    linalg.yield %n : f32
  }
  linalg.generic {indexing_maps = [#in2, #id2], iterator_types = ["parallel", "parallel"]}
      ins(%g : memref<32x48xf32, strided<[1, 32]>>) outs(%f : memref<48x32xf32>) {
  ^bb0(%x: f32, %y: f32):
    linalg.yield %x : f32
  }
  return
}

// -----

// Integer elements (an i8 activation of a quantized model): the masked loads' padding is an integer zero.
// CHECK-LABEL: func.func @i8_ragged(
// CHECK:         arith.constant dense<0> : vector<64xi8>
// CHECK:         vector.maskedload {{.*}} : memref<70x130xi8>, vector<64xi1>, vector<64xi8> into vector<64xi8>
// CHECK:         vector.shuffle
// OFF-LABEL: func.func @i8_ragged(
// OFF:         linalg.generic
#in = affine_map<(d0, d1) -> (d1, d0)>
#id = affine_map<(d0, d1) -> (d0, d1)>
func.func @i8_ragged(%x: memref<70x130xi8>, %y: memref<130x70xi8>) {
  linalg.generic {indexing_maps = [#in, #id], iterator_types = ["parallel", "parallel"]}
      ins(%x : memref<70x130xi8>) outs(%y : memref<130x70xi8>) {
  ^bb0(%a: i8, %b: i8):
    linalg.yield %a : i8
  }
  return
}
