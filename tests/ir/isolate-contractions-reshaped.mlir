// Pass isolate-contractions on an epilogue that reads the contraction's result through a tensor.expand_shape
// (a convolution's product viewed as its NHWC or NCHW output): the elementwise generics are rewritten onto
// the product's own loops (their other inputs collapsed the same way: a per-channel vector as it is, a
// (1, 1, 1, C) or (1, C, 1, 1) constant to C, a full tensor to the product's shape) and move into the
// contraction's function; the expand follows the call. Rejected (left after the call): an input that reads
// part of a reshaped group (one of the grouped H, W), a generic that reads its output.
// RUN: %pbsdk opt %s --split-input-file -p isolate-contractions | filecheck %s

// NHWC: bias per channel (d3), a (1, 1, 1, C) scale read as (d0, 0, 0, d3) (d0 of extent 1), a residual,
// then ReLU: four generics in.
// CHECK-LABEL: func.func @nhwc(
// CHECK-SAME:      %[[A:[^:]*]]: tensor<196x64xf32>, %[[W:[^:]*]]: tensor<64x32xf32>, %[[B:[^:]*]]: tensor<32xf32>, %[[S:[^:]*]]: tensor<1x1x1x32xf32>, %[[R:[^:]*]]: tensor<1x14x14x32xf32>)
// CHECK-DAG:     %[[SC:.*]] = tensor.collapse_shape %[[S]] {{\[}}[0, 1, 2, 3]] : tensor<1x1x1x32xf32> into tensor<32xf32>
// CHECK-DAG:     %[[RC:.*]] = tensor.collapse_shape %[[R]] {{\[}}[0, 1, 2], [3]] : tensor<1x14x14x32xf32> into tensor<196x32xf32>
// CHECK:         %[[C:.*]] = call @__pbsdk_contraction0(%[[A]], %[[W]], %[[B]], %[[SC]], %[[RC]]) : {{.*}} -> tensor<196x32xf32>
// CHECK-NEXT:    %[[E:.*]] = tensor.expand_shape %[[C]] {{\[}}[0, 1, 2], [3]] output_shape [1, 14, 14, 32]
// CHECK-NEXT:    return %[[E]]
// CHECK-LABEL: func.func private @__pbsdk_contraction0(
// CHECK:         linalg.matmul
// CHECK-COUNT-4: linalg.generic {{.*}} iterator_types = ["parallel", "parallel"]
// CHECK-NOT:     linalg.generic
// CHECK:         return
#id4 = affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>
#ch = affine_map<(d0, d1, d2, d3) -> (d3)>
#ch4 = affine_map<(d0, d1, d2, d3) -> (d0, 0, 0, d3)>
func.func @nhwc(%a: tensor<196x64xf32>, %w: tensor<64x32xf32>, %b: tensor<32xf32>, %s: tensor<1x1x1x32xf32>,
                %r: tensor<1x14x14x32xf32>) -> tensor<1x14x14x32xf32> {
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<196x32xf32>
  %f = linalg.fill ins(%zero : f32) outs(%e : tensor<196x32xf32>) -> tensor<196x32xf32>
  %mm = linalg.matmul ins(%a, %w : tensor<196x64xf32>, tensor<64x32xf32>) outs(%f : tensor<196x32xf32>) -> tensor<196x32xf32>
  %x = tensor.expand_shape %mm [[0, 1, 2], [3]] output_shape [1, 14, 14, 32] : tensor<196x32xf32> into tensor<1x14x14x32xf32>
  %e1 = tensor.empty() : tensor<1x14x14x32xf32>
  %g1 = linalg.generic {indexing_maps = [#id4, #ch, #id4], iterator_types = ["parallel", "parallel", "parallel", "parallel"]}
      ins(%x, %b : tensor<1x14x14x32xf32>, tensor<32xf32>) outs(%e1 : tensor<1x14x14x32xf32>) {
  ^bb0(%p: f32, %q: f32, %o: f32):
    %v = arith.addf %p, %q : f32
    linalg.yield %v : f32
  } -> tensor<1x14x14x32xf32>
  %e2 = tensor.empty() : tensor<1x14x14x32xf32>
  %g2 = linalg.generic {indexing_maps = [#id4, #ch4, #id4], iterator_types = ["parallel", "parallel", "parallel", "parallel"]}
      ins(%g1, %s : tensor<1x14x14x32xf32>, tensor<1x1x1x32xf32>) outs(%e2 : tensor<1x14x14x32xf32>) {
  ^bb0(%p: f32, %q: f32, %o: f32):
    %v = arith.mulf %p, %q : f32
    linalg.yield %v : f32
  } -> tensor<1x14x14x32xf32>
  %e3 = tensor.empty() : tensor<1x14x14x32xf32>
  %g3 = linalg.generic {indexing_maps = [#id4, #id4, #id4], iterator_types = ["parallel", "parallel", "parallel", "parallel"]}
      ins(%g2, %r : tensor<1x14x14x32xf32>, tensor<1x14x14x32xf32>) outs(%e3 : tensor<1x14x14x32xf32>) {
  ^bb0(%p: f32, %q: f32, %o: f32):
    %v = arith.addf %p, %q : f32
    linalg.yield %v : f32
  } -> tensor<1x14x14x32xf32>
  %e4 = tensor.empty() : tensor<1x14x14x32xf32>
  %g4 = linalg.generic {indexing_maps = [#id4, #id4], iterator_types = ["parallel", "parallel", "parallel", "parallel"]}
      ins(%g3 : tensor<1x14x14x32xf32>) outs(%e4 : tensor<1x14x14x32xf32>) {
  ^bb0(%p: f32, %o: f32):
    %v = arith.maximumf %p, %zero : f32
    linalg.yield %v : f32
  } -> tensor<1x14x14x32xf32>
  return %g4 : tensor<1x14x14x32xf32>
}

// -----

// NCHW (a 1x1 convolution as W[O, C] X[C, HW]): a (1, O, 1, 1) bias reads the first group.
// CHECK-LABEL: func.func @nchw(
// CHECK-SAME:      %{{[^:]*}}: tensor<32x64xf32>, %{{[^:]*}}: tensor<64x49xf32>, %[[B:[^:]*]]: tensor<1x32x1x1xf32>)
// CHECK:         %[[BC:.*]] = tensor.collapse_shape %[[B]] {{\[}}[0, 1, 2, 3]] : tensor<1x32x1x1xf32> into tensor<32xf32>
// CHECK:         call @__pbsdk_contraction0(%{{.*}}, %{{.*}}, %[[BC]])
// CHECK-NEXT:    tensor.expand_shape {{.*}} {{\[}}[0, 1], [2, 3]] output_shape [1, 32, 7, 7]
// CHECK-LABEL: func.func private @__pbsdk_contraction0(
// CHECK:         linalg.generic {indexing_maps = [#{{.*}}, #[[ROW:.*]], #{{.*}}], iterator_types = ["parallel", "parallel"]}
#id4n = affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>
#row4 = affine_map<(d0, d1, d2, d3) -> (d0, d1, 0, 0)>
func.func @nchw(%w: tensor<32x64xf32>, %x: tensor<64x49xf32>, %b: tensor<1x32x1x1xf32>) -> tensor<1x32x7x7xf32> {
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<32x49xf32>
  %f = linalg.fill ins(%zero : f32) outs(%e : tensor<32x49xf32>) -> tensor<32x49xf32>
  %mm = linalg.matmul ins(%w, %x : tensor<32x64xf32>, tensor<64x49xf32>) outs(%f : tensor<32x49xf32>) -> tensor<32x49xf32>
  %y = tensor.expand_shape %mm [[0, 1], [2, 3]] output_shape [1, 32, 7, 7] : tensor<32x49xf32> into tensor<1x32x7x7xf32>
  %e1 = tensor.empty() : tensor<1x32x7x7xf32>
  %g = linalg.generic {indexing_maps = [#id4n, #row4, #id4n], iterator_types = ["parallel", "parallel", "parallel", "parallel"]}
      ins(%y, %b : tensor<1x32x7x7xf32>, tensor<1x32x1x1xf32>) outs(%e1 : tensor<1x32x7x7xf32>) {
  ^bb0(%p: f32, %q: f32, %o: f32):
    %v = arith.addf %p, %q : f32
    linalg.yield %v : f32
  } -> tensor<1x32x7x7xf32>
  return %g : tensor<1x32x7x7xf32>
}

// -----

// Rejected: the input reads W alone (d2) of the grouped (n, h, w); the expand and the generic stay after
// the call, and the function holds the matmul only.
// CHECK-LABEL: func.func @partial_group(
// CHECK:         call @__pbsdk_contraction0(
// CHECK-NEXT:    tensor.expand_shape
// CHECK:         linalg.generic
// CHECK-LABEL: func.func private @__pbsdk_contraction0(
// CHECK-NOT:     linalg.generic
#id4p = affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>
#w = affine_map<(d0, d1, d2, d3) -> (d2)>
func.func @partial_group(%a: tensor<196x64xf32>, %w: tensor<64x32xf32>, %c: tensor<14xf32>) -> tensor<1x14x14x32xf32> {
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<196x32xf32>
  %f = linalg.fill ins(%zero : f32) outs(%e : tensor<196x32xf32>) -> tensor<196x32xf32>
  %mm = linalg.matmul ins(%a, %w : tensor<196x64xf32>, tensor<64x32xf32>) outs(%f : tensor<196x32xf32>) -> tensor<196x32xf32>
  %x = tensor.expand_shape %mm [[0, 1, 2], [3]] output_shape [1, 14, 14, 32] : tensor<196x32xf32> into tensor<1x14x14x32xf32>
  %e1 = tensor.empty() : tensor<1x14x14x32xf32>
  %g = linalg.generic {indexing_maps = [#id4p, #w, #id4p], iterator_types = ["parallel", "parallel", "parallel", "parallel"]}
      ins(%x, %c : tensor<1x14x14x32xf32>, tensor<14xf32>) outs(%e1 : tensor<1x14x14x32xf32>) {
  ^bb0(%p: f32, %q: f32, %o: f32):
    %v = arith.addf %p, %q : f32
    linalg.yield %v : f32
  } -> tensor<1x14x14x32xf32>
  return %g : tensor<1x14x14x32xf32>
}

// -----

// A residual dequantized in NHWC (i8 -> f32, times a scale, only the epilogue reads it) is collapsed above
// its elementwise chain (so fusion never meets a reshape) and moves in with the epilogue: the function takes
// the i8 residual, collapsed to the product's shape.
// CHECK-LABEL: func.func @dequantized_residual(
// CHECK-SAME:      %[[A:[^:]*]]: tensor<196x64xi8>, %[[W:[^:]*]]: tensor<64x32xi8>, %[[R:[^:]*]]: tensor<1x14x14x32xi8>)
// CHECK:         %[[RC:.*]] = tensor.collapse_shape %[[R]] {{\[}}[0, 1, 2], [3]] : tensor<1x14x14x32xi8> into tensor<196x32xi8>
// CHECK-NOT:     linalg.generic
// CHECK:         call @__pbsdk_contraction0(%[[A]], %[[W]], %[[RC]]) : {{.*}} -> tensor<196x32xf32>
// CHECK-LABEL: func.func private @__pbsdk_contraction0(
// CHECK:         linalg.matmul
// CHECK:         linalg.generic {{.*}} iterator_types = ["parallel", "parallel"]} ins(%{{.*}} : tensor<196x32xi8>)
// CHECK:         arith.sitofp {{.*}} : i8 to f32
// CHECK:         linalg.generic {{.*}} iterator_types = ["parallel", "parallel"]
// CHECK-NOT:     tensor.collapse_shape
// CHECK:         return
#id4r = affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>
func.func @dequantized_residual(%a: tensor<196x64xi8>, %w: tensor<64x32xi8>, %r: tensor<1x14x14x32xi8>)
    -> tensor<1x14x14x32xf32> {
  %zero = arith.constant 0 : i32
  %e = tensor.empty() : tensor<196x32xi32>
  %f = linalg.fill ins(%zero : i32) outs(%e : tensor<196x32xi32>) -> tensor<196x32xi32>
  %mm = linalg.matmul ins(%a, %w : tensor<196x64xi8>, tensor<64x32xi8>) outs(%f : tensor<196x32xi32>) -> tensor<196x32xi32>
  %x = tensor.expand_shape %mm [[0, 1, 2], [3]] output_shape [1, 14, 14, 32] : tensor<196x32xi32> into tensor<1x14x14x32xi32>
  %e0 = tensor.empty() : tensor<1x14x14x32xf32>
  %deq = linalg.generic {indexing_maps = [#id4r, #id4r], iterator_types = ["parallel", "parallel", "parallel", "parallel"]}
      ins(%r : tensor<1x14x14x32xi8>) outs(%e0 : tensor<1x14x14x32xf32>) {
  ^bb0(%p: i8, %o: f32):
    %s = arith.constant 0.25 : f32
    %v = arith.sitofp %p : i8 to f32
    %u = arith.mulf %v, %s : f32
    linalg.yield %u : f32
  } -> tensor<1x14x14x32xf32>
  %e1 = tensor.empty() : tensor<1x14x14x32xf32>
  %g1 = linalg.generic {indexing_maps = [#id4r, #id4r, #id4r], iterator_types = ["parallel", "parallel", "parallel", "parallel"]}
      ins(%x, %deq : tensor<1x14x14x32xi32>, tensor<1x14x14x32xf32>) outs(%e1 : tensor<1x14x14x32xf32>) {
  ^bb0(%p: i32, %q: f32, %o: f32):
    %v = arith.sitofp %p : i32 to f32
    %u = arith.addf %v, %q : f32
    linalg.yield %u : f32
  } -> tensor<1x14x14x32xf32>
  return %g1 : tensor<1x14x14x32xf32>
}
