// Stage attention (the cpu target's first scheduling stage, found through --target cpu): the core emits a
// fused "lanes" attention as a call of a private declaration marked with the plan's pbsdk.attention
// descriptor (pbsdk.core.ir.attention_tiles.descriptor); the stage builds its body from the descriptor
// (pbsdk/targets/cpu/attention_kernel.py): @NAME_part, the work items of one thread (Q·Kᵀ and P·V as
// vector.fma register tiles over 16-lane query vectors, the online softmax in base 2), and @NAME, which
// calls it once (threads 1) or from an scf.forall over the threads. The mark is dropped once built.
// RUN: %pbsdk opt %s --split-input-file --target cpu --spec intel/xeon-avx512 -p attention | filecheck %s

// CHECK-LABEL: func.func private @__pbsdk_attn0_part(
// CHECK-SAME:      %{{.*}}: memref<1x20x16xf32>, %{{.*}}: memref<1x20x16xf32>, %{{.*}}: memref<1x20x16xf32>, %{{.*}}: memref<1x20x16xf32>, %[[T:.*]]: index)
// Qt, St and Ot: d x block_q, block_k x block_q, dv x block_q (block_q = 2 vectors of 16 lanes).
// CHECK-DAG:     memref.alloca() {alignment = 64 : i64} : memref<512xf32>
// CHECK-DAG:     memref.alloca() {alignment = 64 : i64} : memref<896xf32>
// CHECK:         scf.for %{{.*}} = %[[T]] to %{{.*}} step %{{.*}} {
// Q·Kᵀ: a reduction over d carrying 14 keys x 2 query vectors of accumulators.
// CHECK:           scf.for {{.*}} iter_args(
// CHECK:             vector.broadcast {{.*}} : f32 to vector<16xf32>
// CHECK:             vector.fma {{.*}} : vector<16xf32>
// CHECK:           arith.cmpi sgt, {{.*}} : vector<16xi32>
// P·V: value columns in registers across the key block.
// CHECK:           vector.fma {{.*}} : vector<16xf32>
// CHECK:         return
// CHECK-LABEL: func.func private @__pbsdk_attn0(
// CHECK-NOT:     pbsdk.attention
// CHECK-NOT:     scf.forall
// CHECK:         call @__pbsdk_attn0_part(%{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}) :
// CHECK:         return
// CHECK-LABEL: func.func @main(
// CHECK:         call @__pbsdk_attn0(
func.func private @__pbsdk_attn0(memref<1x20x16xf32>, memref<1x20x16xf32>, memref<1x20x16xf32>, memref<1x20x16xf32>) attributes {pbsdk.attention = {batch = 1 : i64, block_k = 28 : i64, block_q = 32 : i64, causal_offset = 0 : i64, d = 16 : i64, dtype = "f32", dv = 16 : i64, form = "lanes", kv_groups = 1 : i64, lanes = 16 : i64, level = "l1d", mask = false, mask_scale = 1.000000e+00 : f64, operands = {k = {batch = [], col_stride = 1 : i64, row_stride = 16 : i64, shape = [1, 20, 16]}, mask, o = {shape = [1, 20, 16]}, q = {batch = [], col_stride = 1 : i64, row_stride = 16 : i64, shape = [1, 20, 16]}, v = {batch = [], col_stride = 1 : i64, row_stride = 16 : i64, shape = [1, 20, 16]}}, pv_cols = 8 : i64, q_vectors = 2 : i64, qk_keys = 14 : i64, scale = 2.500000e-01 : f64, sk = 20 : i64, sq = 20 : i64, threads = 1 : i64, version = 1 : i64}}
func.func @main(%q: memref<1x20x16xf32>, %k: memref<1x20x16xf32>, %v: memref<1x20x16xf32>, %o: memref<1x20x16xf32>) {
  call @__pbsdk_attn0(%q, %k, %v, %o) : (memref<1x20x16xf32>, memref<1x20x16xf32>, memref<1x20x16xf32>, memref<1x20x16xf32>) -> ()
  return
}

// -----

