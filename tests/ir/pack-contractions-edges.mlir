// Pass pack-contractions on products whose last register tile row or column is short: that tile's k loop
// is its own copy with only the accumulators it stores (`tile_variants`), chosen by an scf.if on the
// tile's valid rows (columns), instead of a whole tile whose extra rows (vectors) are thrown away.
// RUN: %pbsdk opt %s --split-input-file --target cpu --spec intel/xeon-avx512 -p pack-contractions \
// RUN:   --options threads=1 | filecheck %s

// 31 rows in 8-row tiles: the last tile computes 7 rows (14 accumulators of 8 x 32).
// CHECK-LABEL: func.func @rows(
// CHECK-LABEL: func.func @__pbsdk_mm0_part(
// CHECK:         %[[FULL:.*]] = arith.cmpi eq, %{{.*}}, %c8 : index
// CHECK:         scf.if %[[FULL]] -> (vector<16xf32>, {{.*}}) {
// CHECK:           scf.for {{.*}} iter_args(%{{.*}}) -> (vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>) {
// CHECK-COUNT-16:    vector.fma
// CHECK:         } else {
// CHECK:           scf.for {{.*}} iter_args(%{{.*}}) -> (vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>) {
// CHECK-COUNT-14:    vector.fma
// CHECK-NOT:         vector.fma
// CHECK:             scf.yield
func.func @rows(%a: memref<31x64xf32>, %b: memref<64x59xf32>, %c: memref<31x59xf32>) {
  linalg.matmul ins(%a, %b : memref<31x64xf32>, memref<64x59xf32>) outs(%c : memref<31x59xf32>)
  return
}

// -----

// 267 columns in 32-column tiles: the last tile has 11 columns, one vector (10 accumulators of 10 x 2).
// CHECK-LABEL: func.func @cols(
// CHECK-LABEL: func.func @__pbsdk_mm0_part(
// CHECK:         %[[FULL:.*]] = arith.cmpi eq, %{{.*}}, %c32 : index
// CHECK:         scf.if %[[FULL]] -> (vector<16xf32>, {{.*}}) {
// CHECK-COUNT-20:    vector.fma
// CHECK:         } else {
// CHECK:           scf.for {{.*}} iter_args(%{{.*}}) -> (vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>) {
// CHECK-COUNT-10:    vector.fma
// CHECK-NOT:         vector.fma
// CHECK:             scf.yield
func.func @cols(%a: memref<10x64xf32>, %b: memref<64x267xf32>, %c: memref<10x267xf32>) {
  linalg.matmul ins(%a, %b : memref<10x64xf32>, memref<64x267xf32>) outs(%c : memref<10x267xf32>)
  return
}
