// Pass collapse-loops (core; the cpu target's stage): adjacent loops of one kind that every operand walks
// contiguously (or not at all) become one loop over collapsed views, so a late CNN layer's 14x14 or 7x7
// image is one run the host compiler vectorises instead of an unrolled row of 14 or 7.
// RUN: %pbsdk opt %s --split-input-file -p collapse-loops | filecheck %s

// BatchNorm + ReLU over NCHW, per-channel scale: (n, c, h, w) -> (n, c, h*w); the scale keeps its map.
// CHECK-LABEL: func.func @bn_relu(
// CHECK-SAME:      %[[X:.*]]: memref<2x96x7x7xf32>, %[[S:.*]]: memref<96xf32>, %[[O:.*]]: memref<2x96x7x7xf32>)
// CHECK-DAG:     %[[XC:.*]] = memref.collapse_shape %[[X]] {{\[}}[0], [1], [2, 3]] : memref<2x96x7x7xf32> into memref<2x96x49xf32>
// CHECK-DAG:     %[[OC:.*]] = memref.collapse_shape %[[O]] {{\[}}[0], [1], [2, 3]] : memref<2x96x7x7xf32> into memref<2x96x49xf32>
// CHECK:         linalg.generic {indexing_maps = [#[[ID:.*]], #[[CH:.*]], #[[ID]]], iterator_types = ["parallel", "parallel", "parallel"]}
// CHECK-SAME:        ins(%[[XC]], %[[S]] : memref<2x96x49xf32>, memref<96xf32>) outs(%[[OC]] : memref<2x96x49xf32>)
// CHECK:           arith.mulf
// CHECK:           arith.maximumf
#id = affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>
#ch = affine_map<(d0, d1, d2, d3) -> (d1)>
func.func @bn_relu(%x: memref<2x96x7x7xf32>, %s: memref<96xf32>, %o: memref<2x96x7x7xf32>) {
  %zero = arith.constant 0.0 : f32
  linalg.generic {indexing_maps = [#id, #ch, #id], iterator_types = ["parallel", "parallel", "parallel", "parallel"]}
      ins(%x, %s : memref<2x96x7x7xf32>, memref<96xf32>) outs(%o : memref<2x96x7x7xf32>) {
  ^bb0(%a: f32, %b: f32, %c: f32):
    %m = arith.mulf %a, %b : f32
    %r = arith.maximumf %m, %zero : f32
    linalg.yield %r : f32
  }
  return
}

// -----

// A global average pool's sum: the 7x7 window is one reduction over 49 values; n and c one parallel loop.
// CHECK-LABEL: func.func @pool_sum(
// CHECK:         memref.collapse_shape %{{.*}} {{\[}}[0, 1], [2, 3]] : memref<1x576x7x7xf32> into memref<576x49xf32>
// CHECK:         memref.collapse_shape %{{.*}} {{\[}}[0, 1]] : memref<1x576xf32> into memref<576xf32>
// CHECK:         linalg.generic {{.*}} iterator_types = ["parallel", "reduction"]
#x = affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>
#o = affine_map<(d0, d1, d2, d3) -> (d0, d1)>
func.func @pool_sum(%x: memref<1x576x7x7xf32>, %o: memref<1x576xf32>) {
  linalg.generic {indexing_maps = [#x, #o], iterator_types = ["parallel", "parallel", "reduction", "reduction"]}
      ins(%x : memref<1x576x7x7xf32>) outs(%o : memref<1x576xf32>) {
  ^bb0(%a: f32, %acc: f32):
    %s = arith.addf %acc, %a : f32
    linalg.yield %s : f32
  }
  return
}

// -----

// Nothing to merge: a transpose's operands walk no two adjacent loops together; an op reading its indices
// stays as it is.
// CHECK-LABEL: func.func @transpose2d(
// CHECK-NOT:     memref.collapse_shape
// CHECK:         linalg.generic
// CHECK-LABEL: func.func @reads_index(
// CHECK-NOT:     memref.collapse_shape
// CHECK:         linalg.index
#a = affine_map<(d0, d1) -> (d1, d0)>
#b = affine_map<(d0, d1) -> (d0, d1)>
func.func @transpose2d(%x: memref<8x16xf32>, %o: memref<16x8xf32>) {
  linalg.generic {indexing_maps = [#a, #b], iterator_types = ["parallel", "parallel"]}
      ins(%x : memref<8x16xf32>) outs(%o : memref<16x8xf32>) {
  ^bb0(%v: f32, %w: f32):
    linalg.yield %v : f32
  }
  return
}
func.func @reads_index(%o: memref<4x8xindex>) {
  linalg.generic {indexing_maps = [#b], iterator_types = ["parallel", "parallel"]} outs(%o : memref<4x8xindex>) {
  ^bb0(%w: index):
    %i = linalg.index 1 : index
    linalg.yield %i : index
  }
  return
}