// Two threads: @NAME forks the parts over an scf.forall (lower-parallel turns it into the fork).
// CHECK-LABEL: func.func private @__pbsdk_attn0_part(
// CHECK:         vector.fma
// CHECK-LABEL: func.func private @__pbsdk_attn0(
// CHECK:         scf.forall (%[[I:.*]]) in (2) {
// CHECK:           func.call @__pbsdk_attn0_part(%{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %[[I]]) :
func.func private @__pbsdk_attn0(memref<1x20x16xf32>, memref<1x20x16xf32>, memref<1x20x16xf32>, memref<1x20x16xf32>) attributes {pbsdk.attention = {batch = 1 : i64, block_k = 28 : i64, block_q = 32 : i64, causal_offset = 0 : i64, d = 16 : i64, dtype = "f32", dv = 16 : i64, form = "lanes", kv_groups = 1 : i64, lanes = 16 : i64, level = "l1d", mask = false, mask_scale = 1.000000e+00 : f64, operands = {k = {batch = [], col_stride = 1 : i64, row_stride = 16 : i64, shape = [1, 20, 16]}, mask, o = {shape = [1, 20, 16]}, q = {batch = [], col_stride = 1 : i64, row_stride = 16 : i64, shape = [1, 20, 16]}, v = {batch = [], col_stride = 1 : i64, row_stride = 16 : i64, shape = [1, 20, 16]}}, pv_cols = 8 : i64, q_vectors = 2 : i64, qk_keys = 14 : i64, scale = 2.500000e-01 : f64, sk = 20 : i64, sq = 20 : i64, threads = 2 : i64, version = 1 : i64}}
func.func @main(%q: memref<1x20x16xf32>, %k: memref<1x20x16xf32>, %v: memref<1x20x16xf32>, %o: memref<1x20x16xf32>) {
  call @__pbsdk_attn0(%q, %k, %v, %o) : (memref<1x20x16xf32>, memref<1x20x16xf32>, memref<1x20x16xf32>, memref<1x20x16xf32>) -> ()
  return
}

// -----

// A key-padding mask (row stride 0: one scalar per key, broadcast) under a safe softmax. The mask's
// scaled score is floored at -FLT_MAX unless the mask is -inf (a finite finfo.min mask must not overflow
// to -inf), and a row whose sum l is 0 (every key -inf) gets 0 instead of 0 · (1 / 0).
// CHECK-LABEL: func.func private @__pbsdk_attn0_part(
// CHECK-DAG:     %[[LOWEST:.*]] = arith.constant dense<-3.40282347E+38> : vector<16xf32>
// CHECK-DAG:     %[[NINF:.*]] = arith.constant dense<0xFF800000> : vector<16xf32>
// CHECK-DAG:     %[[ZERO:.*]] = arith.constant dense<0.000000e+00> : vector<16xf32>
// CHECK:         %[[M:.*]] = memref.load %{{.*}} : memref<20xf32>
// CHECK-NEXT:    %[[MV:.*]] = vector.broadcast %[[M]] : f32 to vector<16xf32>
// CHECK-NEXT:    %[[S:.*]] = vector.fma %[[MV]], %{{.*}}, %{{.*}} : vector<16xf32>
// CHECK-NEXT:    %[[LOW:.*]] = arith.cmpf ogt, %[[LOWEST]], %[[S]] : vector<16xf32>
// CHECK-NEXT:    %[[FLOORED:.*]] = arith.select %[[LOW]], %[[LOWEST]], %[[S]]
// CHECK-NEXT:    %[[ISNINF:.*]] = arith.cmpf oeq, %[[MV]], %[[NINF]] : vector<16xf32>
// CHECK-NEXT:    arith.select %[[ISNINF]], %[[NINF]], %[[FLOORED]]
// CHECK:         %[[INV:.*]] = arith.divf %{{.*}}, %[[L:.*]] : vector<16xf32>
// CHECK:         %[[EMPTY:.*]] = arith.cmpf oeq, %[[L]], %[[ZERO]] : vector<16xf32>
// CHECK-NEXT:    arith.select %[[EMPTY]], %[[ZERO]], %[[INV]]
func.func private @__pbsdk_attn0(memref<1x20x16xf32>, memref<1x20x16xf32>, memref<1x20x16xf32>, memref<1x1x20xf32>, memref<1x20x16xf32>) attributes {pbsdk.attention = {batch = 1 : i64, block_k = 28 : i64, block_q = 32 : i64, causal_offset, d = 16 : i64, dtype = "f32", dv = 16 : i64, form = "lanes", kv_groups = 1 : i64, lanes = 16 : i64, level = "l1d", mask = true, mask_scale = 1.000000e+00 : f64, operands = {k = {batch = [], col_stride = 1 : i64, row_stride = 16 : i64, shape = [1, 20, 16]}, mask = {batch = [], col_stride = 1 : i64, row_stride = 0 : i64, shape = [1, 1, 20]}, o = {shape = [1, 20, 16]}, q = {batch = [], col_stride = 1 : i64, row_stride = 16 : i64, shape = [1, 20, 16]}, v = {batch = [], col_stride = 1 : i64, row_stride = 16 : i64, shape = [1, 20, 16]}}, pv_cols = 8 : i64, q_vectors = 2 : i64, qk_keys = 14 : i64, safe_softmax = true, scale = 2.500000e-01 : f64, sk = 20 : i64, sq = 20 : i64, threads = 1 : i64, version = 1 : i64}}
func.func @main(%q: memref<1x20x16xf32>, %k: memref<1x20x16xf32>, %v: memref<1x20x16xf32>, %m: memref<1x1x20xf32>, %o: memref<1x20x16xf32>) {
  call @__pbsdk_attn0(%q, %k, %v, %m, %o) : (memref<1x20x16xf32>, memref<1x20x16xf32>, memref<1x20x16xf32>, memref<1x1x20xf32>, memref<1x20x16xf32>) -> ()
  return
}

