// Core pass dynamic-results: a private function returning a buffer of dynamic size that it allocates, whose
// sizes are index arguments or memref.dim of buffer arguments, takes that buffer as a new last argument
// instead; each call allocates it with the sizes taken from its own operands. Public functions and static
// results are left to out-params.
// RUN: %pbsdk opt %s -p dynamic-results | filecheck %s

// CHECK-LABEL: func.func @f(
// CHECK-SAME:      %[[X:[^:]*]]: memref<?x8xf32>, %[[N:[^:]*]]: index) -> memref<?x4xf32>
// CHECK:         %[[C1:.*]] = arith.constant 1 : index
// CHECK:         %[[D:.*]] = memref.dim %[[X]], %[[C1]] : memref<?x8xf32>
// CHECK:         %[[OUT:.*]] = memref.alloc(%[[N]], %[[D]]) {alignment = 64 : i64} : memref<?x?xf32>
// CHECK-NEXT:    %[[S:.*]] = call @kernel(%[[X]], %[[N]], %[[OUT]]) : (memref<?x8xf32>, index, memref<?x?xf32>) -> memref<2xf32>
// CHECK:         %[[V:.*]] = memref.subview %[[OUT]]
// CHECK:         memref.copy %[[V]]
func.func @f(%x: memref<?x8xf32>, %n: index) -> memref<?x4xf32> {
  %r:2 = func.call @kernel(%x, %n) : (memref<?x8xf32>, index) -> (memref<?x?xf32>, memref<2xf32>)
  %v = memref.subview %r#0[0, 0] [%n, 4] [1, 1] : memref<?x?xf32> to memref<?x4xf32, strided<[?, 1]>>
  %w = memref.alloc(%n) : memref<?x4xf32>
  memref.copy %v, %w : memref<?x4xf32, strided<[?, 1]>> to memref<?x4xf32>
  return %w : memref<?x4xf32>
}

// CHECK-LABEL: func.func private @kernel(
// CHECK-SAME:      %[[X:[^:]*]]: memref<?x8xf32>, %[[N:[^:]*]]: index, %[[OUT:[^:]*]]: memref<?x?xf32>) -> memref<2xf32>
// CHECK-NOT:     memref.alloc(
// CHECK:         linalg.fill ins(%{{.*}} : f32) outs(%[[OUT]] : memref<?x?xf32>)
// CHECK:         return %{{.*}} : memref<2xf32>
func.func private @kernel(%x: memref<?x8xf32>, %n: index) -> (memref<?x?xf32>, memref<2xf32>) {
  %c1 = arith.constant 1 : index
  %d = memref.dim %x, %c1 : memref<?x8xf32>
  %out = memref.alloc(%n, %d) : memref<?x?xf32>
  %z = arith.constant 0.0 : f32
  linalg.fill ins(%z : f32) outs(%out : memref<?x?xf32>)
  %s = memref.alloc() : memref<2xf32>
  return %out, %s : memref<?x?xf32>, memref<2xf32>
}
