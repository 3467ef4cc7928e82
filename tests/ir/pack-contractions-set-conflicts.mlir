// Pass pack-contractions, an A stored [m, k] with few columns: read in place (no packing) unless the rows
// of a register tile would share one l1d set beyond its ways (the Xeon preset: 48 KiB, 12 ways, 64 B lines,
// so rows 4 KiB apart share one) and the tile does at most 2 vector FMAs per A value.
// RUN: %pbsdk opt %s --split-input-file --target cpu --spec intel/xeon-avx512 -p pack-contractions \
// RUN:   --options threads=1 transpose_gemm=false | filecheck %s
// RUN: %pbsdk opt %s --split-input-file --target cpu --spec intel/xeon-avx512 -p pack-contractions \
// RUN:   --options threads=1 transpose_gemm=false pack_a=false | filecheck %s --check-prefix=INPLACE

// K = 4096: a 16 KiB row stride, all 30 rows of the 30x16 tile in one set: A is packed (30-row panels).
// CHECK-LABEL: func.func @__pbsdk_mm0_part(%{{.*}}: memref<60x4096xf32>
// CHECK:         memref.alloc() {alignment = 64 : i64} : memref<{{[0-9]+}}x{{[0-9]+}}x30xf32>
// CHECK-NOT:     memref.load {{.*}} : memref<60x4096xf32>
// CHECK:         vector.fma
// CHECK-NOT:     memref.load {{.*}} : memref<60x4096xf32>
// CHECK-LABEL: func.func private @__pbsdk_mm0(
// Forced in place, the k loop loads A's values from A itself.
// INPLACE-LABEL: func.func @__pbsdk_mm0_part(%{{.*}}: memref<60x4096xf32>
// INPLACE:         memref.load {{.*}} : memref<60x4096xf32>
// INPLACE:         vector.fma
func.func @conflict(%a: memref<60x4096xf32>, %b: memref<4096x16xf32>, %c: memref<60x16xf32>) {
  %zero = arith.constant 0.0 : f32
  linalg.fill ins(%zero : f32) outs(%c : memref<60x16xf32>)
  linalg.matmul ins(%a, %b : memref<60x4096xf32>, memref<4096x16xf32>) outs(%c : memref<60x16xf32>)
  return
}

// -----

// K = 1000: rows 4000 B apart, each a line further on in the sets: A read in place.
// CHECK-LABEL: func.func @__pbsdk_mm0_part(%{{.*}}: memref<60x1000xf32>
// CHECK:         memref.load {{.*}} : memref<60x1000xf32>
// CHECK:         vector.fma
func.func @spread(%a: memref<60x1000xf32>, %b: memref<1000x16xf32>, %c: memref<60x16xf32>) {
  %zero = arith.constant 0.0 : f32
  linalg.fill ins(%zero : f32) outs(%c : memref<60x16xf32>)
  linalg.matmul ins(%a, %b : memref<60x1000xf32>, memref<1000x16xf32>) outs(%c : memref<60x16xf32>)
  return
}

// -----

// K = 1024 with 48 columns: the 8x48 tile does 3 vector FMAs per A value, which hide the refills: in place.
// CHECK-LABEL: func.func @__pbsdk_mm0_part(%{{.*}}: memref<64x1024xf32>
// CHECK:         memref.load {{.*}} : memref<64x1024xf32>
// CHECK:         vector.fma
func.func @wide(%a: memref<64x1024xf32>, %b: memref<1024x48xf32>, %c: memref<64x48xf32>) {
  %zero = arith.constant 0.0 : f32
  linalg.fill ins(%zero : f32) outs(%c : memref<64x48xf32>)
  linalg.matmul ins(%a, %b : memref<64x1024xf32>, memref<1024x48xf32>) outs(%c : memref<64x48xf32>)
  return
}
