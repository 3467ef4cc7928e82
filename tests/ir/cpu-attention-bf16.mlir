// Stage attention (cpu) on a bf16 "lanes" descriptor whose plan names the host's bf16 unit (unit vdpbf16ps,
// pbsdk/core/plan/attention.py: pick_lanes_unit): Q is packed as pairs of d per query lane and Q·Kᵀ issues
// the unit through the target's unit_step hook (pbsdk/targets/cpu/hooks.py: the LLVM intrinsic), K's pair
// broadcast as a 32-bit word; the scores are scaled and the online softmax runs in f32. With p_dtype bf16, P
// is rounded to bf16 and interleaved as pairs of keys, V's key block is packed the same way, P·V issues the
// unit too and the output is rounded to bf16; with p_dtype f32 (an f32 result) P·V stays vector FMAs on V
// widened as it is read. On a spec without the unit (second RUN) both matmuls are vector FMAs on the widened
// operands.
// RUN: %pbsdk opt %s --split-input-file --target cpu --spec amd/zen4 -p attention | filecheck %s
// RUN: %pbsdk opt %s --split-input-file --target cpu --spec intel/xeon-avx512 -p attention | filecheck %s --check-prefix=NOUNIT

// CHECK-LABEL: func.func private @__pbsdk_attn0_part(
// CHECK-SAME:      memref<1x20x16xbf16>, %{{.*}}: memref<1x20x16xbf16>, %{{.*}}: memref<1x20x16xbf16>, %{{.*}}: memref<1x20x16xbf16>, %{{.*}}: index)
// Q pairs (16 x 32 queries bf16), scores and Ot (f32), P pairs and V pairs (bf16).
// CHECK-DAG:     memref.alloca() {alignment = 64 : i64} : memref<512xbf16>
// CHECK-DAG:     memref.alloca() {alignment = 64 : i64} : memref<640xf32>
// CHECK-DAG:     memref.alloca() {alignment = 64 : i64} : memref<640xbf16>
// CHECK-DAG:     memref.alloca() {alignment = 64 : i64} : memref<320xbf16>
// Q·Kᵀ: a reduction over pairs of d; K's pair broadcast, one unit step per query vector.
// CHECK:         scf.for {{.*}} iter_args(
// CHECK:           %[[QV:.*]] = vector.load %{{.*}} : memref<512xbf16>, vector<32xbf16>
// CHECK:           %[[PAIR:.*]] = vector.load %{{.*}} : memref<320xbf16>, vector<2xbf16>
// CHECK-NEXT:      %[[WORD:.*]] = vector.bitcast %[[PAIR]] : vector<2xbf16> to vector<1xi32>
// CHECK-NEXT:      %[[W:.*]] = vector.extract %[[WORD]][0] : i32 from vector<1xi32>
// CHECK-NEXT:      %[[B:.*]] = vector.broadcast %[[W]] : i32 to vector<16xi32>
// CHECK-NEXT:      %[[KB:.*]] = vector.bitcast %[[B]] : vector<16xi32> to vector<32xbf16>
// CHECK-NEXT:      llvm.call_intrinsic "llvm.x86.avx512bf16.dpbf16ps.512"(%{{.*}}, %[[KB]], %[[QV]]) : (vector<16xf32>, vector<32xbf16>, vector<32xbf16>) -> vector<16xf32>
// P rounded to bf16, keys 2h and 2h + 1 side by side per query lane.
// CHECK:         arith.truncf %{{.*}} : vector<16xf32> to vector<16xbf16>
// CHECK:         vector.interleave %{{.*}}, %{{.*}} : vector<16xbf16> -> vector<32xbf16>
// V's key block as pairs of keys per column.
// CHECK:         vector.load %{{.*}} : memref<320xbf16>, vector<16xbf16>
// CHECK:         vector.interleave %{{.*}}, %{{.*}} : vector<16xbf16> -> vector<32xbf16>
// P·V on the unit over pairs of keys.
// CHECK:         scf.for {{.*}} iter_args(
// CHECK:           vector.load %{{.*}} : memref<640xbf16>, vector<32xbf16>
// CHECK:           llvm.call_intrinsic "llvm.x86.avx512bf16.dpbf16ps.512"
// The output: Ot's blocks transposed in registers, rounded to bf16, a query row per store (masked past the
// sequence and Dv; here every row's mask folds to all lanes).
// CHECK:         %[[ROW:.*]] = arith.truncf %{{.*}} : vector<16xf32> to vector<16xbf16>
// CHECK-NEXT:    vector.store %[[ROW]], %{{.*}} : memref<320xbf16>, vector<16xbf16>
// CHECK-LABEL: func.func private @__pbsdk_attn0(
// CHECK-NOT:     pbsdk.attention
// CHECK:         call @__pbsdk_attn0_part(

