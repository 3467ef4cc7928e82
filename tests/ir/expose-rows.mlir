// Pass expose-rows (core; the cpu target's stage before fuse-rows): in entry functions, ops whose leading
// dimensions are 1 (batch 1) are rebuilt on views without them, and strided memref.copy becomes
// linalg.copy, so that fuse-rows finds rows to split over the cores.
// RUN: %pbsdk opt %s --split-input-file -p expose-rows | filecheck %s
// RUN: %pbsdk opt %s --split-input-file --target cpu -p expose-rows --options expose_rows=false | filecheck %s --check-prefix=OFF
// On one thread there is nothing to split: the pass leaves the IR alone.
// RUN: %pbsdk opt %s --split-input-file -p expose-rows --options threads=1 | filecheck %s --check-prefix=OFF

// The copy of an image into its padded buffer: a linalg.copy of 4 rows; the fill of the padded buffer: 6.
// CHECK-LABEL: func.func @pad(
// CHECK-SAME:      %[[X:.*]]: memref<1x4x4x8xf32>, %[[P:.*]]: memref<1x6x6x8xf32>)
// CHECK:         %[[PC:.*]] = memref.collapse_shape %[[P]] {{\[}}[0, 1], [2], [3]] : memref<1x6x6x8xf32> into memref<6x6x8xf32>
// CHECK-NEXT:    linalg.fill ins(%{{.*}} : f32) outs(%[[PC]] : memref<6x6x8xf32>)
// CHECK:         %[[IN:.*]] = memref.subview %[[P]][0, 1, 1, 0]
// CHECK:         %[[XC:.*]] = memref.collapse_shape %[[X]] {{\[}}[0, 1], [2], [3]] : memref<1x4x4x8xf32> into memref<4x4x8xf32>
// CHECK-NEXT:    %[[INC:.*]] = memref.collapse_shape %[[IN]] {{\[}}[0, 1], [2], [3]] : memref<1x4x4x8xf32, strided<[288, 48, 8, 1], offset: 56>> into memref<4x4x8xf32, strided<[48, 8, 1], offset: 56>>
// CHECK-NEXT:    linalg.copy {{.*}}ins(%[[XC]] : memref<4x4x8xf32>) outs(%[[INC]] : memref<4x4x8xf32, strided<[48, 8, 1], offset: 56>>)
// CHECK-NOT:     memref.copy
// OFF-LABEL: func.func @pad(
// OFF:         linalg.fill ins(%{{.*}} : f32) outs(%{{.*}} : memref<1x6x6x8xf32>)
// OFF:         memref.copy
func.func @pad(%x: memref<1x4x4x8xf32>, %p: memref<1x6x6x8xf32>) {
  %zero = arith.constant 0.0 : f32
  linalg.fill ins(%zero : f32) outs(%p : memref<1x6x6x8xf32>)
  %in = memref.subview %p[0, 1, 1, 0] [1, 4, 4, 8] [1, 1, 1, 1] : memref<1x6x6x8xf32> to memref<1x4x4x8xf32, strided<[288, 48, 8, 1], offset: 56>>
  memref.copy %x, %in : memref<1x4x4x8xf32> to memref<1x4x4x8xf32, strided<[288, 48, 8, 1], offset: 56>>
  return
}

// -----

