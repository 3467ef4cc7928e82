// Pass isolate-contractions: each named contraction on tensors moves, with its zero fill and its
// elementwise epilogue, into a private function that the caller calls (so fusion cannot generalise it).
// RUN: %pbsdk opt %s --split-input-file -p isolate-contractions | filecheck %s
// With the cpu target's option pack=false the pass does nothing.
// RUN: %pbsdk opt %s --split-input-file --target cpu -p isolate-contractions --options pack=false | filecheck %s --check-prefix=OFF

// The zero fill goes in with the matmul.
// CHECK-LABEL: func.func @mm(
// CHECK-SAME:      %[[A:.*]]: tensor<4x8xf32>, %[[B:.*]]: tensor<8x16xf32>)
// CHECK-NOT:     linalg.
// CHECK:         %[[R:.*]] = call @__pbsdk_contraction0(%[[A]], %[[B]]) : (tensor<4x8xf32>, tensor<8x16xf32>) -> tensor<4x16xf32>
// CHECK-NEXT:    return %[[R]]
// CHECK-LABEL: func.func private @__pbsdk_contraction0(
// CHECK:         linalg.fill
// CHECK-NEXT:    %[[MM:.*]] = linalg.matmul
// CHECK-NEXT:    return %[[MM]]
// OFF-LABEL: func.func @mm(
// OFF-NOT:     call
// OFF:         linalg.fill
// OFF-NEXT:    linalg.matmul
func.func @mm(%a: tensor<4x8xf32>, %b: tensor<8x16xf32>) -> tensor<4x16xf32> {
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<4x16xf32>
  %f = linalg.fill ins(%zero : f32) outs(%e : tensor<4x16xf32>) -> tensor<4x16xf32>
  %mm = linalg.matmul ins(%a, %b : tensor<4x8xf32>, tensor<8x16xf32>) outs(%f : tensor<4x16xf32>) -> tensor<4x16xf32>
  return %mm : tensor<4x16xf32>
}

// -----

// The bias + relu epilogue goes in too; its other operand becomes an argument, the constant is cloned.
// CHECK-LABEL: func.func @mm_bias_relu(
// CHECK-SAME:      %[[A:.*]]: tensor<4x8xf32>, %[[B:.*]]: tensor<8x16xf32>, %[[C:.*]]: tensor<4x16xf32>, %[[BIAS:.*]]: tensor<16xf32>)
// CHECK-NOT:     linalg.
// CHECK:         %[[R:.*]] = call @__pbsdk_contraction0(%[[A]], %[[B]], %[[C]], %[[BIAS]])
// CHECK-NEXT:    return %[[R]]
// CHECK-LABEL: func.func private @__pbsdk_contraction0(
// CHECK:         %[[MM:.*]] = linalg.matmul
// CHECK:         %[[EP:.*]] = linalg.generic {{.*}} ins(%[[MM]], %{{.*}} : tensor<4x16xf32>, tensor<16xf32>)
// CHECK:           arith.addf
// CHECK-NEXT:      arith.maximumf
// CHECK:         return %[[EP]]
#id = affine_map<(d0, d1) -> (d0, d1)>
#row = affine_map<(d0, d1) -> (d1)>
func.func @mm_bias_relu(%a: tensor<4x8xf32>, %b: tensor<8x16xf32>, %c: tensor<4x16xf32>, %bias: tensor<16xf32>) -> tensor<4x16xf32> {
  %zero = arith.constant 0.0 : f32
  %mm = linalg.matmul ins(%a, %b : tensor<4x8xf32>, tensor<8x16xf32>) outs(%c : tensor<4x16xf32>) -> tensor<4x16xf32>
  %e = tensor.empty() : tensor<4x16xf32>
  %r = linalg.generic {indexing_maps = [#id, #row, #id], iterator_types = ["parallel", "parallel"]}
      ins(%mm, %bias : tensor<4x16xf32>, tensor<16xf32>) outs(%e : tensor<4x16xf32>) {
  ^bb0(%x: f32, %y: f32, %o: f32):
    %s = arith.addf %x, %y : f32
    %m = arith.maximumf %s, %zero : f32
    linalg.yield %m : f32
  } -> tensor<4x16xf32>
  return %r : tensor<4x16xf32>
}

// -----

// A batch_matmul whose result is also returned keeps its consumer outside: only the contraction moves.
// CHECK-LABEL: func.func @two_uses(
// CHECK:         %[[R:.*]] = call @__pbsdk_contraction0(
// CHECK:         %[[N:.*]] = linalg.generic {{.*}} ins(%[[R]] :
// CHECK:           arith.negf
// CHECK:         return %[[R]], %[[N]]
// CHECK-LABEL: func.func private @__pbsdk_contraction0(
// CHECK-NEXT:    %[[MM:.*]] = linalg.batch_matmul
// CHECK-NEXT:    return %[[MM]]
func.func @two_uses(%a: tensor<2x4x8xf32>, %b: tensor<2x8x4xf32>, %c: tensor<2x4x4xf32>) -> (tensor<2x4x4xf32>, tensor<2x4x4xf32>) {
  %mm = linalg.batch_matmul ins(%a, %b : tensor<2x4x8xf32>, tensor<2x8x4xf32>) outs(%c : tensor<2x4x4xf32>) -> tensor<2x4x4xf32>
  %e = tensor.empty() : tensor<2x4x4xf32>
  %r = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2) -> (d0, d1, d2)>, affine_map<(d0, d1, d2) -> (d0, d1, d2)>], iterator_types = ["parallel", "parallel", "parallel"]}
      ins(%mm : tensor<2x4x4xf32>) outs(%e : tensor<2x4x4xf32>) {
  ^bb0(%x: f32, %o: f32):
    %n = arith.negf %x : f32
    linalg.yield %n : f32
  } -> tensor<2x4x4xf32>
  return %mm, %r : tensor<2x4x4xf32>, tensor<2x4x4xf32>
}

