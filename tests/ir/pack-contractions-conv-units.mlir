// Pass pack-contractions on the core's im2col of an NHWC bf16 convolution on a spec with a bf16 dot-product
// unit in the vector registers (amd/zen4: vdpbf16ps): the call becomes a unit kernel that reads the input in
// place (implicit GEMM on the unit). The contraction accumulates in its own f32 buffer and rounds it into
// its bf16 argument: the epilogue is folded into the kernel's last store, and C, never read or written,
// becomes a one-element stand-in.
// RUN: %pbsdk opt %s --split-input-file --target cpu --spec amd/zen4 -p pack-contractions \
// RUN:   --options threads=1 | filecheck %s
// RUN: %pbsdk opt %s --split-input-file --target cpu --spec amd/zen3 -p pack-contractions \
// RUN:   --options threads=1 | filecheck %s --check-prefix=PAIRS

// CHECK-LABEL: func.func @conv(
// CHECK-SAME:      %[[X:.*]]: memref<1x5x5x16xbf16>, %[[W:.*]]: memref<64x8xbf16>, %[[D:.*]]: memref<16x8xbf16>)
// CHECK-NOT:     memref.copy
// CHECK:         %[[S:.*]] = memref.alloca() : memref<1x1xf32>
// CHECK:         call @__pbsdk_mm0(%[[X]], %[[W]], %[[S]], %[[D]]) : (memref<1x5x5x16xbf16>, memref<64x8xbf16>, memref<1x1xf32>, memref<16x8xbf16>) -> ()
// CHECK-NEXT:    return
// CHECK-LABEL: func.func @__pbsdk_mm0_part(
// CHECK-SAME:      %{{.*}}: memref<1x5x5x16xbf16>
// CHECK:         memref.collapse_shape %{{.*}} {{\[\[}}0, 1, 2, 3]] : memref<1x5x5x16xbf16> into memref<400xbf16>
// CHECK:         vector.load %{{.*}} : memref<400xbf16>, vector<2xbf16>
// CHECK:         llvm.call_intrinsic "llvm.x86.avx512bf16.dpbf16ps.512"
// CHECK:         arith.truncf %{{.*}} : vector<16xf32> to vector<16xbf16>
// CHECK-NOT:     func.func private @__pbsdk_contraction0
func.func @conv(%x: memref<1x5x5x16xbf16>, %w: memref<64x8xbf16>, %d: memref<16x8xbf16>) {
  %p = memref.alloc() {alignment = 64 : i64} : memref<1x4x4x2x2x16xbf16>
  %s00 = memref.subview %x[0, 0, 0, 0] [1, 4, 4, 16] [1, 1, 1, 1] : memref<1x5x5x16xbf16> to memref<1x4x4x16xbf16, strided<[400, 80, 16, 1]>>
  %d00 = memref.subview %p[0, 0, 0, 0, 0, 0] [1, 4, 4, 1, 1, 16] [1, 1, 1, 1, 1, 1] : memref<1x4x4x2x2x16xbf16> to memref<1x4x4x16xbf16, strided<[1024, 256, 64, 1]>>
  memref.copy %s00, %d00 : memref<1x4x4x16xbf16, strided<[400, 80, 16, 1]>> to memref<1x4x4x16xbf16, strided<[1024, 256, 64, 1]>>
  %s01 = memref.subview %x[0, 0, 1, 0] [1, 4, 4, 16] [1, 1, 1, 1] : memref<1x5x5x16xbf16> to memref<1x4x4x16xbf16, strided<[400, 80, 16, 1], offset: 16>>
  %d01 = memref.subview %p[0, 0, 0, 0, 1, 0] [1, 4, 4, 1, 1, 16] [1, 1, 1, 1, 1, 1] : memref<1x4x4x2x2x16xbf16> to memref<1x4x4x16xbf16, strided<[1024, 256, 64, 1], offset: 16>>
  memref.copy %s01, %d01 : memref<1x4x4x16xbf16, strided<[400, 80, 16, 1], offset: 16>> to memref<1x4x4x16xbf16, strided<[1024, 256, 64, 1], offset: 16>>
  %s10 = memref.subview %x[0, 1, 0, 0] [1, 4, 4, 16] [1, 1, 1, 1] : memref<1x5x5x16xbf16> to memref<1x4x4x16xbf16, strided<[400, 80, 16, 1], offset: 80>>
  %d10 = memref.subview %p[0, 0, 0, 1, 0, 0] [1, 4, 4, 1, 1, 16] [1, 1, 1, 1, 1, 1] : memref<1x4x4x2x2x16xbf16> to memref<1x4x4x16xbf16, strided<[1024, 256, 64, 1], offset: 32>>
  memref.copy %s10, %d10 : memref<1x4x4x16xbf16, strided<[400, 80, 16, 1], offset: 80>> to memref<1x4x4x16xbf16, strided<[1024, 256, 64, 1], offset: 32>>
  %s11 = memref.subview %x[0, 1, 1, 0] [1, 4, 4, 16] [1, 1, 1, 1] : memref<1x5x5x16xbf16> to memref<1x4x4x16xbf16, strided<[400, 80, 16, 1], offset: 96>>
  %d11 = memref.subview %p[0, 0, 0, 1, 1, 0] [1, 4, 4, 1, 1, 16] [1, 1, 1, 1, 1, 1] : memref<1x4x4x2x2x16xbf16> to memref<1x4x4x16xbf16, strided<[1024, 256, 64, 1], offset: 48>>
  memref.copy %s11, %d11 : memref<1x4x4x16xbf16, strided<[400, 80, 16, 1], offset: 96>> to memref<1x4x4x16xbf16, strided<[1024, 256, 64, 1], offset: 48>>
  %a = memref.collapse_shape %p [[0, 1, 2], [3, 4, 5]] : memref<1x4x4x2x2x16xbf16> into memref<16x64xbf16>
  call @__pbsdk_contraction0(%a, %w, %d) : (memref<16x64xbf16>, memref<64x8xbf16>, memref<16x8xbf16>) -> ()
  memref.dealloc %p : memref<1x4x4x2x2x16xbf16>
  return
}
func.func private @__pbsdk_contraction0(%a: memref<16x64xbf16>, %b: memref<64x8xbf16>, %d: memref<16x8xbf16>) {
  %zero = arith.constant 0.0 : f32
  %c = memref.alloc() {alignment = 64 : i64} : memref<16x8xf32>
  linalg.fill ins(%zero : f32) outs(%c : memref<16x8xf32>)
  linalg.matmul ins(%a, %b : memref<16x64xbf16>, memref<64x8xbf16>) outs(%c : memref<16x8xf32>)
  linalg.generic {indexing_maps = [affine_map<(i, j) -> (i, j)>, affine_map<(i, j) -> (i, j)>], iterator_types = ["parallel", "parallel"]}
      ins(%c : memref<16x8xf32>) outs(%d : memref<16x8xbf16>) {
  ^bb0(%in: f32, %out: bf16):
    %r = arith.truncf %in : f32 to bf16
    linalg.yield %r : bf16
  }
  memref.dealloc %c : memref<16x8xf32>
  return
}