// An NCHW -> NHWC transpose at batch 1: upstream linalg-fold-unit-extent-dims drops the unit loop.
// CHECK-LABEL: func.func @to_nhwc(
// CHECK:         memref.collapse_shape {{.*}} : memref<1x8x4x4xf32> into memref<8x4x4xf32>
// CHECK:         memref.collapse_shape {{.*}} : memref<1x4x4x8xf32> into memref<4x4x8xf32>
// CHECK:         linalg.generic {{.*}} iterator_types = ["parallel", "parallel", "parallel"]
#nchw = affine_map<(d0, d1, d2, d3) -> (d0, d3, d1, d2)>
#nhwc = affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>
func.func @to_nhwc(%x: memref<1x8x4x4xf32>, %y: memref<1x4x4x8xf32>) {
  linalg.generic {indexing_maps = [#nchw, #nhwc], iterator_types = ["parallel", "parallel", "parallel", "parallel"]}
      ins(%x : memref<1x8x4x4xf32>) outs(%y : memref<1x4x4x8xf32>) {
  ^bb0(%a: f32, %o: f32):
    linalg.yield %a : f32
  }
  return
}

// -----

// Left alone: a plain memcpy (identity layouts both sides), a map that reads its indices, and pbsdk's own
// kernels (functions named __pbsdk*).
// CHECK-LABEL: func.func @kept(
// CHECK:         memref.copy %{{.*}}, %{{.*}} : memref<1x4x8xf32> to memref<1x4x8xf32>
// CHECK:         linalg.map outs(%{{.*}} : memref<1x4x8xf32>)
// CHECK-LABEL: func.func @__pbsdk_kernel(
// CHECK:         memref.copy %{{.*}}, %{{.*}} : memref<1x4x8xf32> to memref<1x4x8xf32, strided<[64, 8, 1]>>
func.func @kept(%x: memref<1x4x8xf32>, %y: memref<1x4x8xf32>) {
  memref.copy %x, %y : memref<1x4x8xf32> to memref<1x4x8xf32>
  linalg.map outs(%y : memref<1x4x8xf32>)
    (%init: f32) {
      %i = linalg.index 1 : index
      %f = arith.index_cast %i : index to i32
      %g = arith.sitofp %f : i32 to f32
      linalg.yield %g : f32
    }
  return
}
func.func @__pbsdk_kernel(%x: memref<1x4x8xf32>, %y: memref<1x8x8xf32>) {
  %v = memref.subview %y[0, 0, 0] [1, 4, 8] [1, 1, 1] : memref<1x8x8xf32> to memref<1x4x8xf32, strided<[64, 8, 1]>>
  memref.copy %x, %v : memref<1x4x8xf32> to memref<1x4x8xf32, strided<[64, 8, 1]>>
  return
}

// -----

// A strided copy without unit dimensions (batch 2) becomes linalg.copy as it is.
// CHECK-LABEL: func.func @batch2(
// CHECK:         linalg.copy {{.*}}ins(%{{.*}} : memref<2x4x8xf32>) outs(%{{.*}} : memref<2x4x8xf32, strided<[64, 8, 1]>>)
func.func @batch2(%x: memref<2x4x8xf32>, %y: memref<2x8x8xf32>) {
  %v = memref.subview %y[0, 0, 0] [2, 4, 8] [1, 1, 1] : memref<2x8x8xf32> to memref<2x4x8xf32, strided<[64, 8, 1]>>
  memref.copy %x, %v : memref<2x4x8xf32> to memref<2x4x8xf32, strided<[64, 8, 1]>>
  return
}

// -----

// A linalg.map at batch 1 on a strided output: rebuilt on views without the unit dimension, body unchanged.
// CHECK-LABEL: func.func @map(
// CHECK:         %[[A:.*]] = memref.collapse_shape %{{.*}} {{\[}}[0, 1], [2]] : memref<1x4x8xf32> into memref<4x8xf32>
// CHECK-NEXT:    %[[B:.*]] = memref.collapse_shape %{{.*}} {{\[}}[0, 1], [2]] : memref<1x4x8xf32, strided<[96, 16, 1], offset: 17>> into memref<4x8xf32, strided<[16, 1], offset: 17>>
// CHECK-NEXT:    linalg.map { math.exp } ins(%[[A]] : memref<4x8xf32>) outs(%[[B]] : memref<4x8xf32, strided<[16, 1], offset: 17>>)
func.func @map(%a: memref<1x4x8xf32>, %p: memref<1x6x16xf32>) {
  %b = memref.subview %p[0, 1, 1] [1, 4, 8] [1, 1, 1] : memref<1x6x16xf32> to memref<1x4x8xf32, strided<[96, 16, 1], offset: 17>>
  linalg.map { math.exp } ins(%a : memref<1x4x8xf32>) outs(%b : memref<1x4x8xf32, strided<[96, 16, 1], offset: 17>>)
  return
}
