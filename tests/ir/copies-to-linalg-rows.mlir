// Pass copies-to-linalg with row-copies (the cpu target's stage lower-copies): a strided copy whose two
// sides share a contiguous inner run of at least MIN_ROW_BYTES (16) becomes scf.for loops over the other
// dimensions around a memref.copy of one row (a memcpy, at a dynamic offset); a shorter run stays a
// linalg.copy (element loops). Without row-copies every strided copy is a linalg.copy.
// RUN: %pbsdk opt %s --split-input-file --target cpu -p lower-copies | filecheck %s
// RUN: %pbsdk opt %s --split-input-file -p 'copies-to-linalg{row-copies}' | filecheck %s
// RUN: %pbsdk opt %s --split-input-file -p 'copies-to-linalg{memcpy-contiguous}' | filecheck %s --check-prefix=OFF

// An activation into the interior of its padded buffer: the last two dimensions (56 x 64 i8, 3584 B) are
// one run on both sides, so 8 x 56 rows.
// CHECK-LABEL: func.func @padded_interior(
// CHECK-SAME:      %[[A:.*]]: memref<8x56x56x64xi8>, %[[PAD:.*]]: memref<8x58x58x64xi8>)
// CHECK-NEXT:    %[[V:.*]] = memref.subview %[[PAD]][0, 1, 1, 0] [8, 56, 56, 64] [1, 1, 1, 1]
// CHECK-DAG:     %[[C0:.*]] = arith.constant 0 : index
// CHECK-DAG:     %[[C1:.*]] = arith.constant 1 : index
// CHECK-DAG:     %[[C8:.*]] = arith.constant 8 : index
// CHECK-DAG:     %[[C56:.*]] = arith.constant 56 : index
// CHECK:         scf.for %[[N:.*]] = %[[C0]] to %[[C8]] step %[[C1]] {
// CHECK-NEXT:      scf.for %[[H:.*]] = %[[C0]] to %[[C56]] step %[[C1]] {
// CHECK-NEXT:        %[[S:.*]] = memref.subview %[[A]][%[[N]], %[[H]], 0, 0] [1, 1, 56, 64] [1, 1, 1, 1] : memref<8x56x56x64xi8> to memref<56x64xi8, strided<[64, 1], offset: ?>>
// CHECK-NEXT:        %[[D:.*]] = memref.subview %[[V]][%[[N]], %[[H]], 0, 0] [1, 1, 56, 64] [1, 1, 1, 1] : memref<8x56x56x64xi8, strided<[215296, 3712, 64, 1], offset: 3776>> to memref<56x64xi8, strided<[64, 1], offset: ?>>
// CHECK-NEXT:        memref.copy %[[S]], %[[D]] : memref<56x64xi8, strided<[64, 1], offset: ?>> to memref<56x64xi8, strided<[64, 1], offset: ?>>
// CHECK-NEXT:      }
// CHECK-NEXT:    }
// CHECK-NEXT:    return
// OFF-LABEL: func.func @padded_interior(
// OFF-NOT:     scf.for
// OFF:         linalg.copy
// OFF-NEXT:    return
func.func @padded_interior(%a: memref<8x56x56x64xi8>, %pad: memref<8x58x58x64xi8>) {
  %v = memref.subview %pad[0, 1, 1, 0] [8, 56, 56, 64] [1, 1, 1, 1] : memref<8x58x58x64xi8> to memref<8x56x56x64xi8, strided<[215296, 3712, 64, 1], offset: 3776>>
  memref.copy %a, %v : memref<8x56x56x64xi8> to memref<8x56x56x64xi8, strided<[215296, 3712, 64, 1], offset: 3776>>
  return
}

// -----

