// Stage direct-conv must leave these alone (see direct-conv.mlir for what it rewrites): they stay
// linalg.generic ops for the generic lowering.
// RUN: %pbsdk opt %s --split-input-file --target cpu --spec intel/xeon-avx512 -p direct-conv | filecheck %s

// f64 (not the stage's dtype) and a body that is not a multiply-accumulate stay linalg.generic ops.
// CHECK-LABEL: func.func @f64(
// CHECK-NOT:     call
// CHECK:         linalg.generic
// CHECK-LABEL: func.func @max_body(
// CHECK-NOT:     call
// CHECK:         linalg.generic
#x = affine_map<(d0, d1, d2, d3, d4, d5, d6, d7) -> (d0, d1 + d5, d2 + d6, d3, d7)>
#w = affine_map<(d0, d1, d2, d3, d4, d5, d6, d7) -> (d5, d6, d7, d3, d4)>
#o = affine_map<(d0, d1, d2, d3, d4, d5, d6, d7) -> (d0, d1, d2, d3, d4)>
func.func @f64(%x: memref<1x6x6x2x2xf64>, %w: memref<3x3x2x2x16xf64>, %o: memref<1x4x4x2x16xf64>) {
  linalg.generic {indexing_maps = [#x, #w, #o],
                  iterator_types = ["parallel", "parallel", "parallel", "parallel", "parallel",
                                    "reduction", "reduction", "reduction"]}
      ins(%x, %w : memref<1x6x6x2x2xf64>, memref<3x3x2x2x16xf64>) outs(%o : memref<1x4x4x2x16xf64>) {
  ^bb0(%a: f64, %b: f64, %acc: f64):
    %m = arith.mulf %a, %b : f64
    %s = arith.addf %acc, %m : f64
    linalg.yield %s : f64
  }
  return
}
func.func @max_body(%x: memref<1x6x6x2x2xf32>, %w: memref<3x3x2x2x16xf32>, %o: memref<1x4x4x2x16xf32>) {
  linalg.generic {indexing_maps = [#x, #w, #o],
                  iterator_types = ["parallel", "parallel", "parallel", "parallel", "parallel",
                                    "reduction", "reduction", "reduction"]}
      ins(%x, %w : memref<1x6x6x2x2xf32>, memref<3x3x2x2x16xf32>) outs(%o : memref<1x4x4x2x16xf32>) {
  ^bb0(%a: f32, %b: f32, %acc: f32):
    %m = arith.mulf %a, %b : f32
    %s = arith.maximumf %acc, %m : f32
    linalg.yield %s : f32
  }
  return
}

// -----

// The input read at the output channel's loop (d4) instead of the input channel's (d7): not a convolution the
// stage knows; nor one whose loops are all parallel.
// CHECK-LABEL: func.func @wrong_channel(
// CHECK-NOT:     call
// CHECK:         linalg.generic
// CHECK-LABEL: func.func @all_parallel(
// CHECK-NOT:     call
// CHECK:         linalg.generic
#x = affine_map<(d0, d1, d2, d3, d4, d5, d6, d7) -> (d0, d1 + d5, d2 + d6, d3, d4)>
#xp = affine_map<(d0, d1, d2, d3, d4, d5, d6, d7) -> (d0, d1 + d5, d2 + d6, d3, d7)>
#w = affine_map<(d0, d1, d2, d3, d4, d5, d6, d7) -> (d5, d6, d7, d3, d4)>
#o = affine_map<(d0, d1, d2, d3, d4, d5, d6, d7) -> (d0, d1, d2, d3, d4)>
func.func @wrong_channel(%x: memref<1x6x6x2x16xf32>, %w: memref<3x3x2x2x16xf32>, %o: memref<1x4x4x2x16xf32>) {
  linalg.generic {indexing_maps = [#x, #w, #o],
                  iterator_types = ["parallel", "parallel", "parallel", "parallel", "parallel",
                                    "reduction", "reduction", "reduction"]}
      ins(%x, %w : memref<1x6x6x2x16xf32>, memref<3x3x2x2x16xf32>) outs(%o : memref<1x4x4x2x16xf32>) {
  ^bb0(%a: f32, %b: f32, %acc: f32):
    %m = arith.mulf %a, %b : f32
    %s = arith.addf %acc, %m : f32
    linalg.yield %s : f32
  }
  return
}
func.func @all_parallel(%x: memref<1x6x6x2x2xf32>, %w: memref<3x3x2x2x16xf32>, %o: memref<1x4x4x2x16xf32>) {
  linalg.generic {indexing_maps = [#xp, #w, #o],
                  iterator_types = ["parallel", "parallel", "parallel", "parallel", "parallel", "parallel", "parallel", "parallel"]}
      ins(%x, %w : memref<1x6x6x2x2xf32>, memref<3x3x2x2x16xf32>) outs(%o : memref<1x4x4x2x16xf32>) {
  ^bb0(%a: f32, %b: f32, %acc: f32):
    %m = arith.mulf %a, %b : f32
    %s = arith.addf %acc, %m : f32
    linalg.yield %s : f32
  }
  return
}

// -----

// An output whose innermost dimension is strided: the kernel's vector stores run along it.
// CHECK-LABEL: func.func @strided_out(
// CHECK-NOT:     call
// CHECK:         linalg.generic
#x = affine_map<(d0, d1, d2, d3, d4, d5, d6, d7) -> (d0, d1 + d5, d2 + d6, d3, d7)>
#w = affine_map<(d0, d1, d2, d3, d4, d5, d6, d7) -> (d5, d6, d7, d3, d4)>
#o = affine_map<(d0, d1, d2, d3, d4, d5, d6, d7) -> (d0, d1, d2, d3, d4)>
func.func @strided_out(%x: memref<1x6x6x2x2xf32>, %w: memref<3x3x2x2x16xf32>, %o: memref<1x4x4x2x16xf32, strided<[2048, 512, 128, 64, 2]>>) {
  linalg.generic {indexing_maps = [#x, #w, #o],
                  iterator_types = ["parallel", "parallel", "parallel", "parallel", "parallel",
                                    "reduction", "reduction", "reduction"]}
      ins(%x, %w : memref<1x6x6x2x2xf32>, memref<3x3x2x2x16xf32>) outs(%o : memref<1x4x4x2x16xf32, strided<[2048, 512, 128, 64, 2]>>) {
  ^bb0(%a: f32, %b: f32, %acc: f32):
    %m = arith.mulf %a, %b : f32
    %s = arith.addf %acc, %m : f32
    linalg.yield %s : f32
  }
  return
}