// -----

// A contraction on buffers is not this pass's business.
// CHECK-LABEL: func.func @on_buffers(
// CHECK-NEXT:    linalg.matmul ins(%{{.*}}, %{{.*}} : memref<4x8xf32>, memref<8x16xf32>)
// CHECK-NEXT:    return
func.func @on_buffers(%a: memref<4x8xf32>, %b: memref<8x16xf32>, %c: memref<4x16xf32>) {
  linalg.matmul ins(%a, %b : memref<4x8xf32>, memref<8x16xf32>) outs(%c : memref<4x16xf32>)
  return
}

// -----

// An epilogue operand made by elementwise ops that only it reads (a dequantized i8 residual: i8 -> f32,
// times a scale) moves in with it: the function takes the i8 tensor, and fusion there reads it in the
// epilogue. The dequantized %keep is also returned, so its chain stays outside (an argument).
// CHECK-LABEL: func.func @residual(
// CHECK-SAME:      %[[A:.*]]: tensor<4x8xi8>, %[[B:.*]]: tensor<8x16xi8>, %[[R:.*]]: tensor<4x16xi8>, %[[K:.*]]: tensor<4x16xi8>)
// CHECK:         %[[KEEP:.*]] = linalg.generic {{.*}} ins(%[[K]] : tensor<4x16xi8>)
// CHECK-NOT:     linalg.generic
// CHECK:         call @__pbsdk_contraction0(%[[A]], %[[B]], %[[R]], %[[KEEP]]) : (tensor<4x8xi8>, tensor<8x16xi8>, tensor<4x16xi8>, tensor<4x16xf32>) -> tensor<4x16xf32>
// CHECK-LABEL: func.func private @__pbsdk_contraction0(
// CHECK-SAME:      %{{.*}}: tensor<4x8xi8>, %{{.*}}: tensor<8x16xi8>, %[[RI:.*]]: tensor<4x16xi8>, %[[KI:.*]]: tensor<4x16xf32>)
// CHECK:         linalg.matmul
// CHECK:         linalg.generic {{.*}} ins(%[[RI]] : tensor<4x16xi8>)
// CHECK:         arith.sitofp
// CHECK:         linalg.generic {{.*}} ins(%{{.*}}, %[[KI]]
// OFF-LABEL: func.func @residual(
// OFF-NOT:     call
func.func @residual(%a: tensor<4x8xi8>, %b: tensor<8x16xi8>, %r: tensor<4x16xi8>, %k: tensor<4x16xi8>)
    -> (tensor<4x16xf32>, tensor<4x16xf32>) {
  %zero = arith.constant 0 : i32
  %e = tensor.empty() : tensor<4x16xi32>
  %f = linalg.fill ins(%zero : i32) outs(%e : tensor<4x16xi32>) -> tensor<4x16xi32>
  %mm = linalg.matmul ins(%a, %b : tensor<4x8xi8>, tensor<8x16xi8>) outs(%f : tensor<4x16xi32>) -> tensor<4x16xi32>
  %e1 = tensor.empty() : tensor<4x16xf32>
  %deq = linalg.generic {indexing_maps = [affine_map<(i, j) -> (i, j)>, affine_map<(i, j) -> (i, j)>],
                         iterator_types = ["parallel", "parallel"]} ins(%r : tensor<4x16xi8>) outs(%e1 : tensor<4x16xf32>) {
  ^bb0(%x: i8, %o: f32):
    %s = arith.constant 0.5 : f32
    %v = arith.sitofp %x : i8 to f32
    %w = arith.mulf %v, %s : f32
    linalg.yield %w : f32
  } -> tensor<4x16xf32>
  %e2 = tensor.empty() : tensor<4x16xf32>
  %keep = linalg.generic {indexing_maps = [affine_map<(i, j) -> (i, j)>, affine_map<(i, j) -> (i, j)>],
                          iterator_types = ["parallel", "parallel"]} ins(%k : tensor<4x16xi8>) outs(%e2 : tensor<4x16xf32>) {
  ^bb0(%x: i8, %o: f32):
    %v = arith.sitofp %x : i8 to f32
    linalg.yield %v : f32
  } -> tensor<4x16xf32>
  %e3 = tensor.empty() : tensor<4x16xf32>
  %out = linalg.generic {indexing_maps = [affine_map<(i, j) -> (i, j)>, affine_map<(i, j) -> (i, j)>,
                                          affine_map<(i, j) -> (i, j)>, affine_map<(i, j) -> (i, j)>],
                         iterator_types = ["parallel", "parallel"]} ins(%mm, %deq, %keep : tensor<4x16xi32>, tensor<4x16xf32>, tensor<4x16xf32>) outs(%e3 : tensor<4x16xf32>) {
  ^bb0(%x: i32, %y: f32, %z: f32, %o: f32):
    %v = arith.sitofp %x : i32 to f32
    %w = arith.addf %v, %y : f32
    %u = arith.addf %w, %z : f32
    linalg.yield %u : f32
  } -> tensor<4x16xf32>
  return %out, %keep : tensor<4x16xf32>, tensor<4x16xf32>
}

