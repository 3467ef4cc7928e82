// Pass pack-contractions, bf16 and i8 contractions on a spec with dot-product units in the vector registers
// (amd/zen4: vdpbf16ps 1x16x2 bf16->f32, vpdpbusd 1x16x4 i8->i32): a unit kernel whose k loop carries the
// accumulators, broadcasts a group of A per row, loads interleaved B (packed through vector.shuffle) and
// issues the unit's intrinsic; an elementwise epilogue after the product is folded into the last store.
// RUN: %pbsdk opt %s --split-input-file --target cpu --spec amd/zen4 -p pack-contractions \
// RUN:   --options threads=1 | filecheck %s
// On a spec without units (the portable Xeon baseline) both run on the f32 FMA kernel, their operands widened
// as packed (pack-contractions-widened.mlir).
// RUN: %pbsdk opt %s --split-input-file --target cpu --spec intel/xeon-avx512 -p pack-contractions \
// RUN:   --options threads=1 | filecheck %s --check-prefix=NOUNIT
// On AVX2's i8 unit (amd/zen3: vpmaddwd 1x8x2, i8 read as i16) the i8 products widen A and B to i16 as they
// are packed (A always: a widened broadcast in place would cost an extension per value), and each step is the
// intrinsic and an add: no offset, no column sums (a signed x signed product).
// RUN: %pbsdk opt %s --split-input-file --target cpu --spec amd/zen3 -p pack-contractions \
// RUN:   --options threads=1 | filecheck %s --check-prefix=PAIRS

// CHECK-LABEL: func.func @bf16(
// CHECK:         call @__pbsdk_mm0(%{{.*}}, %{{.*}}, %{{.*}}) : (memref<40x70xbf16>, memref<70x50xbf16>, memref<40x50xf32>)
// CHECK-NOT:     linalg.fill
// CHECK-LABEL: func.func @__pbsdk_mm0_part(
// B rows interleaved in pairs into the packed panels.
// CHECK:         vector.shuffle {{.*}} : vector<16xbf16>, vector<16xbf16>
// The k loop carries the accumulators; A's pair of a row as one 32-bit word, broadcast to every lane.
// CHECK:         scf.for {{.*}} iter_args(
// CHECK:         vector.bitcast {{.*}} : vector<2xbf16> to vector<1xi32>
// CHECK:         vector.broadcast {{.*}} : i32 to vector<16xi32>
// CHECK:         llvm.call_intrinsic "llvm.x86.avx512bf16.dpbf16ps.512"({{.*}}) : (vector<16xf32>, vector<32xbf16>, vector<32xbf16>) -> vector<16xf32>
// CHECK:         vector.maskedstore
// CHECK-LABEL: func.func private @__pbsdk_mm0(
// NOUNIT-LABEL: func.func @bf16(
// NOUNIT:         call @__pbsdk_mm0(
// NOUNIT-LABEL:  func.func @__pbsdk_mm0_part(
// NOUNIT:          arith.extf {{.*}} : vector<16xbf16> to vector<16xf32>
// NOUNIT:          vector.fma
func.func @bf16(%a: memref<40x70xbf16>, %b: memref<70x50xbf16>, %c: memref<40x50xf32>) {
  %zero = arith.constant 0.0 : f32
  linalg.fill ins(%zero : f32) outs(%c : memref<40x50xf32>)
  linalg.matmul ins(%a, %b : memref<40x70xbf16>, memref<70x50xbf16>) outs(%c : memref<40x50xf32>)
  return
}

// -----

// i8 x i8 -> i32 with few columns (two register tiles of 16): A read in place, each broadcast group offset
// by 128 (xor 0x80808080 on its 32 bits) for the u8 x i8 instruction; the accumulators start at -128 times
// B's column sums, computed while packing B with the same instruction.
// CHECK-LABEL: func.func @__pbsdk_mm0_part(
// CHECK-NOT:     memref<{{[0-9]+}}x11x128xi8>
// CHECK:         vector.shuffle {{.*}} : vector<16xi8>, vector<16xi8>
// CHECK:         vector.shuffle {{.*}} : vector<32xi8>, vector<32xi8>
// CHECK:         llvm.call_intrinsic "llvm.x86.avx512.vpdpbusd.512"
// CHECK:         arith.subi
// CHECK:         arith.xori %{{.*}}, %{{.*}} : i32
// CHECK:         llvm.call_intrinsic "llvm.x86.avx512.vpdpbusd.512"({{.*}}) : (vector<16xi32>, vector<64xi8>, vector<64xi8>) -> vector<16xi32>
// NOUNIT-LABEL: func.func @i8(
// NOUNIT:         call @__pbsdk_mm0(
// NOUNIT-LABEL:  func.func @__pbsdk_mm0_part(
// NOUNIT:          arith.sitofp {{.*}} : vector<16xi8> to vector<16xf32>
// PAIRS-LABEL: func.func @i8(
// PAIRS-LABEL: func.func @__pbsdk_mm0_part(
// PAIRS-NOT:     arith.xori
// PAIRS:         memref.alloc() {alignment = 64 : i64} : memref<{{[0-9]+}}x15x{{[0-9]+}}xi16>
// PAIRS:         memref.alloc() {alignment = 64 : i64} : memref<{{[0-9]+}}x{{[0-9]+}}x{{[0-9]+}}xi16>
// PAIRS:         arith.extsi {{.*}} : vector<8xi8> to vector<8xi16>
// PAIRS:         vector.shuffle {{.*}} : vector<8xi16>, vector<8xi16>
// PAIRS:         arith.extsi {{.*}} : vector<16xi8> to vector<16xi16>
// PAIRS:         vector.load {{.*}} : memref<{{.*}}xi16>, vector<2xi16>
// PAIRS-NEXT:    vector.bitcast {{.*}} : vector<2xi16> to vector<1xi32>
// PAIRS:         %[[P:.*]] = llvm.call_intrinsic "llvm.x86.avx2.pmadd.wd"({{.*}}) : (vector<16xi16>, vector<16xi16>) -> vector<8xi32>
// PAIRS-NEXT:    arith.addi %{{.*}}, %[[P]] : vector<8xi32>
// PAIRS-NOT:     arith.xori
// PAIRS-LABEL: func.func private @__pbsdk_mm0(
func.func @i8(%a: memref<33x30xi8>, %b: memref<30x20xi8>, %c: memref<33x20xi32>) {
  %zero = arith.constant 0 : i32
  linalg.fill ins(%zero : i32) outs(%c : memref<33x20xi32>)
  linalg.matmul ins(%a, %b : memref<33x30xi8>, memref<30x20xi8>) outs(%c : memref<33x20xi32>)
  return
}

