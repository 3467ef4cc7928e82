// Pass pack-contractions, bf16 and i8 contractions on a spec with AMX (intel/xeon-amx: tdpbf16ps 16x16x32
// bf16->f32, tdpbssd 16x16x64 i8->i32, 8 tile registers): a tile kernel whose 32 x 32 register tile is 2 x 2
// accumulator tiles, carried through a loop over k as values (`scf.for` iter_args of `!amx.tile`); each step
// loads 2 tiles of the packed A and 2 of the packed B and issues 4 tile products; the accumulators go through
// a buffer to the C update.
// RUN: %pbsdk opt %s --split-input-file --target cpu --spec intel/xeon-amx -p pack-contractions \
// RUN:   --options threads=1 amx=on | filecheck %s
// With the option off the dot-product units in the vector registers take them.
// RUN: %pbsdk opt %s --split-input-file --target cpu --spec intel/xeon-amx -p pack-contractions \
// RUN:   --options threads=1 amx=off | filecheck %s --check-prefix=OFF

// CHECK-LABEL: func.func @bf16(
// CHECK:         call @__pbsdk_mm0(
// CHECK-LABEL: func.func @__pbsdk_mm0_part(
// CHECK:         amx.tile_zero : !amx.tile<16x16xf32>
// CHECK:         scf.for {{.*}} iter_args({{.*}}) -> (!amx.tile<16x16xf32>, !amx.tile<16x16xf32>, !amx.tile<16x16xf32>, !amx.tile<16x16xf32>)
// CHECK-COUNT-4:   amx.tile_load {{.*}} into !amx.tile<16x32xbf16>
// CHECK-COUNT-4:   amx.tile_mulf
// CHECK:           scf.yield {{.*}} : !amx.tile<16x16xf32>, !amx.tile<16x16xf32>, !amx.tile<16x16xf32>, !amx.tile<16x16xf32>
// CHECK-COUNT-4: amx.tile_store
// OFF-LABEL:   func.func @__pbsdk_mm0_part(
// OFF-NOT:       amx.
// OFF:           llvm.call_intrinsic "llvm.x86.avx512bf16.dpbf16ps.512"
func.func @bf16(%a: memref<100x300xbf16>, %b: memref<300x70xbf16>, %c: memref<100x70xf32>) {
  %zero = arith.constant 0.0 : f32
  linalg.fill ins(%zero : f32) outs(%c : memref<100x70xf32>)
  linalg.matmul ins(%a, %b : memref<100x300xbf16>, memref<300x70xbf16>) outs(%c : memref<100x70xf32>)
  return
}

// -----

// CHECK-LABEL: func.func @i8(
// CHECK-LABEL: func.func @__pbsdk_mm0_part(
// CHECK:         scf.for {{.*}} iter_args({{.*}}) -> (!amx.tile<16x16xi32>, !amx.tile<16x16xi32>, !amx.tile<16x16xi32>, !amx.tile<16x16xi32>)
// CHECK-COUNT-4:   amx.tile_load {{.*}} into !amx.tile<16x64xi8>
// CHECK-COUNT-4:   amx.tile_muli
// OFF-LABEL:   func.func @__pbsdk_mm0_part(
// OFF:           llvm.call_intrinsic "llvm.x86.avx512.vpdpbusd.512"
func.func @i8(%a: memref<100x300xi8>, %b: memref<300x70xi8>, %c: memref<100x70xi32>) {
  %zero = arith.constant 0 : i32
  linalg.fill ins(%zero : i32) outs(%c : memref<100x70xi32>)
  linalg.matmul ins(%a, %b : memref<100x300xi8>, memref<300x70xi8>) outs(%c : memref<100x70xi32>)
  return
}
