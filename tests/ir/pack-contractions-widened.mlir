// Pass pack-contractions, bf16, f16 and i8 contractions on a spec with no unit and no vector arithmetic for
// them (intel/xeon-avx512: AVX-512 f32 FMAs, no AVX512-BF16, no VNNI): the f32 FMA kernel, its A and B loaded
// as stored and widened (arith.extf, arith.sitofp) as they are packed; the register tile is the f32
// product's. An i8 product's k blocks (at most 1024) sum exactly in f32 and are added to C as i32.
// RUN: %pbsdk opt %s --split-input-file --target cpu --spec intel/xeon-avx512 -p pack-contractions \
// RUN:   --options threads=1 | filecheck %s
// A spec with a bf16 unit (amd/zen4: vdpbf16ps, vpdpbusd) computes bf16 and i8 on it, widening nothing; f16
// it widens.
// RUN: %pbsdk opt %s --split-input-file --target cpu --spec amd/zen4 -p pack-contractions \
// RUN:   --options threads=1 | filecheck %s --check-prefix=UNIT

// CHECK-LABEL: func.func @bf16(
// CHECK:         call @__pbsdk_mm0(
// CHECK-NOT:     linalg.matmul
// CHECK-LABEL: func.func @__pbsdk_mm0_part(
// CHECK:         vector.maskedload {{.*}} : memref<300x70xbf16>, vector<16xi1>, vector<16xbf16> into vector<16xbf16>
// CHECK-NEXT:    arith.extf {{.*}} : vector<16xbf16> to vector<16xf32>
// CHECK:         vector.fma {{.*}} : vector<16xf32>
// UNIT-LABEL:  func.func @__pbsdk_mm0_part(
// UNIT-NOT:      arith.extf
// UNIT:          llvm.call_intrinsic "llvm.x86.avx512bf16.dpbf16ps.512"
func.func @bf16(%a: memref<100x300xbf16>, %b: memref<300x70xbf16>, %c: memref<100x70xf32>) {
  %zero = arith.constant 0.0 : f32
  linalg.fill ins(%zero : f32) outs(%c : memref<100x70xf32>)
  linalg.matmul ins(%a, %b : memref<100x300xbf16>, memref<300x70xbf16>) outs(%c : memref<100x70xf32>)
  return
}

// -----

// CHECK-LABEL: func.func @f16(
// CHECK-LABEL: func.func @__pbsdk_mm0_part(
// CHECK:         arith.extf {{.*}} : vector<16xf16> to vector<16xf32>
// CHECK:         vector.fma {{.*}} : vector<16xf32>
// UNIT-LABEL:  func.func @__pbsdk_mm0_part(
// UNIT:          arith.extf {{.*}} : vector<16xf16> to vector<16xf32>
func.func @f16(%a: memref<100x300xf16>, %b: memref<300x70xf16>, %c: memref<100x70xf32>) {
  %zero = arith.constant 0.0 : f32
  linalg.fill ins(%zero : f32) outs(%c : memref<100x70xf32>)
  linalg.matmul ins(%a, %b : memref<100x300xf16>, memref<300x70xf16>) outs(%c : memref<100x70xf32>)
  return
}

// -----

// A product that accumulates in its own narrow type is left to the generic lowering (no widening changes
// what it rounds).
// CHECK-LABEL: func.func @bf16_acc(
// CHECK:         linalg.matmul
// CHECK-NOT:     call @__pbsdk_mm
func.func @bf16_acc(%a: memref<10x30xbf16>, %b: memref<30x7xbf16>, %c: memref<10x7xbf16>) {
  linalg.matmul ins(%a, %b : memref<10x30xbf16>, memref<30x7xbf16>) outs(%c : memref<10x7xbf16>)
  return
}

// -----

// CHECK-LABEL: func.func @i8(
// CHECK:         call @__pbsdk_mm0(
// CHECK-LABEL: func.func @__pbsdk_mm0_part(
// CHECK:         arith.sitofp {{.*}} : vector<16xi8> to vector<16xf32>
// CHECK:         vector.fma {{.*}} : vector<16xf32>
// CHECK:         arith.fptosi {{.*}} : vector<16xf32> to vector<16xi32>
// CHECK:         arith.addi {{.*}} : vector<16xi32>
// UNIT-LABEL:  func.func @__pbsdk_mm0_part(
// UNIT-NOT:      arith.sitofp
// UNIT:          llvm.call_intrinsic "llvm.x86.avx512.vpdpbusd.512"
func.func @i8(%a: memref<30x3000xi8>, %b: memref<3000x40xi8>, %c: memref<30x40xi32>) {
  %zero = arith.constant 0 : i32
  linalg.fill ins(%zero : i32) outs(%c : memref<30x40xi32>)
  linalg.matmul ins(%a, %b : memref<30x3000xi8>, memref<3000x40xi8>) outs(%c : memref<30x40xi32>)
  return
}
