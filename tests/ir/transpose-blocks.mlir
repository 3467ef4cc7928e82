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

// linalg.transpose with a batch loop around the blocks; 40 and 20 are not multiples of 16: the whole
// blocks first (no masks), then the blocks at the end of q (columns past 20 read the last, %c19; masked
// stores) and at the end of a (masked loads; only the 8 rows inside are stored), each built once.
// CHECK-LABEL: func.func @ragged(
// CHECK-SAME:      %[[X:.*]]: memref<2x20x40xf32>, %[[Y:.*]]: memref<2x40x20xf32>)
// CHECK-NOT:     linalg.transpose
// CHECK:         scf.for %[[B:.*]] = %c0 to %c2 step %c1 {
// CHECK-NEXT:      scf.for %[[A:.*]] = %c0 to %c32 step %c16 {
// CHECK-NEXT:        scf.for %[[Q:.*]] = %c0 to %c16 step %c16 {
// CHECK-NEXT:          vector.load %[[X]][%[[B]], %[[Q]], %[[A]]]
// CHECK-NOT:           vector.mask
// CHECK:               vector.shuffle
// CHECK-NOT:           vector.mask
// CHECK:               vector.store %{{.*}}, %[[Y]][%[[B]], %[[A]], %[[Q]]]
// CHECK:             }
// CHECK:             vector.constant_mask [4] : vector<16xi1>
// CHECK:             vector.load %[[X]][%[[B]], %c19, %[[A]]]
// CHECK:             vector.maskedstore %[[Y]][%[[B]], %[[A]], %c16]
// CHECK:           }
// CHECK:           scf.for %[[Q2:.*]] = %c0 to %c16 step %c16 {
// CHECK-NEXT:        vector.constant_mask [8] : vector<16xi1>
// CHECK-NEXT:        vector.maskedload %[[X]][%[[B]], %[[Q2]], %c32]
// CHECK-COUNT-8:     vector.store %{{.*}}, %[[Y]]
// CHECK-NOT:         vector.store
// CHECK:           }
// OFF-LABEL: func.func @ragged(
// OFF:         linalg.transpose
func.func @ragged(%x: memref<2x20x40xf32>, %y: memref<2x40x20xf32>) {
  linalg.transpose ins(%x : memref<2x20x40xf32>) outs(%y : memref<2x40x20xf32>) permutation = [0, 2, 1]
  return
}

// -----