// -----

// An activation that reads the product three times (leaky ReLU as traced: a mask, a scaled copy and a select
// of the two) goes in whole: the region of elementwise ops meets again in the select, which alone is read
// outside.
// CHECK-LABEL: func.func @mm_leaky_relu(
// CHECK-NOT:     linalg.
// CHECK:         %[[R:.*]] = call @__pbsdk_contraction0(
// CHECK-NEXT:    return %[[R]]
// CHECK-LABEL: func.func private @__pbsdk_contraction0(
// CHECK:         %[[MM:.*]] = linalg.matmul
// CHECK:         %[[MASK:.*]] = linalg.generic {{.*}} ins(%[[MM]] :
// CHECK:           arith.cmpf ogt
// CHECK:         %[[NEG:.*]] = linalg.generic {{.*}} ins(%[[MM]] :
// CHECK:           arith.mulf
// CHECK:         %[[SEL:.*]] = linalg.generic {{.*}} ins(%[[MASK]], %[[MM]], %[[NEG]] :
// CHECK:           arith.select
// CHECK:         return %[[SEL]]
// OFF-LABEL: func.func @mm_leaky_relu(
// OFF-NOT:     call
#id = affine_map<(d0, d1) -> (d0, d1)>
func.func @mm_leaky_relu(%a: tensor<4x8xf32>, %b: tensor<8x16xf32>, %c: tensor<4x16xf32>) -> tensor<4x16xf32> {
  %zero = arith.constant 0.0 : f32
  %one = arith.constant 1.0 : f32
  %slope = arith.constant 0.1 : f32
  %mm = linalg.matmul ins(%a, %b : tensor<4x8xf32>, tensor<8x16xf32>) outs(%c : tensor<4x16xf32>) -> tensor<4x16xf32>
  %e0 = tensor.empty() : tensor<4x16xf32>
  %mask = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%mm : tensor<4x16xf32>) outs(%e0 : tensor<4x16xf32>) {
  ^bb0(%x: f32, %o: f32):
    %gt = arith.cmpf ogt, %x, %zero : f32
    %m = arith.select %gt, %one, %zero : f32
    linalg.yield %m : f32
  } -> tensor<4x16xf32>
  %e1 = tensor.empty() : tensor<4x16xf32>
  %neg = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%mm : tensor<4x16xf32>) outs(%e1 : tensor<4x16xf32>) {
  ^bb0(%x: f32, %o: f32):
    %s = arith.mulf %x, %slope : f32
    linalg.yield %s : f32
  } -> tensor<4x16xf32>
  %e2 = tensor.empty() : tensor<4x16xf32>
  %r = linalg.generic {indexing_maps = [#id, #id, #id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%mask, %mm, %neg : tensor<4x16xf32>, tensor<4x16xf32>, tensor<4x16xf32>) outs(%e2 : tensor<4x16xf32>) {
  ^bb0(%m: f32, %x: f32, %n: f32, %o: f32):
    %ne = arith.cmpf une, %m, %zero : f32
    %v = arith.select %ne, %x, %n : f32
    linalg.yield %v : f32
  } -> tensor<4x16xf32>
  return %r : tensor<4x16xf32>
}

