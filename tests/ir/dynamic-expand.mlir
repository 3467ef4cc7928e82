// cpu stage dynamic-expand: a memref.expand_shape splitting one dimension into two sizes known at run time
// (the b*s rows of a flattened batch of sequences viewed back as (b, s)) becomes the reinterpret_cast it
// stands for, strides from the output sizes; one dynamic size per group stays an expand_shape.
// RUN: %pbsdk opt %s --target cpu -p dynamic-expand | filecheck %s

// CHECK-LABEL: func.func @rows
// CHECK-NOT: memref.expand_shape
// CHECK: %[[BASE:.*]], %[[OFF:.*]], %[[SIZES:.*]]:2, %[[STRIDES:.*]]:2 = memref.extract_strided_metadata %arg0
// CHECK: %[[S:.*]] = arith.muli %{{.*}}, %arg2
// CHECK: memref.reinterpret_cast %[[BASE]] to offset: [0], sizes: [%arg1, %arg2, 64], strides: [%[[S]], 64, 1] : memref<f32> to memref<?x?x64xf32>
func.func @rows(%x: memref<?x64xf32>, %b: index, %s: index) -> memref<?x?x64xf32> {
  %v = memref.expand_shape %x [[0, 1], [2]] output_shape [%b, %s, 64] : memref<?x64xf32> into memref<?x?x64xf32>
  return %v : memref<?x?x64xf32>
}

// CHECK-LABEL: func.func @one
// CHECK: memref.expand_shape
func.func @one(%x: memref<?x64xf32>, %s: index) -> memref<2x?x64xf32> {
  %v = memref.expand_shape %x [[0, 1], [2]] output_shape [2, %s, 64] : memref<?x64xf32> into memref<2x?x64xf32>
  return %v : memref<2x?x64xf32>
}