// Left as they are: the innermost dimension stays innermost (a contiguous copy), a dimension narrower than
// a block (a 3x3 kernel's), an input whose innermost stride is not 1.
// CHECK-LABEL: func.func @rejects(
// CHECK:         linalg.transpose ins(%{{.*}} : memref<4x8x32xf32>)
// CHECK:         linalg.transpose ins(%{{.*}} : memref<3x64xf32>)
// CHECK:         linalg.generic
// CHECK-NOT:     vector.shuffle
#in2 = affine_map<(d0, d1) -> (d1, d0)>
#id2 = affine_map<(d0, d1) -> (d0, d1)>
func.func @rejects(%a: memref<4x8x32xf32>, %b: memref<8x4x32xf32>, %c: memref<3x64xf32>, %d: memref<64x3xf32>,
                   %e: memref<32x48xf32>, %f: memref<48x32xf32>, %g: memref<32x48xf32, strided<[1, 32]>>) {
  linalg.transpose ins(%a : memref<4x8x32xf32>) outs(%b : memref<8x4x32xf32>) permutation = [1, 0, 2]
  linalg.transpose ins(%c : memref<3x64xf32>) outs(%d : memref<64x3xf32>) permutation = [1, 0]
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

// -----

// A permuting map that computes: an NHWC result (pixels x channels, as a direct convolution leaves it)
// with a bias per channel and an activation, written NCHW. The source is transposed in blocks as a copy
// would be; per row of a block (one channel) the bias is one value broadcast, the body runs on the vector
// of pixels, and the residual — already NCHW — is a vector along the row.
// CHECK-LABEL: func.func @epilogue_to_nchw(
// CHECK-SAME:      %[[X:.*]]: memref<1x64x32xf32>, %[[BIAS:.*]]: memref<1x1x32xf32>, %[[RES:.*]]: memref<1x32x64xf32>, %[[Y:.*]]: memref<1x32x64xf32>)
// CHECK-NOT:     linalg.generic
// CHECK:         scf.for %[[C:.*]] = %c0 to %c32 step %c16 {
// CHECK-NEXT:      scf.for %[[P:.*]] = %c0 to %c64 step %c16 {
// CHECK:             vector.load %[[X]][%{{.*}}, %[[P]], %[[C]]]
// CHECK:             vector.shuffle
// CHECK:             %[[B:.*]] = memref.load %[[BIAS]][%c0, %c0, %[[C]]]
// CHECK-NEXT:        %[[BV:.*]] = vector.broadcast %[[B]] : f32 to vector<16xf32>
// CHECK-NEXT:        %[[R:.*]] = vector.load %[[RES]][%{{.*}}, %[[C]], %[[P]]]
// CHECK-NEXT:        %[[S:.*]] = arith.addf %{{.*}}, %[[BV]] : vector<16xf32>
// CHECK:             arith.maximumf
// CHECK:             arith.addf %{{.*}}, %[[R]] : vector<16xf32>
// CHECK-NEXT:        vector.store %{{.*}}, %[[Y]][%{{.*}}, %[[C]], %[[P]]]
#nhwc = affine_map<(d0, d1, d2) -> (d0, d2, d1)>
#bias = affine_map<(d0, d1, d2) -> (0, 0, d1)>
#nchw = affine_map<(d0, d1, d2) -> (d0, d1, d2)>
func.func @epilogue_to_nchw(%x: memref<1x64x32xf32>, %bias: memref<1x1x32xf32>, %res: memref<1x32x64xf32>,
                            %y: memref<1x32x64xf32>) {
  %zero = arith.constant 0.0 : f32
  linalg.generic {indexing_maps = [#nhwc, #bias, #nchw, #nchw], iterator_types = ["parallel", "parallel", "parallel"]}
      ins(%x, %bias, %res : memref<1x64x32xf32>, memref<1x1x32xf32>, memref<1x32x64xf32>) outs(%y : memref<1x32x64xf32>) {
  ^bb0(%a: f32, %b: f32, %r: f32, %o: f32):
    %s = arith.addf %a, %b : f32
    %m = arith.maximumf %s, %zero : f32
    %t = arith.addf %m, %r : f32
    linalg.yield %t : f32
  }
  return
}

// -----

// Two inputs stored alike (both NHWC), the elementwise body between them: both are transposed in blocks.
// CHECK-LABEL: func.func @two_transposed(
// CHECK-COUNT-2: vector.load %arg0
// CHECK:         vector.load %arg1
// CHECK:         vector.shuffle
// CHECK:         arith.mulf %{{.*}}, %{{.*}} : vector<16xf32>
// CHECK:         vector.store
#t2 = affine_map<(d0, d1) -> (d1, d0)>
#i2 = affine_map<(d0, d1) -> (d0, d1)>
func.func @two_transposed(%a: memref<32x48xf32>, %b: memref<32x48xf32>, %y: memref<48x32xf32>) {
  linalg.generic {indexing_maps = [#t2, #t2, #i2], iterator_types = ["parallel", "parallel"]}
      ins(%a, %b : memref<32x48xf32>, memref<32x48xf32>) outs(%y : memref<48x32xf32>) {
  ^bb0(%x: f32, %z: f32, %o: f32):
    %p = arith.mulf %x, %z : f32
    linalg.yield %p : f32
  }
  return
}

// -----

// Maps left as they are: a further input walked by q through a stride (a gather), arithmetic on bf16 (the
// back end's to widen), a body that reads the output.
// CHECK-LABEL: func.func @map_rejects(
// CHECK-COUNT-3: linalg.generic
// CHECK-NOT:     vector.shuffle
#mt = affine_map<(d0, d1) -> (d1, d0)>
#mi = affine_map<(d0, d1) -> (d0, d1)>
func.func @map_rejects(%a: memref<32x48xf32>, %g: memref<48x32xf32, strided<[1, 48]>>, %y: memref<48x32xf32>,
                       %h: memref<32x48xbf16>, %z: memref<48x32xbf16>) {
  linalg.generic {indexing_maps = [#mt, #mi, #mi], iterator_types = ["parallel", "parallel"]}
      ins(%a, %g : memref<32x48xf32>, memref<48x32xf32, strided<[1, 48]>>) outs(%y : memref<48x32xf32>) {
  ^bb0(%x: f32, %w: f32, %o: f32):
    %p = arith.addf %x, %w : f32
    linalg.yield %p : f32
  }
  linalg.generic {indexing_maps = [#mt, #mi], iterator_types = ["parallel", "parallel"]}
      ins(%h : memref<32x48xbf16>) outs(%z : memref<48x32xbf16>) {
  ^bb0(%x: bf16, %o: bf16):
    %n = arith.negf %x : bf16
    linalg.yield %n : bf16
  }
  linalg.generic {indexing_maps = [#mt, #mi], iterator_types = ["parallel", "parallel"]}
      ins(%a : memref<32x48xf32>) outs(%y : memref<48x32xf32>) {
  ^bb0(%x: f32, %o: f32):
    %p = arith.addf %x, %o : f32
    linalg.yield %p : f32
  }
  return
}

// -----

// A 0-d map (a scalar epilogue, as a log-sum-exp leaves one) permutes nothing.
// CHECK-LABEL: func.func @scalar_map(
// CHECK:         linalg.generic
#s = affine_map<() -> ()>
func.func @scalar_map(%a: memref<f32>, %b: memref<f32>) {
  linalg.generic {indexing_maps = [#s, #s, #s], iterator_types = []}
      ins(%a, %b : memref<f32>, memref<f32>) outs(%a : memref<f32>) {
  ^bb0(%x: f32, %y: f32, %o: f32):
    %l = math.log %x : f32
    %s = arith.addf %l, %y : f32
    linalg.yield %s : f32
  }
  return
}

// -----

// Two outputs (a value and its negation, both written transposed): not a map this pass rebuilds.
// CHECK-LABEL: func.func @two_outputs(
// CHECK:         linalg.generic
// CHECK-NOT:     vector.shuffle
#a2 = affine_map<(d0, d1) -> (d1, d0)>
#b2 = affine_map<(d0, d1) -> (d0, d1)>
func.func @two_outputs(%x: memref<32x48xf32>, %y: memref<48x32xf32>, %z: memref<48x32xf32>) {
  linalg.generic {indexing_maps = [#a2, #b2, #b2], iterator_types = ["parallel", "parallel"]}
      ins(%x : memref<32x48xf32>) outs(%y, %z : memref<48x32xf32>, memref<48x32xf32>) {
  ^bb0(%a: f32, %o: f32, %p: f32):
    %n = arith.negf %a : f32
    linalg.yield %a, %n : f32, f32
  }
  return
}
