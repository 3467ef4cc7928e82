// Pass fill-borders (core; the cpu target's stage): a fill that a later op overwrites in a static box (the
// interior of a padded buffer) fills only the frame around the box, at most two slabs per dimension.
// RUN: %pbsdk opt %s --split-input-file -p fill-borders | filecheck %s
// RUN: %pbsdk opt %s --split-input-file --target cpu -p fill-borders --options fill_borders=false | filecheck %s --check-prefix=OFF

// An NHWC image padded by one pixel: rows 0 and 5 whole, then columns 0 and 5 of rows 1-4.
// CHECK-LABEL: func.func @pad(
// CHECK-SAME:      %[[X:.*]]: memref<1x4x4x8xf32>, %[[P:.*]]: memref<1x6x6x8xf32>)
// CHECK:         %[[Z:.*]] = arith.constant 0.0
// CHECK-NEXT:    %[[S0:.*]] = memref.subview %[[P]][0, 0, 0, 0] [1, 1, 6, 8] [1, 1, 1, 1] : memref<1x6x6x8xf32> to memref<1x1x6x8xf32, strided<[288, 48, 8, 1]>>
// CHECK-NEXT:    linalg.fill ins(%[[Z]] : f32) outs(%[[S0]] :
// CHECK-NEXT:    %[[S1:.*]] = memref.subview %[[P]][0, 5, 0, 0] [1, 1, 6, 8] [1, 1, 1, 1] : memref<1x6x6x8xf32> to memref<1x1x6x8xf32, strided<[288, 48, 8, 1], offset: 240>>
// CHECK-NEXT:    linalg.fill ins(%[[Z]] : f32) outs(%[[S1]] :
// CHECK-NEXT:    %[[S2:.*]] = memref.subview %[[P]][0, 1, 0, 0] [1, 4, 1, 8] [1, 1, 1, 1] : memref<1x6x6x8xf32> to memref<1x4x1x8xf32, strided<[288, 48, 8, 1], offset: 48>>
// CHECK-NEXT:    linalg.fill ins(%[[Z]] : f32) outs(%[[S2]] :
// CHECK-NEXT:    %[[S3:.*]] = memref.subview %[[P]][0, 1, 5, 0] [1, 4, 1, 8] [1, 1, 1, 1] : memref<1x6x6x8xf32> to memref<1x4x1x8xf32, strided<[288, 48, 8, 1], offset: 88>>
// CHECK-NEXT:    linalg.fill ins(%[[Z]] : f32) outs(%[[S3]] :
// CHECK-NOT:     linalg.map
// CHECK:         memref.copy %[[X]], %{{.*}}
// OFF-LABEL: func.func @pad(
// OFF-NOT:     linalg.fill
// OFF:         linalg.map outs(%{{.*}} : memref<1x6x6x8xf32>)
// OFF-NOT:     linalg.fill
// OFF:         memref.copy
func.func @pad(%x: memref<1x4x4x8xf32>, %p: memref<1x6x6x8xf32>) {
  %zero = arith.constant 0.0 : f32
  linalg.map outs(%p : memref<1x6x6x8xf32>)
    (%init: f32) {
      linalg.yield %zero : f32
    }
  %in = memref.subview %p[0, 1, 1, 0] [1, 4, 4, 8] [1, 1, 1, 1] : memref<1x6x6x8xf32> to memref<1x4x4x8xf32, strided<[288, 48, 8, 1], offset: 56>>
  memref.copy %x, %in : memref<1x4x4x8xf32> to memref<1x4x4x8xf32, strided<[288, 48, 8, 1], offset: 56>>
  return
}

// -----