// -----

// The same activation whose mask is also returned: two values leave the region, so it stays outside and
// only the contraction moves.
// CHECK-LABEL: func.func @mm_leaky_mask_out(
// CHECK:         %[[R:.*]] = call @__pbsdk_contraction0(
// CHECK:         linalg.generic {{.*}} ins(%[[R]] :
// CHECK-LABEL: func.func private @__pbsdk_contraction0(
// CHECK-NEXT:    %[[MM:.*]] = linalg.matmul
// CHECK-NEXT:    return %[[MM]]
#id2 = affine_map<(d0, d1) -> (d0, d1)>
func.func @mm_leaky_mask_out(%a: tensor<4x8xf32>, %b: tensor<8x16xf32>, %c: tensor<4x16xf32>) -> (tensor<4x16xf32>, tensor<4x16xf32>) {
  %zero = arith.constant 0.0 : f32
  %slope = arith.constant 0.1 : f32
  %mm = linalg.matmul ins(%a, %b : tensor<4x8xf32>, tensor<8x16xf32>) outs(%c : tensor<4x16xf32>) -> tensor<4x16xf32>
  %e0 = tensor.empty() : tensor<4x16xf32>
  %mask = linalg.generic {indexing_maps = [#id2, #id2], iterator_types = ["parallel", "parallel"]}
      ins(%mm : tensor<4x16xf32>) outs(%e0 : tensor<4x16xf32>) {
  ^bb0(%x: f32, %o: f32):
    %gt = arith.cmpf ogt, %x, %zero : f32
    %m = arith.uitofp %gt : i1 to f32
    linalg.yield %m : f32
  } -> tensor<4x16xf32>
  %e2 = tensor.empty() : tensor<4x16xf32>
  %r = linalg.generic {indexing_maps = [#id2, #id2, #id2], iterator_types = ["parallel", "parallel"]}
      ins(%mask, %mm : tensor<4x16xf32>, tensor<4x16xf32>) outs(%e2 : tensor<4x16xf32>) {
  ^bb0(%m: f32, %x: f32, %o: f32):
    %ne = arith.cmpf une, %m, %zero : f32
    %s = arith.mulf %x, %slope : f32
    %v = arith.select %ne, %x, %s : f32
    linalg.yield %v : f32
  } -> tensor<4x16xf32>
  return %r, %mask : tensor<4x16xf32>, tensor<4x16xf32>
}
