// Pass distinct-results: a buffer returned more than once gets a fresh copy for each repeat, so every
// output parameter that buffer-results-to-out-params makes is written exactly once.
// RUN: %pbsdk opt %s --split-input-file -p distinct-results | filecheck %s

// CHECK-LABEL: func.func @thrice(
// CHECK:         %[[R:.*]] = memref.alloc() : memref<4xf32>
// CHECK-NEXT:    linalg.copy
// CHECK-NEXT:    %[[R1:.*]] = memref.alloc() : memref<4xf32>
// CHECK-NEXT:    memref.copy %[[R]], %[[R1]] : memref<4xf32> to memref<4xf32>
// CHECK-NEXT:    %[[R2:.*]] = memref.alloc() : memref<4xf32>
// CHECK-NEXT:    memref.copy %[[R]], %[[R2]] : memref<4xf32> to memref<4xf32>
// CHECK-NEXT:    return %[[R]], %[[R1]], %[[R2]] : memref<4xf32>, memref<4xf32>, memref<4xf32>
func.func @thrice(%a: memref<4xf32>) -> (memref<4xf32>, memref<4xf32>, memref<4xf32>) {
  %r = memref.alloc() : memref<4xf32>
  linalg.copy ins(%a : memref<4xf32>) outs(%r : memref<4xf32>)
  return %r, %r, %r : memref<4xf32>, memref<4xf32>, memref<4xf32>
}

// -----

// Distinct results, and a repeated non-buffer result, are left alone.
// CHECK-LABEL: func.func @distinct(
// CHECK-NOT:     memref.copy
// CHECK:         return %arg0, %arg1, %{{.*}}, %{{.*}} : memref<4xf32>, memref<4xf32>, index, index
func.func @distinct(%a: memref<4xf32>, %b: memref<4xf32>) -> (memref<4xf32>, memref<4xf32>, index, index) {
  %c = arith.constant 3 : index
  return %a, %b, %c, %c : memref<4xf32>, memref<4xf32>, index, index
}