// A linalg.fill padded on one side only, then written by a transpose-like generic that does not read its
// output: one slab, after the box.
// CHECK-LABEL: func.func @one_side(
// CHECK:         memref.subview %{{.*}}[6, 0] [2, 8] [1, 1] : memref<8x8xf32> to memref<2x8xf32, strided<[8, 1], offset: 48>>
// CHECK-NEXT:    linalg.fill
// CHECK-NOT:     linalg.fill
// CHECK:         linalg.generic
#id = affine_map<(d0, d1) -> (d0, d1)>
#tr = affine_map<(d0, d1) -> (d1, d0)>
func.func @one_side(%x: memref<8x6xf32>, %p: memref<8x8xf32>) {
  %one = arith.constant 1.0 : f32
  linalg.fill ins(%one : f32) outs(%p : memref<8x8xf32>)
  %in = memref.subview %p[0, 0] [6, 8] [1, 1] : memref<8x8xf32> to memref<6x8xf32, strided<[8, 1]>>
  linalg.generic {indexing_maps = [#tr, #id], iterator_types = ["parallel", "parallel"]}
      ins(%x : memref<8x6xf32>) outs(%in : memref<6x8xf32, strided<[8, 1]>>) {
  ^bb0(%a: f32, %o: f32):
    linalg.yield %a : f32
  }
  return
}

// -----

// The box is the whole buffer: the fill goes.
// CHECK-LABEL: func.func @whole(
// CHECK-NOT:     linalg.fill
// CHECK:         memref.copy
func.func @whole(%x: memref<4x4xf32>, %p: memref<4x4xf32>) {
  %zero = arith.constant 0.0 : f32
  linalg.fill ins(%zero : f32) outs(%p : memref<4x4xf32>)
  %in = memref.subview %p[0, 0] [4, 4] [1, 1] : memref<4x4xf32> to memref<4x4xf32, strided<[4, 1]>>
  memref.copy %x, %in : memref<4x4xf32> to memref<4x4xf32, strided<[4, 1]>>
  return
}

// -----

// Refused: an op between the fill and the copy reads the buffer (it needs the fill's values everywhere).
// CHECK-LABEL: func.func @read_between(
// CHECK:         linalg.fill ins(%{{.*}} : f32) outs(%{{.*}} : memref<6x6xf32>)
// CHECK-NOT:     linalg.fill
func.func @read_between(%x: memref<4x4xf32>, %p: memref<6x6xf32>, %y: memref<6x6xf32>) {
  %zero = arith.constant 0.0 : f32
  linalg.fill ins(%zero : f32) outs(%p : memref<6x6xf32>)
  memref.copy %p, %y : memref<6x6xf32> to memref<6x6xf32>
  %in = memref.subview %p[1, 1] [4, 4] [1, 1] : memref<6x6xf32> to memref<4x4xf32, strided<[6, 1], offset: 7>>
  memref.copy %x, %in : memref<4x4xf32> to memref<4x4xf32, strided<[6, 1], offset: 7>>
  return
}

// -----

// Refused: the generic that writes the box reads its output (an accumulation over the filled values).
// CHECK-LABEL: func.func @accumulates(
// CHECK:         linalg.fill ins(%{{.*}} : f32) outs(%{{.*}} : memref<6x6xf32>)
// CHECK-NOT:     linalg.fill
#id2 = affine_map<(d0, d1) -> (d0, d1)>
func.func @accumulates(%x: memref<4x4xf32>, %p: memref<6x6xf32>) {
  %zero = arith.constant 0.0 : f32
  linalg.fill ins(%zero : f32) outs(%p : memref<6x6xf32>)
  %in = memref.subview %p[1, 1] [4, 4] [1, 1] : memref<6x6xf32> to memref<4x4xf32, strided<[6, 1], offset: 7>>
  linalg.generic {indexing_maps = [#id2, #id2], iterator_types = ["parallel", "parallel"]}
      ins(%x : memref<4x4xf32>) outs(%in : memref<4x4xf32, strided<[6, 1], offset: 7>>) {
  ^bb0(%a: f32, %o: f32):
    %s = arith.addf %a, %o : f32
    linalg.yield %s : f32
  }
  return
}

// -----

// Refused: the copy runs inside a loop (not known to run), and a strided box (every other column).
// CHECK-LABEL: func.func @in_loop(
// CHECK:         linalg.fill ins(%{{.*}} : f32) outs(%{{.*}} : memref<6x6xf32>)
// CHECK-LABEL: func.func @strided_box(
// CHECK:         linalg.fill ins(%{{.*}} : f32) outs(%{{.*}} : memref<6x6xf32>)
// CHECK-NOT:     linalg.fill
func.func @in_loop(%x: memref<4x4xf32>, %p: memref<6x6xf32>, %n: index) {
  %zero = arith.constant 0.0 : f32
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  linalg.fill ins(%zero : f32) outs(%p : memref<6x6xf32>)
  %in = memref.subview %p[1, 1] [4, 4] [1, 1] : memref<6x6xf32> to memref<4x4xf32, strided<[6, 1], offset: 7>>
  scf.for %i = %c0 to %n step %c1 {
    memref.copy %x, %in : memref<4x4xf32> to memref<4x4xf32, strided<[6, 1], offset: 7>>
  }
  return
}
func.func @strided_box(%x: memref<6x3xf32>, %p: memref<6x6xf32>) {
  %zero = arith.constant 0.0 : f32
  linalg.fill ins(%zero : f32) outs(%p : memref<6x6xf32>)
  %in = memref.subview %p[0, 0] [6, 3] [1, 2] : memref<6x6xf32> to memref<6x3xf32, strided<[6, 2]>>
  memref.copy %x, %in : memref<6x3xf32> to memref<6x3xf32, strided<[6, 2]>>
  return
}
