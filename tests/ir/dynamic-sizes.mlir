// Core pass dynamic-sizes: a function taking buffers with dynamic sizes takes each as a carrier
// memref<1xT> (its base pointer) plus one memref<Nxindex> of the sizes, after its last buffer (a part's
// thread index stays last); the body rebuilds each buffer with memref.reinterpret_cast (row-major strides
// from the sizes). A call passes carriers and a sizes buffer it fills with memref.dim; a call that is a
// forall's whole body gets them before the loop, so the loop still forks. Static functions are untouched.
// RUN: %pbsdk opt %s --target cpu -p dynamic-sizes | filecheck %s

// CHECK-LABEL: func.func @part(
// CHECK-SAME:      %[[X:[^:]*]]: memref<1xf32>, %[[W:[^:]*]]: memref<4x8xf32>, %[[Y:[^:]*]]: memref<1xf32>, %[[S:[^:]*]]: memref<3xindex>, %[[T:[^:]*]]: index)
// CHECK:         %[[N0:.*]] = memref.load %[[S]][%{{.*}}] : memref<3xindex>
// CHECK:         %[[N1:.*]] = memref.load %[[S]][%{{.*}}] : memref<3xindex>
// CHECK:         %[[ST:.*]] = arith.muli %{{.*}}, %[[N1]] : index
// CHECK:         %[[XV:.*]] = memref.reinterpret_cast %[[X]] to offset: [0], sizes: [%[[N0]], %[[N1]], 4], strides: [%[[ST]], 4, 1] : memref<1xf32> to memref<?x?x4xf32>
// CHECK:         %[[N2:.*]] = memref.load %[[S]][%{{.*}}] : memref<3xindex>
// CHECK:         %[[YV:.*]] = memref.reinterpret_cast %[[Y]] to offset: [0], sizes: [%[[N2]], 8], strides: [8, 1] : memref<1xf32> to memref<?x8xf32>
// CHECK:         memref.dim %[[XV]]
// CHECK:         memref.store %{{.*}}, %[[YV]][%[[T]], %[[T]]]
func.func @part(%x: memref<?x?x4xf32>, %w: memref<4x8xf32>, %y: memref<?x8xf32>, %t: index) {
  %c0 = arith.constant 0 : index
  %n = memref.dim %x, %c0 : memref<?x?x4xf32>
  %v = arith.index_cast %n : index to i64
  %f = arith.uitofp %v : i64 to f32
  memref.store %f, %y[%t, %t] : memref<?x8xf32>
  return
}

// CHECK-LABEL: func.func @f(
// CHECK-SAME:      %[[X:[^:]*]]: memref<1xf32>, %[[W:[^:]*]]: memref<4x8xf32>, %[[Y:[^:]*]]: memref<1xf32>, %[[S:[^:]*]]: memref<3xindex>)
// CHECK:         %[[SIZES:.*]] = memref.alloca() : memref<3xindex>
// CHECK:         %[[XV:.*]] = memref.reinterpret_cast %[[X]] {{.*}} to memref<?x?x4xf32>
// CHECK:         %[[YV:.*]] = memref.reinterpret_cast %[[Y]] {{.*}} to memref<?x8xf32>
// CHECK:         %[[D0:.*]] = memref.dim %[[XV]], %{{.*}} : memref<?x?x4xf32>
// CHECK:         memref.store %[[D0]], %[[SIZES]]
// CHECK:         %[[XC:.*]] = memref.reinterpret_cast %[[XV]] to offset: [0], sizes: [1], strides: [1] : memref<?x?x4xf32> to memref<1xf32>
// CHECK:         %[[D2:.*]] = memref.dim %[[YV]], %{{.*}} : memref<?x8xf32>
// CHECK:         memref.store %[[D2]], %[[SIZES]]
// CHECK:         %[[YC:.*]] = memref.reinterpret_cast %[[YV]] to offset: [0], sizes: [1], strides: [1] : memref<?x8xf32> to memref<1xf32>
// CHECK-NEXT:    scf.forall (%[[I:.*]]) in (2) {
// CHECK-NEXT:      func.call @part(%[[XC]], %[[W]], %[[YC]], %[[SIZES]], %[[I]])
func.func @f(%x: memref<?x?x4xf32>, %w: memref<4x8xf32>, %y: memref<?x8xf32>) {
  scf.forall (%t) in (2) {
    func.call @part(%x, %w, %y, %t) : (memref<?x?x4xf32>, memref<4x8xf32>, memref<?x8xf32>, index) -> ()
  }
  return
}

// CHECK-LABEL: func.func @static(
// CHECK-SAME:      memref<4x8xf32>)
// CHECK-NEXT:    return
func.func @static(%w: memref<4x8xf32>) {
  return
}