// -----

// Reject: 17 channels, so a tap's channels are not whole pairs of the unit's k. The im2col stays (the
// contraction is packed later as a plain unit matmul), but its four tap copies become one function that
// copies each output pixel's kernel row (2 taps x 17 adjacent values) with masked vector loads and stores.
// CHECK-LABEL: func.func @odd_channels(
// CHECK-NOT:     memref.copy
// CHECK:         call @__pbsdk_im2col_rows0(%{{.*}}, %{{.*}}) : (memref<1x5x5x17xbf16>, memref<1x4x4x2x2x17xbf16>) -> ()
// CHECK:         call @__pbsdk_contraction0(
// CHECK-LABEL: func.func private @__pbsdk_contraction0(
// CHECK:         call @__pbsdk_mm0(
// CHECK-LABEL: func.func private @__pbsdk_im2col_rows0(
// CHECK:         vector.maskedload %{{.*}} : memref<425xbf16>, vector<32xi1>, vector<32xbf16> into vector<32xbf16>
// CHECK:         vector.maskedstore %{{.*}} : memref<1088xbf16>, vector<32xi1>, vector<32xbf16>
func.func @odd_channels(%x: memref<1x5x5x17xbf16>, %w: memref<68x8xbf16>, %d: memref<16x8xbf16>) {
  %p = memref.alloc() {alignment = 64 : i64} : memref<1x4x4x2x2x17xbf16>
  %s00 = memref.subview %x[0, 0, 0, 0] [1, 4, 4, 17] [1, 1, 1, 1] : memref<1x5x5x17xbf16> to memref<1x4x4x17xbf16, strided<[425, 85, 17, 1]>>
  %d00 = memref.subview %p[0, 0, 0, 0, 0, 0] [1, 4, 4, 1, 1, 17] [1, 1, 1, 1, 1, 1] : memref<1x4x4x2x2x17xbf16> to memref<1x4x4x17xbf16, strided<[1088, 272, 68, 1]>>
  memref.copy %s00, %d00 : memref<1x4x4x17xbf16, strided<[425, 85, 17, 1]>> to memref<1x4x4x17xbf16, strided<[1088, 272, 68, 1]>>
  %s01 = memref.subview %x[0, 0, 1, 0] [1, 4, 4, 17] [1, 1, 1, 1] : memref<1x5x5x17xbf16> to memref<1x4x4x17xbf16, strided<[425, 85, 17, 1], offset: 17>>
  %d01 = memref.subview %p[0, 0, 0, 0, 1, 0] [1, 4, 4, 1, 1, 17] [1, 1, 1, 1, 1, 1] : memref<1x4x4x2x2x17xbf16> to memref<1x4x4x17xbf16, strided<[1088, 272, 68, 1], offset: 17>>
  memref.copy %s01, %d01 : memref<1x4x4x17xbf16, strided<[425, 85, 17, 1], offset: 17>> to memref<1x4x4x17xbf16, strided<[1088, 272, 68, 1], offset: 17>>
  %s10 = memref.subview %x[0, 1, 0, 0] [1, 4, 4, 17] [1, 1, 1, 1] : memref<1x5x5x17xbf16> to memref<1x4x4x17xbf16, strided<[425, 85, 17, 1], offset: 85>>
  %d10 = memref.subview %p[0, 0, 0, 1, 0, 0] [1, 4, 4, 1, 1, 17] [1, 1, 1, 1, 1, 1] : memref<1x4x4x2x2x17xbf16> to memref<1x4x4x17xbf16, strided<[1088, 272, 68, 1], offset: 34>>
  memref.copy %s10, %d10 : memref<1x4x4x17xbf16, strided<[425, 85, 17, 1], offset: 85>> to memref<1x4x4x17xbf16, strided<[1088, 272, 68, 1], offset: 34>>
  %s11 = memref.subview %x[0, 1, 1, 0] [1, 4, 4, 17] [1, 1, 1, 1] : memref<1x5x5x17xbf16> to memref<1x4x4x17xbf16, strided<[425, 85, 17, 1], offset: 102>>
  %d11 = memref.subview %p[0, 0, 0, 1, 1, 0] [1, 4, 4, 1, 1, 17] [1, 1, 1, 1, 1, 1] : memref<1x4x4x2x2x17xbf16> to memref<1x4x4x17xbf16, strided<[1088, 272, 68, 1], offset: 51>>
  memref.copy %s11, %d11 : memref<1x4x4x17xbf16, strided<[425, 85, 17, 1], offset: 102>> to memref<1x4x4x17xbf16, strided<[1088, 272, 68, 1], offset: 51>>
  %a = memref.collapse_shape %p [[0, 1, 2], [3, 4, 5]] : memref<1x4x4x2x2x17xbf16> into memref<16x68xbf16>
  call @__pbsdk_contraction0(%a, %w, %d) : (memref<16x68xbf16>, memref<68x8xbf16>, memref<16x8xbf16>) -> ()
  memref.dealloc %p : memref<1x4x4x2x2x17xbf16>
  return
}
func.func private @__pbsdk_contraction0(%a: memref<16x68xbf16>, %b: memref<68x8xbf16>, %d: memref<16x8xbf16>) {
  %zero = arith.constant 0.0 : f32
  %c = memref.alloc() {alignment = 64 : i64} : memref<16x8xf32>
  linalg.fill ins(%zero : f32) outs(%c : memref<16x8xf32>)
  linalg.matmul ins(%a, %b : memref<16x68xbf16>, memref<68x8xbf16>) outs(%c : memref<16x8xf32>)
  linalg.generic {indexing_maps = [affine_map<(i, j) -> (i, j)>, affine_map<(i, j) -> (i, j)>], iterator_types = ["parallel", "parallel"]}
      ins(%c : memref<16x8xf32>) outs(%d : memref<16x8xbf16>) {
  ^bb0(%in: f32, %out: bf16):
    %r = arith.truncf %in : f32 to bf16
    linalg.yield %r : bf16
  }
  memref.dealloc %c : memref<16x8xf32>
  return
}

