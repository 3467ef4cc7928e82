// Pass forward-outputs: a result computed into a local buffer and then copied into an output argument is
// computed in the output argument itself; the alloc, the copy and the dealloc go.
// RUN: %pbsdk opt %s --split-input-file -p forward-outputs | filecheck %s

// CHECK-LABEL: func.func @forward(
// CHECK-SAME:      %[[A:.*]]: memref<4x8xf32>, %[[OUT:.*]]: memref<4x8xf32>)
// CHECK-NOT:     memref.alloc
// CHECK-NEXT:    linalg.copy ins(%[[A]] : memref<4x8xf32>) outs(%[[OUT]] : memref<4x8xf32>)
// CHECK-NEXT:    return
func.func @forward(%a: memref<4x8xf32>, %out: memref<4x8xf32>) {
  %tmp = memref.alloc() : memref<4x8xf32>
  linalg.copy ins(%a : memref<4x8xf32>) outs(%tmp : memref<4x8xf32>)
  memref.copy %tmp, %out : memref<4x8xf32> to memref<4x8xf32>
  memref.dealloc %tmp : memref<4x8xf32>
  return
}

// -----

// The output is read before the copy: writing it early would change what is read. Unchanged.
// CHECK-LABEL: func.func @output_read(
// CHECK-NEXT:    %[[T:.*]] = memref.alloc() : memref<4x8xf32>
// CHECK-NEXT:    linalg.copy ins(%arg1 : memref<4x8xf32>) outs(%[[T]] : memref<4x8xf32>)
// CHECK-NEXT:    memref.copy %[[T]], %arg1
// CHECK-NEXT:    memref.dealloc %[[T]]
func.func @output_read(%a: memref<4x8xf32>, %out: memref<4x8xf32>) {
  %tmp = memref.alloc() : memref<4x8xf32>
  linalg.copy ins(%out : memref<4x8xf32>) outs(%tmp : memref<4x8xf32>)
  memref.copy %tmp, %out : memref<4x8xf32> to memref<4x8xf32>
  memref.dealloc %tmp : memref<4x8xf32>
  return
}

// -----

// The local buffer is still read after the copy. Unchanged.
// CHECK-LABEL: func.func @used_after(
// CHECK-NEXT:    %[[T:.*]] = memref.alloc() : memref<4x8xf32>
// CHECK-NEXT:    linalg.copy ins(%arg0 : memref<4x8xf32>) outs(%[[T]] : memref<4x8xf32>)
// CHECK-NEXT:    memref.copy %[[T]], %arg1
// CHECK-NEXT:    linalg.copy ins(%[[T]] : memref<4x8xf32>) outs(%arg2 : memref<4x8xf32>)
// CHECK-NEXT:    memref.dealloc %[[T]]
func.func @used_after(%a: memref<4x8xf32>, %out: memref<4x8xf32>, %out2: memref<4x8xf32>) {
  %tmp = memref.alloc() : memref<4x8xf32>
  linalg.copy ins(%a : memref<4x8xf32>) outs(%tmp : memref<4x8xf32>)
  memref.copy %tmp, %out : memref<4x8xf32> to memref<4x8xf32>
  linalg.copy ins(%tmp : memref<4x8xf32>) outs(%out2 : memref<4x8xf32>)
  memref.dealloc %tmp : memref<4x8xf32>
  return
}

// -----

// A copy into a strided view of the output is a layout change, not a forwardable copy. Unchanged.
// CHECK-LABEL: func.func @strided(
// CHECK-NEXT:    %[[T:.*]] = memref.alloc() : memref<4x8xf32>
// CHECK-NEXT:    linalg.copy ins(%arg0 : memref<4x8xf32>) outs(%[[T]] : memref<4x8xf32>)
// CHECK-NEXT:    memref.copy %[[T]], %arg1 : memref<4x8xf32> to memref<4x8xf32, strided<[16, 1]>>
func.func @strided(%a: memref<4x8xf32>, %out: memref<4x8xf32, strided<[16, 1]>>) {
  %tmp = memref.alloc() : memref<4x8xf32>
  linalg.copy ins(%a : memref<4x8xf32>) outs(%tmp : memref<4x8xf32>)
  memref.copy %tmp, %out : memref<4x8xf32> to memref<4x8xf32, strided<[16, 1]>>
  memref.dealloc %tmp : memref<4x8xf32>
  return
}
