// Pass pack-contractions on the core's im2col of an NHWC convolution (one strided copy per kernel tap into
// a patch buffer, collapsed and handed to the isolated contraction): the call becomes a packed kernel that
// reads the input in place (implicit GEMM). The patch buffer, its copies and the contraction function go;
// a view of the input that the padding copy also uses stays.
// RUN: %pbsdk opt %s --split-input-file --target cpu --spec intel/xeon-avx512 -p pack-contractions | filecheck %s
// RUN: %pbsdk opt %s --split-input-file --target cpu --spec intel/xeon-avx512 -p pack-contractions \
// RUN:   --options implicit_conv=false | filecheck %s --check-prefix=OFF

// A 2x2 kernel, stride 1, over a 1x5x5x16 input: 4x4 outputs.
// CHECK-LABEL: func.func @conv(
// CHECK-SAME:      %[[X:.*]]: memref<1x5x5x16xf32>, %[[W:.*]]: memref<64x8xf32>, %[[C:.*]]: memref<16x8xf32>)
// CHECK-NOT:     memref.copy
// CHECK-NOT:     memref.alloc
// CHECK:         call @__pbsdk_mm0(%[[X]], %[[W]], %[[C]]) : (memref<1x5x5x16xf32>, memref<64x8xf32>, memref<16x8xf32>) -> ()
// CHECK-NEXT:    return
// CHECK-LABEL: func.func @__pbsdk_mm0_part(
// CHECK-SAME:      %{{.*}}: memref<1x5x5x16xf32>
// CHECK:         memref.collapse_shape %{{.*}} {{\[\[}}0, 1, 2, 3]] : memref<1x5x5x16xf32> into memref<400xf32>
// CHECK:         scf.if
// CHECK:         vector.fma
// CHECK-NOT:     func.func private @__pbsdk_contraction0
// OFF-LABEL: func.func @conv(
// OFF-COUNT-4:   memref.copy
// OFF:           call @__pbsdk_contraction0(
func.func @conv(%x: memref<1x5x5x16xf32>, %w: memref<64x8xf32>, %c: memref<16x8xf32>) {
  %p = memref.alloc() {alignment = 64 : i64} : memref<1x4x4x2x2x16xf32>
  %s00 = memref.subview %x[0, 0, 0, 0] [1, 4, 4, 16] [1, 1, 1, 1] : memref<1x5x5x16xf32> to memref<1x4x4x16xf32, strided<[400, 80, 16, 1]>>
  %d00 = memref.subview %p[0, 0, 0, 0, 0, 0] [1, 4, 4, 1, 1, 16] [1, 1, 1, 1, 1, 1] : memref<1x4x4x2x2x16xf32> to memref<1x4x4x16xf32, strided<[1024, 256, 64, 1]>>
  memref.copy %s00, %d00 : memref<1x4x4x16xf32, strided<[400, 80, 16, 1]>> to memref<1x4x4x16xf32, strided<[1024, 256, 64, 1]>>
  %s01 = memref.subview %x[0, 0, 1, 0] [1, 4, 4, 16] [1, 1, 1, 1] : memref<1x5x5x16xf32> to memref<1x4x4x16xf32, strided<[400, 80, 16, 1], offset: 16>>
  %d01 = memref.subview %p[0, 0, 0, 0, 1, 0] [1, 4, 4, 1, 1, 16] [1, 1, 1, 1, 1, 1] : memref<1x4x4x2x2x16xf32> to memref<1x4x4x16xf32, strided<[1024, 256, 64, 1], offset: 16>>
  memref.copy %s01, %d01 : memref<1x4x4x16xf32, strided<[400, 80, 16, 1], offset: 16>> to memref<1x4x4x16xf32, strided<[1024, 256, 64, 1], offset: 16>>
  %s10 = memref.subview %x[0, 1, 0, 0] [1, 4, 4, 16] [1, 1, 1, 1] : memref<1x5x5x16xf32> to memref<1x4x4x16xf32, strided<[400, 80, 16, 1], offset: 80>>
  %d10 = memref.subview %p[0, 0, 0, 1, 0, 0] [1, 4, 4, 1, 1, 16] [1, 1, 1, 1, 1, 1] : memref<1x4x4x2x2x16xf32> to memref<1x4x4x16xf32, strided<[1024, 256, 64, 1], offset: 32>>
  memref.copy %s10, %d10 : memref<1x4x4x16xf32, strided<[400, 80, 16, 1], offset: 80>> to memref<1x4x4x16xf32, strided<[1024, 256, 64, 1], offset: 32>>
  %s11 = memref.subview %x[0, 1, 1, 0] [1, 4, 4, 16] [1, 1, 1, 1] : memref<1x5x5x16xf32> to memref<1x4x4x16xf32, strided<[400, 80, 16, 1], offset: 96>>
  %d11 = memref.subview %p[0, 0, 0, 1, 1, 0] [1, 4, 4, 1, 1, 16] [1, 1, 1, 1, 1, 1] : memref<1x4x4x2x2x16xf32> to memref<1x4x4x16xf32, strided<[1024, 256, 64, 1], offset: 48>>
  memref.copy %s11, %d11 : memref<1x4x4x16xf32, strided<[400, 80, 16, 1], offset: 96>> to memref<1x4x4x16xf32, strided<[1024, 256, 64, 1], offset: 48>>
  %a = memref.collapse_shape %p [[0, 1, 2], [3, 4, 5]] : memref<1x4x4x2x2x16xf32> into memref<16x64xf32>
  call @__pbsdk_contraction0(%a, %w, %c) : (memref<16x64xf32>, memref<64x8xf32>, memref<16x8xf32>) -> ()
  memref.dealloc %p : memref<1x4x4x2x2x16xf32>
  return
}
func.func private @__pbsdk_contraction0(%a: memref<16x64xf32>, %b: memref<64x8xf32>, %c: memref<16x8xf32>) {
  %zero = arith.constant 0.0 : f32
  linalg.fill ins(%zero : f32) outs(%c : memref<16x8xf32>)
  linalg.matmul ins(%a, %b : memref<16x64xf32>, memref<64x8xf32>) outs(%c : memref<16x8xf32>)
  return
}

