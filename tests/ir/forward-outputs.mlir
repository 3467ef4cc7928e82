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

// -----

// The copy reads a reshape of the local buffer (a matmul's 2-D result as a convolution's NHWC output):
// the buffer becomes the inverse reshape of the output, and the reshape, copy, alloc and dealloc go.
// CHECK-LABEL: func.func @reshaped(
// CHECK-SAME:      %[[A:[^:]*]]: memref<6x8xf32>, %[[OUT:[^:]*]]: memref<1x2x3x8xf32>)
// CHECK-NEXT:    %[[V:.*]] = memref.collapse_shape %[[OUT]] {{\[}}[0, 1, 2], [3]] : memref<1x2x3x8xf32> into memref<6x8xf32>
// CHECK-NEXT:    linalg.copy ins(%[[A]] : memref<6x8xf32>) outs(%[[V]] : memref<6x8xf32>)
// CHECK-NEXT:    return
func.func @reshaped(%a: memref<6x8xf32>, %out: memref<1x2x3x8xf32>) {
  %tmp = memref.alloc() : memref<6x8xf32>
  linalg.copy ins(%a : memref<6x8xf32>) outs(%tmp : memref<6x8xf32>)
  %e = memref.expand_shape %tmp [[0, 1, 2], [3]] output_shape [1, 2, 3, 8] : memref<6x8xf32> into memref<1x2x3x8xf32>
  memref.copy %e, %out : memref<1x2x3x8xf32> to memref<1x2x3x8xf32>
  memref.dealloc %tmp : memref<6x8xf32>
  return
}

// -----

// And the other way: a collapse of the buffer copied out becomes an expand of the output.
// CHECK-LABEL: func.func @collapsed(
// CHECK-SAME:      %[[A:[^:]*]]: memref<2x3x8xf32>, %[[OUT:[^:]*]]: memref<6x8xf32>)
// CHECK-NEXT:    %[[V:.*]] = memref.expand_shape %[[OUT]] {{\[}}[0, 1], [2]] output_shape [2, 3, 8] : memref<6x8xf32> into memref<2x3x8xf32>
// CHECK-NEXT:    linalg.copy ins(%[[A]] : memref<2x3x8xf32>) outs(%[[V]] : memref<2x3x8xf32>)
// CHECK-NEXT:    return
func.func @collapsed(%a: memref<2x3x8xf32>, %out: memref<6x8xf32>) {
  %tmp = memref.alloc() : memref<2x3x8xf32>
  linalg.copy ins(%a : memref<2x3x8xf32>) outs(%tmp : memref<2x3x8xf32>)
  %c = memref.collapse_shape %tmp [[0, 1], [2]] : memref<2x3x8xf32> into memref<6x8xf32>
  memref.copy %c, %out : memref<6x8xf32> to memref<6x8xf32>
  memref.dealloc %tmp : memref<2x3x8xf32>
  return
}

// -----

// The reshaped buffer is read again after the copy. Unchanged.
// CHECK-LABEL: func.func @reshaped_used_after(
// CHECK:         memref.alloc
// CHECK:         memref.copy
func.func @reshaped_used_after(%a: memref<6x8xf32>, %out: memref<1x2x3x8xf32>, %out2: memref<6x8xf32>) {
  %tmp = memref.alloc() : memref<6x8xf32>
  linalg.copy ins(%a : memref<6x8xf32>) outs(%tmp : memref<6x8xf32>)
  %e = memref.expand_shape %tmp [[0, 1, 2], [3]] output_shape [1, 2, 3, 8] : memref<6x8xf32> into memref<1x2x3x8xf32>
  memref.copy %e, %out : memref<1x2x3x8xf32> to memref<1x2x3x8xf32>
  linalg.copy ins(%tmp : memref<6x8xf32>) outs(%out2 : memref<6x8xf32>)
  memref.dealloc %tmp : memref<6x8xf32>
  return
}