// Runs shorter than 16 B stay linalg.copy: a transposing copy (one element) and a slice of 2 f32 channels.
// CHECK-LABEL: func.func @short_runs(
// CHECK-NOT:     scf.for
// CHECK:         linalg.copy {{.*}}outs(%{{.*}} : memref<16x32xf32, strided<[1, 16]>>)
// CHECK:         linalg.copy {{.*}}outs(%{{.*}} : memref<4x8x2xf32, strided<[512, 64, 1], offset: 8>>)
// CHECK-NEXT:    return
func.func @short_runs(%a: memref<16x32xf32>, %b: memref<32x16xf32>, %c: memref<4x8x2xf32>, %d: memref<4x8x64xf32>) {
  %t = memref.transpose %b (i, j) -> (j, i) : memref<32x16xf32> to memref<16x32xf32, strided<[1, 16]>>
  memref.copy %a, %t : memref<16x32xf32> to memref<16x32xf32, strided<[1, 16]>>
  %v = memref.subview %d[0, 0, 8] [4, 8, 2] [1, 1, 1] : memref<4x8x64xf32> to memref<4x8x2xf32, strided<[512, 64, 1], offset: 8>>
  memref.copy %c, %v : memref<4x8x2xf32> to memref<4x8x2xf32, strided<[512, 64, 1], offset: 8>>
  return
}

// -----

// Only the last dimension is one run (32 f32 channels of 64, 128 B): loops over the other two.
// CHECK-LABEL: func.func @channel_slice(
// CHECK:         scf.for %[[I:.*]] = %{{.*}} to %{{.*}} step
// CHECK-NEXT:      scf.for %[[J:.*]] = %{{.*}} to %{{.*}} step
// CHECK-NEXT:        %[[S:.*]] = memref.subview %{{.*}}[%[[I]], %[[J]], 0] [1, 1, 32] [1, 1, 1] : memref<4x8x32xf32> to memref<32xf32, strided<[1], offset: ?>>
// CHECK-NEXT:        %[[D:.*]] = memref.subview %{{.*}}[%[[I]], %[[J]], 0] [1, 1, 32] [1, 1, 1] : memref<4x8x32xf32, strided<[512, 64, 1], offset: 16>> to memref<32xf32, strided<[1], offset: ?>>
// CHECK-NEXT:        memref.copy %[[S]], %[[D]] : memref<32xf32, strided<[1], offset: ?>> to memref<32xf32, strided<[1], offset: ?>>
// CHECK-NEXT:      }
// CHECK-NEXT:    }
// CHECK-NEXT:    return
func.func @channel_slice(%a: memref<4x8x32xf32>, %b: memref<4x8x64xf32>) {
  %v = memref.subview %b[0, 0, 16] [4, 8, 32] [1, 1, 1] : memref<4x8x64xf32> to memref<4x8x32xf32, strided<[512, 64, 1], offset: 16>>
  memref.copy %a, %v : memref<4x8x32xf32> to memref<4x8x32xf32, strided<[512, 64, 1], offset: 16>>
  return
}

// -----

// A linalg.copy between strided views is split the same way; dimensions of size 1 get no loop, and one
// inside the run (whatever its stride) is dropped from the row's view.
// CHECK-LABEL: func.func @unit_dims(
// CHECK:         scf.for %[[I:.*]] = %{{.*}} to %{{.*}} step
// CHECK-NEXT:      %[[S:.*]] = memref.subview %{{.*}}[0, %[[I]], 0, 0] [1, 1, 1, 16] [1, 1, 1, 1] : memref<1x3x1x16xf32, strided<[96, 32, 16, 1], offset: ?>> to memref<16xf32, strided<[1], offset: ?>>
// CHECK-NEXT:      %[[D:.*]] = memref.subview %{{.*}}[0, %[[I]], 0, 0] [1, 1, 1, 16] [1, 1, 1, 1] : memref<1x3x1x16xf32, strided<[1000, 40, 7, 1], offset: ?>> to memref<16xf32, strided<[1], offset: ?>>
// CHECK-NEXT:      memref.copy %[[S]], %[[D]]
// CHECK-NEXT:    }
// CHECK-NEXT:    return
// OFF-LABEL: func.func @unit_dims(
// OFF-NEXT:    linalg.copy
// OFF-NEXT:    return
func.func @unit_dims(%a: memref<1x3x1x16xf32, strided<[96, 32, 16, 1], offset: ?>>, %b: memref<1x3x1x16xf32, strided<[1000, 40, 7, 1], offset: ?>>) {
  linalg.copy ins(%a : memref<1x3x1x16xf32, strided<[96, 32, 16, 1], offset: ?>>) outs(%b : memref<1x3x1x16xf32, strided<[1000, 40, 7, 1], offset: ?>>)
  return
}
