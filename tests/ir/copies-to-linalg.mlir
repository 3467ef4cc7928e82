// Pass copies-to-linalg (the cpu and template targets' stage lower-copies): a memref.copy touching a
// strided view becomes linalg.copy (plain loops later; no call into MLIR's runner-utils library), while a
// copy between identity-layout buffers stays a memref.copy (a memcpy). only-strided=false converts all.
// RUN: %pbsdk opt %s -p copies-to-linalg | filecheck %s
// RUN: %pbsdk opt %s -p 'copies-to-linalg{only-strided=false}' | filecheck %s --check-prefix=ALL
// RUN: %pbsdk opt %s --target cpu -p lower-copies | filecheck %s

// CHECK-LABEL: func.func @copies(
// CHECK-SAME:      %[[PAD:.*]]: memref<6x10xf32>, %[[A:.*]]: memref<4x8xf32>, %[[B:.*]]: memref<4x8xf32>)
// CHECK-NEXT:    %[[VIEW:.*]] = memref.subview %[[PAD]][1, 1] [4, 8] [1, 1]
// CHECK-NEXT:    linalg.copy {{.*}}ins(%[[A]] : memref<4x8xf32>) outs(%[[VIEW]] : memref<4x8xf32, strided<[10, 1], offset: 11>>)
// CHECK-NEXT:    memref.copy %[[A]], %[[B]] : memref<4x8xf32> to memref<4x8xf32>
// CHECK-NEXT:    return
// ALL-LABEL: func.func @copies(
// ALL-NOT:     memref.copy
// ALL:         linalg.copy {{.*}}ins(%{{.*}} : memref<4x8xf32>) outs(%{{.*}} : memref<4x8xf32, strided<[10, 1], offset: 11>>)
// ALL-NEXT:    linalg.copy {{.*}}ins(%arg1 : memref<4x8xf32>) outs(%arg2 : memref<4x8xf32>)
func.func @copies(%pad: memref<6x10xf32>, %a: memref<4x8xf32>, %b: memref<4x8xf32>) {
  %v = memref.subview %pad[1, 1] [4, 8] [1, 1] : memref<6x10xf32> to memref<4x8xf32, strided<[10, 1], offset: 11>>
  memref.copy %a, %v : memref<4x8xf32> to memref<4x8xf32, strided<[10, 1], offset: 11>>
  memref.copy %a, %b : memref<4x8xf32> to memref<4x8xf32>
  return
}
