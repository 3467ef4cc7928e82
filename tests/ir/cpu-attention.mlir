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
func.func private @__pbsdk_attn0(memref<1x20x16xf32>, memref<1x20x16xf32>, memref<1x20x16xf32>, memref<1x20x16xf32>) attributes {pbsdk.attention = "{\22batch\22: 1, \22block_k\22: 28, \22block_q\22: 32, \22causal_offset\22: 0, \22d\22: 16, \22dtype\22: \22f32\22, \22dv\22: 16, \22form\22: \22lanes\22, \22kv_groups\22: 1, \22lanes\22: 16, \22level\22: \22l1d\22, \22mask\22: false, \22mask_scale\22: 1.0, \22operands\22: {\22k\22: {\22batch\22: [], \22col_stride\22: 1, \22row_stride\22: 16, \22shape\22: [1, 20, 16]}, \22mask\22: null, \22o\22: {\22shape\22: [1, 20, 16]}, \22q\22: {\22batch\22: [], \22col_stride\22: 1, \22row_stride\22: 16, \22shape\22: [1, 20, 16]}, \22v\22: {\22batch\22: [], \22col_stride\22: 1, \22row_stride\22: 16, \22shape\22: [1, 20, 16]}}, \22pv_cols\22: 8, \22q_vectors\22: 2, \22qk_keys\22: 14, \22scale\22: 0.25, \22sk\22: 20, \22sq\22: 20, \22threads\22: 1, \22version\22: 1}"}
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
func.func private @__pbsdk_attn0(memref<1x20x16xf32>, memref<1x20x16xf32>, memref<1x20x16xf32>, memref<1x20x16xf32>) attributes {pbsdk.attention = "{\22batch\22: 1, \22block_k\22: 28, \22block_q\22: 32, \22causal_offset\22: 0, \22d\22: 16, \22dtype\22: \22f32\22, \22dv\22: 16, \22form\22: \22lanes\22, \22kv_groups\22: 1, \22lanes\22: 16, \22level\22: \22l1d\22, \22mask\22: false, \22mask_scale\22: 1.0, \22operands\22: {\22k\22: {\22batch\22: [], \22col_stride\22: 1, \22row_stride\22: 16, \22shape\22: [1, 20, 16]}, \22mask\22: null, \22o\22: {\22shape\22: [1, 20, 16]}, \22q\22: {\22batch\22: [], \22col_stride\22: 1, \22row_stride\22: 16, \22shape\22: [1, 20, 16]}, \22v\22: {\22batch\22: [], \22col_stride\22: 1, \22row_stride\22: 16, \22shape\22: [1, 20, 16]}}, \22pv_cols\22: 8, \22q_vectors\22: 2, \22qk_keys\22: 14, \22scale\22: 0.25, \22sk\22: 20, \22sq\22: 20, \22threads\22: 2, \22version\22: 1}"}
func.func @main(%q: memref<1x20x16xf32>, %k: memref<1x20x16xf32>, %v: memref<1x20x16xf32>, %o: memref<1x20x16xf32>) {
  call @__pbsdk_attn0(%q, %k, %v, %o) : (memref<1x20x16xf32>, memref<1x20x16xf32>, memref<1x20x16xf32>, memref<1x20x16xf32>) -> ()
  return
}