// -----

// Reject: the input is written between the copies and the call, so reading it at the call would not read
// what the copies read. The im2col stays; the contraction is packed as a plain matmul.
// CHECK-LABEL: func.func @written_between(
// CHECK-COUNT-4: memref.copy
// CHECK:         linalg.fill
// CHECK:         call @__pbsdk_contraction0(
// CHECK-LABEL: func.func private @__pbsdk_contraction0(
// CHECK:         call @__pbsdk_mm0(
func.func @written_between(%x: memref<1x5x5x16xf32>, %w: memref<64x8xf32>, %c: memref<16x8xf32>) {
  %p = memref.alloc() {alignment = 64 : i64} : memref<1x4x4x2x2x16xf32>
  %s00 = memref.subview %x[0, 0, 0, 0] [1, 4, 4, 16] [1, 1, 1, 1] : memref<1x5x5x16xf32> to memref<1x4x4x16xf32, strided<[400, 80, 16, 1]>>
  %d00 = memref.subview %p[0, 0, 0, 0, 0, 0] [1, 4, 4, 1, 1, 16] [1, 1, 1, 1, 1, 1] : memref<1x4x4x2x2x16xf32> to memref<1x4x4x16xf32, strided<[1024, 256, 64, 1]>>
  memref.copy %s00, %d00 : memref<1x4x4x16xf32, strided<[400, 80, 16, 1]>> to memref<1x4x4x16xf32, strided<[1024, 256, 64, 1]>>
  %s01 = memref.subview %x[0, 0, 1, 0] [1, 4, 4, 16] [1, 1, 1, 1] : memref<1x5x5x16xf32> to memref<1x4x4x16xf32, strided<[400, 80, 16, 1], offset: 16>>
  %d01 = memref.subview %p[0, 0, 0, 0, 1, 0] [1, 4, 4, 1, 1, 16] [1, 1, 1, 1, 1, 1] : memref<1x4x4x2x2x16xf32> to memref<1x4x4x16xf32, strided<[1024, 256, 64, 1], offset: 16>>
  memref.copy %s01, %d01 : memref<1x4x4x16xf32, strided<[400, 80, 16, 1], offset: 16>> to memref<1x4x4x16xf32, strided<[1024, 256, 64, 1], offset: 16>>
  %s10 = memref.subview %x[0, 1, 0, 0] [1, 4, 4, 16] [1, 1, 1, 1] : memref<1x5x5x16xf32> to memref<1x4x4x16xf32, strided<[400, 80, 16, 1], offset: 80>>
  %d10 = memref.subview %p[0, 0, 0, 1, 0, 0] [1, 4, 4, 1, 1, 16] [1, 1, 1, 1, 1, 1] : memref<1x4x4x2x2x16xf32> to memref<1x4x4x16xf32, strided<[1024, 256, 64, 1], offset: 32>>
  memref.copy %s10, %d10 : memref<1x4x4x16xf32, strided<[400, 80, 16, 1], offset: 80>> to memref<1x4x4x16xf32, strided<[1024, 256, 64, 1], offset: 32>>
  %s11 = memref.subview %x[0, 1, 1, 0] [1, 4, 4, 16] [1, 1, 1, 1] : memref<1x5x5x16xf32> to memref<1x4x4x16xf32, strided<[400, 80, 16, 1], offset: 96>>
  %d11 = memref.subview %p[0, 0, 0, 1, 1, 0] [1, 4, 4, 1, 1, 16] [1, 1, 1, 1, 1, 1] : memref<1x4x4x2x2x16xf32> to memref<1x4x4x16xf32, strided<[1024, 256, 64, 1], offset: 48>>
  memref.copy %s11, %d11 : memref<1x4x4x16xf32, strided<[400, 80, 16, 1], offset: 96>> to memref<1x4x4x16xf32, strided<[1024, 256, 64, 1], offset: 48>>
  %zero = arith.constant 0.0 : f32
  linalg.fill ins(%zero : f32) outs(%x : memref<1x5x5x16xf32>)
  %a = memref.collapse_shape %p [[0, 1, 2], [3, 4, 5]] : memref<1x4x4x2x2x16xf32> into memref<16x64xf32>
  call @__pbsdk_contraction0(%a, %w, %c) : (memref<16x64xf32>, memref<64x8xf32>, memref<16x8xf32>) -> ()
  memref.dealloc %p : memref<1x4x4x2x2x16xf32>
  return
}
func.func private @__pbsdk_contraction0(%a: memref<16x64xf32>, %b: memref<64x8xf32>, %c: memref<16x8xf32>) {
  %zero = arith.constant 0.0 : f32
  linalg.fill ins(%zero : f32) outs(%c : memref<16x8xf32>)
  linalg.matmul ins(%a, %b : memref<16x64xf32>, memref<64x8xf32>) outs(%c : memref<16x8xf32>)
  return
}

