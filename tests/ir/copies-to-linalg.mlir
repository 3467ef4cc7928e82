// Pass copies-to-linalg (the cpu and template targets' stage lower-copies): a memref.copy touching a
// strided view becomes linalg.copy (plain loops later; no call into MLIR's runner-utils library), while a
// copy between identity-layout buffers stays a memref.copy (a memcpy). only-strided=false converts all.
// The cpu target's lower-copies also sets row-copies: copies-to-linalg-rows.mlir.
// RUN: %pbsdk opt %s --split-input-file -p copies-to-linalg | filecheck %s
// RUN: %pbsdk opt %s --split-input-file -p 'copies-to-linalg{only-strided=false}' | filecheck %s --check-prefix=ALL
// RUN: %pbsdk opt %s --split-input-file -p copies-to-linalg | filecheck %s --check-prefix=KEEP
// RUN: %pbsdk opt %s --split-input-file -p 'copies-to-linalg{memcpy-contiguous}' | filecheck %s --check-prefixes=CHECK,ROWS

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

// -----

// A one-row view of a padded image (dynamic offset) is one contiguous run: a memref.copy into it stays a
// memcpy, and with memcpy-contiguous (set by the cpu target's lower-copies) a linalg.copy between two such views
// becomes one; a view with a gap between its rows stays linalg.copy.
// ROWS-LABEL: func.func @rows(
// ROWS:         memref.copy %{{.*}}, %{{.*}} : memref<1x4x8xf32, strided<[32, 8, 1], offset: ?>> to memref<1x4x8xf32, strided<[60, 8, 1], offset: ?>>
// ROWS-NEXT:    memref.copy %{{.*}}, %{{.*}} : memref<1x4x8xf32, strided<[32, 8, 1], offset: ?>> to memref<1x4x8xf32, strided<[60, 8, 1], offset: ?>>
// ROWS-NEXT:    linalg.copy {{.*}}ins(%{{.*}} : memref<2x8xf32, strided<[16, 1], offset: ?>>)
// ROWS-NEXT:    return
// KEEP-LABEL: func.func @rows(
// KEEP:         memref.copy
// KEEP-NEXT:    linalg.copy
// KEEP-NEXT:    linalg.copy
func.func @rows(%a: memref<1x4x8xf32, strided<[32, 8, 1], offset: ?>>, %b: memref<1x4x8xf32, strided<[60, 8, 1], offset: ?>>,
                %c: memref<2x8xf32, strided<[16, 1], offset: ?>>, %d: memref<2x8xf32>) {
  memref.copy %a, %b : memref<1x4x8xf32, strided<[32, 8, 1], offset: ?>> to memref<1x4x8xf32, strided<[60, 8, 1], offset: ?>>
  linalg.copy ins(%a : memref<1x4x8xf32, strided<[32, 8, 1], offset: ?>>) outs(%b : memref<1x4x8xf32, strided<[60, 8, 1], offset: ?>>)
  linalg.copy ins(%c : memref<2x8xf32, strided<[16, 1], offset: ?>>) outs(%d : memref<2x8xf32>)
  return
}