// -----

// With many columns (200: 7 register tiles) A is packed, its bytes offset by 128 once: a 64-byte vector of
// a row at a time (masked at K's end) into rows padded by a vector (30 -> 128 bytes apart); B is packed
// several micro-panels a pass down its rows (the preset's 20x16 tile: 13 panels of 16 columns, one pass).
// CHECK-LABEL: func.func @__pbsdk_mm0_part(
// CHECK:         memref.alloc() {alignment = 64 : i64} : memref<13x8x64xi8>
// CHECK:         memref.alloc() {alignment = 64 : i64} : memref<{{[0-9]+}}x11x128xi8>
// CHECK:         vector.maskedload {{.*}} : memref<33x30xi8>, vector<64xi1>, vector<64xi8> into vector<64xi8>
// CHECK-NEXT:    arith.xori %{{.*}}, %{{.*}} : vector<64xi8>
// CHECK:         llvm.call_intrinsic "llvm.x86.avx512.vpdpbusd.512"({{.*}}) : (vector<16xi32>, vector<64xi8>, vector<64xi8>) -> vector<16xi32>
// NOUNIT-LABEL: func.func @i8_wide(
// NOUNIT:         call @__pbsdk_mm0(
// NOUNIT-LABEL:  func.func @__pbsdk_mm0_part(
// NOUNIT:          arith.sitofp
func.func @i8_wide(%a: memref<33x30xi8>, %b: memref<30x200xi8>, %c: memref<33x200xi32>) {
  %zero = arith.constant 0 : i32
  linalg.fill ins(%zero : i32) outs(%c : memref<33x200xi32>)
  linalg.matmul ins(%a, %b : memref<33x30xi8>, memref<30x200xi8>) outs(%c : memref<33x200xi32>)
  return
}

// -----

// The product rounded back to bf16 and a bias added (what isolate-contractions leaves in the function): the
// generic is folded into the kernel, which stores bf16 vectors to D; C is never touched (one k block), so
// the kernel gets a one-element stand-in for it (a C the function allocated would go).
// CHECK-LABEL: func.func @epilogue(
// CHECK:         %[[NOC:.*]] = memref.alloca() : memref<1x1xf32>
// CHECK:         call @__pbsdk_mm0(%{{.*}}, %{{.*}}, %[[NOC]], %{{.*}}, %{{.*}}) : (memref<40x70xbf16>, memref<70x50xbf16>, memref<1x1xf32>, memref<50xbf16>, memref<40x50xbf16>)
// CHECK-NOT:     linalg.generic
// CHECK-LABEL: func.func @__pbsdk_mm0_part(
// CHECK:         llvm.call_intrinsic "llvm.x86.avx512bf16.dpbf16ps.512"
// CHECK:         vector.maskedload %{{.*}} : memref<50xbf16>, vector<16xi1>, vector<16xbf16> into vector<16xbf16>
// CHECK:         arith.truncf %{{.*}} : vector<16xf32> to vector<16xbf16>
// CHECK:         vector.maskedstore %{{.*}} : memref<40x50xbf16>, vector<16xi1>, vector<16xbf16>
// NOUNIT-LABEL: func.func @epilogue(
// NOUNIT-NOT:     linalg.generic
// NOUNIT:         call @__pbsdk_mm0(
// NOUNIT-LABEL:  func.func @__pbsdk_mm0_part(
// NOUNIT:          vector.fma
// NOUNIT:          arith.truncf %{{.*}} : vector<16xf32> to vector<16xbf16>
// NOUNIT:          vector.maskedstore %{{.*}} : memref<40x50xbf16>, vector<16xi1>, vector<16xbf16>
func.func @epilogue(%a: memref<40x70xbf16>, %b: memref<70x50xbf16>, %c: memref<40x50xf32>,
                    %bias: memref<50xbf16>, %d: memref<40x50xbf16>) {
  %zero = arith.constant 0.0 : f32
  linalg.fill ins(%zero : f32) outs(%c : memref<40x50xf32>)
  linalg.matmul ins(%a, %b : memref<40x70xbf16>, memref<70x50xbf16>) outs(%c : memref<40x50xf32>)
  linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d1)>,
                                   affine_map<(d0, d1) -> (d0, d1)>],
                  iterator_types = ["parallel", "parallel"]}
      ins(%c, %bias : memref<40x50xf32>, memref<50xbf16>) outs(%d : memref<40x50xbf16>) {
  ^bb0(%in: f32, %bv: bf16, %out: bf16):
    %r = arith.truncf %in : f32 to bf16
    %x = arith.extf %r : bf16 to f32
    %y = arith.extf %bv : bf16 to f32
    %s = arith.addf %x, %y : f32
    %t = arith.truncf %s : f32 to bf16
    linalg.yield %t : bf16
  }
  return
}