// Without the unit in the spec: vector FMAs on the operands widened as they are read, the output rounded.
// NOUNIT-LABEL: func.func private @__pbsdk_attn0_part(
// NOUNIT-NOT:     llvm.call_intrinsic
// NOUNIT:         arith.extf %{{.*}} : bf16 to f32
// NOUNIT:         vector.fma
// NOUNIT:         arith.truncf %{{.*}} : vector<16xf32> to vector<16xbf16>
// NOUNIT-LABEL: func.func private @__pbsdk_attn0(
func.func private @__pbsdk_attn0(memref<1x20x16xbf16>, memref<1x20x16xbf16>, memref<1x20x16xbf16>, memref<1x20x16xbf16>) attributes {pbsdk.attention = {batch = 1 : i64, block_k = 20 : i64, block_q = 32 : i64, causal_offset = 0 : i64, d = 16 : i64, dtype = "bf16", dv = 16 : i64, form = "lanes", kv_groups = 1 : i64, lanes = 16 : i64, level = "l1d", mask = false, mask_scale = 1.000000e+00 : f64, operands = {k = {batch = [], col_stride = 1 : i64, row_stride = 16 : i64, shape = [1, 20, 16]}, mask, o = {shape = [1, 20, 16]}, q = {batch = [], col_stride = 1 : i64, row_stride = 16 : i64, shape = [1, 20, 16]}, v = {batch = [], col_stride = 1 : i64, row_stride = 16 : i64, shape = [1, 20, 16]}}, p_dtype = "bf16", pv_cols = 8 : i64, q_vectors = 2 : i64, qk_keys = 14 : i64, safe_softmax = false, scale = 2.500000e-01 : f64, sk = 20 : i64, sq = 20 : i64, threads = 1 : i64, unit = {accumulator_dtype = "f32", k = 2 : i64, m = 1 : i64, n = 16 : i64, name = "vdpbf16ps", operand_dtype = "bf16"}, version = 1 : i64, widened = true}}
func.func @main(%q: memref<1x20x16xbf16>, %k: memref<1x20x16xbf16>, %v: memref<1x20x16xbf16>, %o: memref<1x20x16xbf16>) {
  call @__pbsdk_attn0(%q, %k, %v, %o) : (memref<1x20x16xbf16>, memref<1x20x16xbf16>, memref<1x20x16xbf16>, memref<1x20x16xbf16>) -> ()
  return
}

// -----

// p_dtype f32 (the graph keeps an f32 result): Q·Kᵀ on the unit, P in f32 in place of the scores, P·V as
// vector FMAs on V's values widened and broadcast, the output stored in f32 (no rounding, no P pairs).
// CHECK-LABEL: func.func private @__pbsdk_attn0_part(
// CHECK-SAME:      %{{.*}}: memref<1x20x16xf32>, %{{.*}}: index)
// CHECK-NOT:     memref<640xbf16>
// CHECK:         llvm.call_intrinsic "llvm.x86.avx512bf16.dpbf16ps.512"
// CHECK-NOT:     arith.truncf
// CHECK:         %[[VS:.*]] = memref.load %{{.*}} : memref<320xbf16>
// CHECK-NEXT:    %[[VW:.*]] = arith.extf %[[VS]] : bf16 to f32
// CHECK-NEXT:    %[[VB:.*]] = vector.broadcast %[[VW]] : f32 to vector<16xf32>
// CHECK-NEXT:    vector.fma %[[VB]], %{{.*}}, %{{.*}} : vector<16xf32>
// CHECK-NOT:     arith.truncf
// CHECK-LABEL: func.func private @__pbsdk_attn0(
// NOUNIT-LABEL: func.func private @__pbsdk_attn0_part(
// NOUNIT-NOT:     llvm.call_intrinsic
// NOUNIT-LABEL: func.func private @__pbsdk_attn0(
func.func private @__pbsdk_attn0(memref<1x20x16xbf16>, memref<1x20x16xbf16>, memref<1x20x16xbf16>, memref<1x20x16xf32>) attributes {pbsdk.attention = {batch = 1 : i64, block_k = 20 : i64, block_q = 16 : i64, causal_offset = 0 : i64, d = 16 : i64, dtype = "bf16", dv = 16 : i64, form = "lanes", kv_groups = 1 : i64, lanes = 16 : i64, level = "l1d", mask = false, mask_scale = 1.000000e+00 : f64, operands = {k = {batch = [], col_stride = 1 : i64, row_stride = 16 : i64, shape = [1, 20, 16]}, mask, o = {shape = [1, 20, 16]}, q = {batch = [], col_stride = 1 : i64, row_stride = 16 : i64, shape = [1, 20, 16]}, v = {batch = [], col_stride = 1 : i64, row_stride = 16 : i64, shape = [1, 20, 16]}}, out_dtype = "f32", p_dtype = "f32", pv_cols = 16 : i64, q_vectors = 1 : i64, qk_keys = 29 : i64, safe_softmax = false, scale = 2.500000e-01 : f64, sk = 20 : i64, sq = 20 : i64, threads = 1 : i64, unit = {accumulator_dtype = "f32", k = 2 : i64, m = 1 : i64, n = 16 : i64, name = "vdpbf16ps", operand_dtype = "bf16"}, version = 1 : i64, widened = true}}
func.func @main(%q: memref<1x20x16xbf16>, %k: memref<1x20x16xbf16>, %v: memref<1x20x16xbf16>, %o: memref<1x20x16xf32>) {
  call @__pbsdk_attn0(%q, %k, %v, %o) : (memref<1x20x16xbf16>, memref<1x20x16xbf16>, memref<1x20x16xbf16>, memref<1x20x16xf32>) -> ()
  return
}