// -----

// i8 on AVX2's vpmaddwd (amd/zen3: i8 read as i16 pairs): each kernel part widens the input once into an i16
// copy and broadcasts its channel pairs from there (an extension per value at every broadcast cost 1.4-1.6x);
// the weight's panels are i16; the i32 product is truncated into D by the folded epilogue.
// PAIRS-LABEL: func.func @conv_i8(
// PAIRS-NOT:     memref.copy
// PAIRS:         call @__pbsdk_mm0(
// PAIRS-LABEL: func.func @__pbsdk_mm0_part(
// PAIRS-SAME:      %{{.*}}: memref<1x5x5x16xi8>
// PAIRS:         memref.collapse_shape %{{.*}} {{\[\[}}0, 1, 2, 3]] : memref<1x5x5x16xi8> into memref<400xi8>
// PAIRS:         %[[WIDE:.*]] = memref.alloc() {alignment = 64 : i64} : memref<400xi16>
// PAIRS:         arith.extsi %{{.*}} : vector<16xi8> to vector<16xi16>
// PAIRS:         vector.load %[[WIDE]][%{{.*}}] : memref<400xi16>, vector<2xi16>
// PAIRS:         llvm.call_intrinsic "llvm.x86.avx2.pmadd.wd"
// PAIRS:         arith.trunci %{{.*}} : vector<8xi32> to vector<8xi8>
// PAIRS:         memref.dealloc %[[WIDE]] : memref<400xi16>
func.func @conv_i8(%x: memref<1x5x5x16xi8>, %w: memref<64x8xi8>, %d: memref<16x8xi8>) {
  %p = memref.alloc() {alignment = 64 : i64} : memref<1x4x4x2x2x16xi8>
  %s00 = memref.subview %x[0, 0, 0, 0] [1, 4, 4, 16] [1, 1, 1, 1] : memref<1x5x5x16xi8> to memref<1x4x4x16xi8, strided<[400, 80, 16, 1]>>
  %d00 = memref.subview %p[0, 0, 0, 0, 0, 0] [1, 4, 4, 1, 1, 16] [1, 1, 1, 1, 1, 1] : memref<1x4x4x2x2x16xi8> to memref<1x4x4x16xi8, strided<[1024, 256, 64, 1]>>
  memref.copy %s00, %d00 : memref<1x4x4x16xi8, strided<[400, 80, 16, 1]>> to memref<1x4x4x16xi8, strided<[1024, 256, 64, 1]>>
  %s01 = memref.subview %x[0, 0, 1, 0] [1, 4, 4, 16] [1, 1, 1, 1] : memref<1x5x5x16xi8> to memref<1x4x4x16xi8, strided<[400, 80, 16, 1], offset: 16>>
  %d01 = memref.subview %p[0, 0, 0, 0, 1, 0] [1, 4, 4, 1, 1, 16] [1, 1, 1, 1, 1, 1] : memref<1x4x4x2x2x16xi8> to memref<1x4x4x16xi8, strided<[1024, 256, 64, 1], offset: 16>>
  memref.copy %s01, %d01 : memref<1x4x4x16xi8, strided<[400, 80, 16, 1], offset: 16>> to memref<1x4x4x16xi8, strided<[1024, 256, 64, 1], offset: 16>>
  %s10 = memref.subview %x[0, 1, 0, 0] [1, 4, 4, 16] [1, 1, 1, 1] : memref<1x5x5x16xi8> to memref<1x4x4x16xi8, strided<[400, 80, 16, 1], offset: 80>>
  %d10 = memref.subview %p[0, 0, 0, 1, 0, 0] [1, 4, 4, 1, 1, 16] [1, 1, 1, 1, 1, 1] : memref<1x4x4x2x2x16xi8> to memref<1x4x4x16xi8, strided<[1024, 256, 64, 1], offset: 32>>
  memref.copy %s10, %d10 : memref<1x4x4x16xi8, strided<[400, 80, 16, 1], offset: 80>> to memref<1x4x4x16xi8, strided<[1024, 256, 64, 1], offset: 32>>
  %s11 = memref.subview %x[0, 1, 1, 0] [1, 4, 4, 16] [1, 1, 1, 1] : memref<1x5x5x16xi8> to memref<1x4x4x16xi8, strided<[400, 80, 16, 1], offset: 96>>
  %d11 = memref.subview %p[0, 0, 0, 1, 1, 0] [1, 4, 4, 1, 1, 16] [1, 1, 1, 1, 1, 1] : memref<1x4x4x2x2x16xi8> to memref<1x4x4x16xi8, strided<[1024, 256, 64, 1], offset: 48>>
  memref.copy %s11, %d11 : memref<1x4x4x16xi8, strided<[400, 80, 16, 1], offset: 96>> to memref<1x4x4x16xi8, strided<[1024, 256, 64, 1], offset: 48>>
  %a = memref.collapse_shape %p [[0, 1, 2], [3, 4, 5]] : memref<1x4x4x2x2x16xi8> into memref<16x64xi8>
  call @__pbsdk_contraction0(%a, %w, %d) : (memref<16x64xi8>, memref<64x8xi8>, memref<16x8xi8>) -> ()
  memref.dealloc %p : memref<1x4x4x2x2x16xi8>
  return
}
func.func private @__pbsdk_contraction0(%a: memref<16x64xi8>, %b: memref<64x8xi8>, %d: memref<16x8xi8>) {
  %zero = arith.constant 0 : i32
  %c = memref.alloc() {alignment = 64 : i64} : memref<16x8xi32>
  linalg.fill ins(%zero : i32) outs(%c : memref<16x8xi32>)
  linalg.matmul ins(%a, %b : memref<16x64xi8>, memref<64x8xi8>) outs(%c : memref<16x8xi32>)
  linalg.generic {indexing_maps = [affine_map<(i, j) -> (i, j)>, affine_map<(i, j) -> (i, j)>], iterator_types = ["parallel", "parallel"]}
      ins(%c : memref<16x8xi32>) outs(%d : memref<16x8xi8>) {
  ^bb0(%in: i32, %out: i8):
    %r = arith.trunci %in : i32 to i8
    linalg.yield %r : i8
  }
  memref.dealloc %c : memref<16x8xi32>
  return
}