// -----

// Reject: a tap is missing (not an im2col: tap (1, 1) of the patch buffer would be uninitialised).
// CHECK-LABEL: func.func @missing_tap(
// CHECK-COUNT-3: memref.copy
// CHECK:         call @__pbsdk_contraction0(
func.func @missing_tap(%x: memref<1x5x5x16xf32>, %w: memref<64x8xf32>, %c: memref<16x8xf32>) {
  %p = memref.alloc() {alignment = 64 : i64} : memref<1x4x4x2x2x16xf32>
  %s00 = memref.subview %x[0, 0, 0, 0] [1, 4, 4, 16] [1, 1, 1, 1] : memref<1x5x5x16xf32> to memref<1x4x4x16xf32, strided<[400, 80, 16, 1]>>
  %d00 = memref.subview %p[0, 0, 0, 0, 0, 0] [1, 4, 4, 1, 1, 16] [1, 1, 1, 1, 1, 1] : memref<1x4x4x2x2x16xf32> to memref<1x4x4x16xf32, strided<[1024, 256, 64, 1]>>
  memref.copy %s00, %d00 : memref<1x4x4x16xf32, strided<[400, 80, 16, 1]>> to memref<1x4x4x16xf32, strided<[1024, 256, 64, 1]>>
  %s01 = memref.subview %x[0, 0, 1, 0] [1, 4, 4, 16] [1, 1, 1, 1] : memref<1x5x5x16xf32> to memref<1x4x4x16xf32, strided<[400, 80, 16, 1], offset: 16>>
  %d01 = memref.subview %p[0, 0, 0, 0, 1, 0] [1, 4, 4, 1, 1, 16] [1, 1, 1, 1, 1, 1] : memref<1x4x4x2x2x16xf32> to memref<1x4x4x16xf32, strided<[1024, 256, 64, 1], offset: 16>>
  memref.copy %s01, %d01 : memref<1x4x4x16xf32, strided<[400, 80, 16, 1], offset: 16>> to memref<1x4x4x16xf32, strided<[1024, 256, 64, 1], offset: 16>>
  %s10 = memref.subview %x[0, 1, 0, 0] [1, 4, 4, 16] [1, 1, 1, 1] : memref<1x5x5x16xf32> to memref<1x4x4x16xf32, strided<[400, 80, 16, 1], offset: 80>>
  %d10 = memref.subview %p[0, 0, 0, 1, 0, 0] [1, 4, 4, 1, 1, 16] [1, 1, 1, 1, 1, 1] : memref<1x4x4x2x2x16xf32> to memref<1x4x4x16xf32, strided<[1024, 256, 64, 1], offset: 32>>
  memref.copy %s10, %d10 : memref<1x4x4x16xf32, strided<[400, 80, 16, 1], offset: 80>> to memref<1x4x4x16xf32, strided<[1024, 256, 64, 1], offset: 32>>
  %a = memref.collapse_shape %p [[0, 1, 2], [3, 4, 5]] : memref<1x4x4x2x2x16xf32> into memref<16x64xf32>
  call @__pbsdk_contraction0(%a, %w, %c) : (memref<16x64xf32>, memref<64x8xf32>, memref<16x8xf32>) -> ()
  memref.dealloc %p : memref<1x4x4x2x2x16xf32>
  return
}
func.func private @__pbsdk_contraction0(%a: memref<16x64xf32>, %b: memref<64x8xf32>, %c: memref<16x8xf32>) {
  %zero = arith.constant 0.0 : f32
  linalg.fill ins(%zero : f32) outs(%c : memref<16x8xf32>)
  linalg.matmul ins(%a, %b : memref<16x64xf32>, memref<64x8xf32>) outs(%c : memref<16x8xf32>)
  return
}