// -----

// along = "keys" (a decode step: one query per head): a work item is one query; no scratch buffer. Per vector of
// 16 keys, one dot product per key over d (Q's row and the key's as 16-lane vectors), folded into one vector of
// scores by shuffles, a horizontal max and sum for the online softmax, and O (dv along the lanes) accumulated
// from V's rows with each probability broadcast.
// CHECK-LABEL: func.func private @__pbsdk_attn0_part(
// CHECK-SAME:      %{{.*}}: memref<2x1x32xf32>, %{{.*}}: memref<2x40x32xf32>, %{{.*}}: memref<2x40x32xf32>, %{{.*}}: memref<2x1x32xf32>, %{{.*}}: index)
// CHECK-NOT:     memref.alloca
// CHECK:         scf.for
// CHECK:           scf.for {{.*}} iter_args({{.*}}) -> (vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>)
// CHECK:             vector.fma {{.*}} : vector<16xf32>
// CHECK:             vector.shuffle {{.*}} [0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23] : vector<16xf32>, vector<16xf32>
// CHECK:             vector.reduction <maxnumf>
// CHECK:             vector.reduction <add>
// CHECK:             vector.extract {{.*}}[15] : f32 from vector<16xf32>
// CHECK:             scf.yield
// CHECK:           vector.store {{.*}} : memref<{{.*}}>, vector<16xf32>
// CHECK-LABEL: func.func private @__pbsdk_attn0(
// CHECK-NOT:     pbsdk.attention
func.func private @__pbsdk_attn0(memref<2x1x32xf32>, memref<2x40x32xf32>, memref<2x40x32xf32>, memref<2x1x32xf32>) attributes {pbsdk.attention = {along = "keys", batch = 2 : i64, block_k = 16 : i64, block_q = 16 : i64, causal_offset, d = 32 : i64, dtype = "f32", dv = 32 : i64, form = "lanes", kv_groups = 1 : i64, lanes = 16 : i64, level = "l1d", mask = false, mask_scale = 1.000000e+00 : f64, operands = {k = {batch = [[2, 1280, 1]], col_stride = 1 : i64, row_stride = 32 : i64, shape = [2, 40, 32]}, mask, o = {shape = [2, 1, 32]}, q = {batch = [[2, 32, 1]], col_stride = 1 : i64, row_stride = 0 : i64, shape = [2, 1, 32]}, v = {batch = [[2, 1280, 1]], col_stride = 1 : i64, row_stride = 32 : i64, shape = [2, 40, 32]}}, pv_cols = 2 : i64, q_vectors = 1 : i64, qk_keys = 16 : i64, scale = 0.17677669529663687 : f64, sk = 40 : i64, sq = 1 : i64, threads = 1 : i64, version = 1 : i64}}
func.func @main(%q: memref<2x1x32xf32>, %k: memref<2x40x32xf32>, %v: memref<2x40x32xf32>, %o: memref<2x1x32xf32>) {
  call @__pbsdk_attn0(%q, %k, %v, %o) : (memref<2x1x32xf32>, memref<2x40x32xf32>, memref<2x40x32xf32>, memref<2x1x32xf32>) -> ()
  return
}
