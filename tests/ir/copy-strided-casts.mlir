// Pass copy-strided-casts: a strided view cast to the identity layout, which a dynamic size lets
// bufferization do, is copied into a row-major buffer instead (the callee reads identity-layout strides
// computed from the sizes); a cast from a provably row-major buffer stays.
// RUN: %pbsdk opt %s --split-input-file -p copy-strided-casts | filecheck %s

// The first %n of 40 rows of each of 12 batches: batches 2560 elements apart, not %n * 64.
// CHECK-LABEL: func.func @rows_of_a_cache(
// CHECK-SAME:      %[[BUF:.*]]: memref<12x40x64xf32>, %[[N:.*]]: index
// CHECK:         %[[VIEW:.*]] = memref.subview %[[BUF]][0, 0, 0] [12, %[[N]], 64] [1, 1, 1]
// CHECK-NOT:     memref.cast
// CHECK:         %[[C1:.*]] = arith.constant 1 : index
// CHECK:         %[[DIM:.*]] = memref.dim %[[VIEW]], %[[C1]]
// CHECK:         %[[COPY:.*]] = memref.alloc(%[[DIM]]) : memref<12x?x64xf32>
// CHECK:         memref.copy %[[VIEW]], %[[COPY]] : memref<12x?x64xf32, strided<[2560, 64, 1]>> to memref<12x?x64xf32>
// CHECK:         call @consume(%[[COPY]]) : (memref<12x?x64xf32>) -> ()
func.func private @consume(memref<12x?x64xf32>)
func.func @rows_of_a_cache(%buf: memref<12x40x64xf32>, %n: index) {
  %view = memref.subview %buf[0, 0, 0] [12, %n, 64] [1, 1, 1] : memref<12x40x64xf32> to memref<12x?x64xf32, strided<[2560, 64, 1]>>
  %cast = memref.cast %view : memref<12x?x64xf32, strided<[2560, 64, 1]>> to memref<12x?x64xf32>
  call @consume(%cast) : (memref<12x?x64xf32>) -> ()
  return
}

// -----

// A view at a run-time offset is not at offset 0: copied too, the cast to the callee's type kept after it.
// CHECK-LABEL: func.func @rows_from(
// CHECK:         %[[VIEW:.*]] = memref.subview
// CHECK:         %[[COPY:.*]] = memref.alloc() : memref<4x64xf32>
// CHECK:         memref.copy %[[VIEW]], %[[COPY]]
// CHECK:         %[[CAST:.*]] = memref.cast %[[COPY]] : memref<4x64xf32> to memref<?x64xf32>
// CHECK:         call @consume_rows(%[[CAST]])
func.func private @consume_rows(memref<?x64xf32>)
func.func @rows_from(%buf: memref<40x64xf32>, %at: index) {
  %view = memref.subview %buf[%at, 0] [4, 64] [1, 1] : memref<40x64xf32> to memref<4x64xf32, strided<[64, 1], offset: ?>>
  %cast = memref.cast %view : memref<4x64xf32, strided<[64, 1], offset: ?>> to memref<?x64xf32>
  call @consume_rows(%cast) : (memref<?x64xf32>) -> ()
  return
}

// -----

// Left alone: a row-major source (whole rows from the start, spelled strided), and a cast between sizes.
// CHECK-LABEL: func.func @exact(
// CHECK-NOT:     memref.alloc
// CHECK-NOT:     memref.copy
// CHECK:         memref.cast %{{.*}} : memref<?x64xf32, strided<[64, 1]>> to memref<?x64xf32>
// CHECK:         memref.cast %{{.*}} : memref<8x64xf32> to memref<?x64xf32>
func.func @exact(%buf: memref<40x64xf32>, %n: index, %b: memref<8x64xf32>) {
  %view = memref.subview %buf[0, 0] [%n, 64] [1, 1] : memref<40x64xf32> to memref<?x64xf32, strided<[64, 1]>>
  %cast = memref.cast %view : memref<?x64xf32, strided<[64, 1]>> to memref<?x64xf32>
  call @consume_rows(%cast) : (memref<?x64xf32>) -> ()
  %sized = memref.cast %b : memref<8x64xf32> to memref<?x64xf32>
  call @consume_rows(%sized) : (memref<?x64xf32>) -> ()
  return
}
func.func private @consume_rows(memref<?x64xf32>)