// -----

// Accepted: an op between the copies and the call that writes another buffer (an epilogue's scale computed
// on every call, a batch norm's rsqrt) reads nothing the copies wrote and writes nothing they read.
// CHECK-LABEL: func.func @other_written_between(
// CHECK-SAME:      %[[X:[^:]*]]: memref<1x5x5x16xf32>, %[[W:[^:]*]]: memref<64x8xf32>, %[[C:[^:]*]]: memref<16x8xf32>,
// CHECK-NOT:     memref.copy
// CHECK:         linalg.generic
// CHECK:         call @__pbsdk_mm0(%[[X]], %[[W]], %[[C]])
func.func @other_written_between(%x: memref<1x5x5x16xf32>, %w: memref<64x8xf32>, %c: memref<16x8xf32>,
                                 %v: memref<8xf32>, %scale: memref<8xf32>) {
  %p = memref.alloc() {alignment = 64 : i64} : memref<1x4x4x2x2x16xf32>
  %s00 = memref.subview %x[0, 0, 0, 0] [1, 4, 4, 16] [1, 1, 1, 1] : memref<1x5x5x16xf32> to memref<1x4x4x16xf32, strided<[400, 80, 16, 1]>>
  %d00 = memref.subview %p[0, 0, 0, 0, 0, 0] [1, 4, 4, 1, 1, 16] [1, 1, 1, 1, 1, 1] : memref<1x4x4x2x2x16xf32> to memref<1x4x4x16xf32, strided<[1024, 256, 64, 1]>>
  memref.copy %s00, %d00 : memref<1x4x4x16xf32, strided<[400, 80, 16, 1]>> to memref<1x4x4x16xf32, strided<[1024, 256, 64, 1]>>
  %s01 = memref.subview %x[0, 0, 1, 0] [1, 4, 4, 16] [1, 1, 1, 1] : memref<1x5x5x16xf32> to memref<1x4x4x16xf32, strided<[400, 80, 16, 1], offset: 16>>
  %d01 = memref.subview %p[0, 0, 0, 0, 1, 0] [1, 4, 4, 1, 1, 16] [1, 1, 1, 1, 1, 1] : memref<1x4x4x2x2x16xf32> to memref<1x4x4x16xf32, strided<[1024, 256, 64, 1], offset: 16>>
  memref.copy %s01, %d01 : memref<1x4x4x16xf32, strided<[400, 80, 16, 1], offset: 16>> to memref<1x4x4x16xf32, strided<[1024, 256, 64, 1], offset: 16>>
  %s10 = memref.subview %x[0, 1, 0, 0] [1, 4, 4, 16] [1, 1, 1, 1] : memref<1x5x5x16xf32> to memref<1x4x4x16xf32, strided<[400, 80, 16, 1], offset: 80>>
  %d10 = memref.subview %p[0, 0, 0, 1, 0, 0] [1, 4, 4, 1, 1, 16] [1, 1, 1, 1, 1, 1] : memref<1x4x4x2x2x16xf32> to memref<1x4x4x16xf32, strided<[1024, 256, 64, 1], offset: 32>>
  memref.copy %s10, %d10 : memref<1x4x4x16xf32, strided<[400, 80, 16, 1], offset: 80>> to memref<1x4x4x16xf32, strided<[1024, 256, 64, 1], offset: 32>>
  %s11 = memref.subview %x[0, 1, 1, 0] [1, 4, 4, 16] [1, 1, 1, 1] : memref<1x5x5x16xf32> to memref<1x4x4x16xf32, strided<[400, 80, 16, 1], offset: 96>>
  %d11 = memref.subview %p[0, 0, 0, 1, 1, 0] [1, 4, 4, 1, 1, 16] [1, 1, 1, 1, 1, 1] : memref<1x4x4x2x2x16xf32> to memref<1x4x4x16xf32, strided<[1024, 256, 64, 1], offset: 48>>
  memref.copy %s11, %d11 : memref<1x4x4x16xf32, strided<[400, 80, 16, 1], offset: 96>> to memref<1x4x4x16xf32, strided<[1024, 256, 64, 1], offset: 48>>
  linalg.generic {indexing_maps = [affine_map<(d0) -> (d0)>, affine_map<(d0) -> (d0)>], iterator_types = ["parallel"]}
      ins(%v : memref<8xf32>) outs(%scale : memref<8xf32>) {
  ^bb0(%in: f32, %out: f32):
    %r = math.rsqrt %in : f32
    linalg.yield %r : f32
  }
  %a = memref.collapse_shape %p [[0, 1, 2], [3, 4, 5]] : memref<1x4x4x2x2x16xf32> into memref<16x64xf32>
  call @__pbsdk_contraction0(%a, %w, %c) : (memref<16x64xf32>, memref<64x8xf32>, memref<16x8xf32>) -> ()
  memref.dealloc %p : memref<1x4x4x2x2x16xf32>
  return
}
func.func private @__pbsdk_contraction0(%a: memref<16x64xf32>, %b: memref<64x8xf32>, %c: memref<16x8xf32>) {
  %zero = arith.constant 0.0 : f32
  linalg.fill ins(%zero : f32) outs(%c : memref<16x8xf32>)
  linalg.matmul ins(%a, %b : memref<16x64xf32>, memref<64x8xf32>) outs(%c : memref<16x8xf32>)
  return
}
