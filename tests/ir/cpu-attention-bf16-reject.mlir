// Stage attention (cpu) refuses a bf16 "lanes" descriptor it cannot build, naming the stage, the function and
// what is wrong: a unit that is not one of pairs of bf16 into one f32 vector (the kernel broadcasts K's and
// V's pairs as 32-bit words), and a P dtype that is neither f32 nor the unit's operand dtype.
// RUN: not %pbsdk opt %s --split-input-file --target cpu --spec amd/zen4 -p attention 2>&1 | filecheck %s

// CHECK: pbsdk: error: in stage 'attention', op 'func.func': @__pbsdk_attn0: pbsdk.attention descriptor: unit vpdpbusd (1x16x4 i8->i32) is not one of pairs of bf16 into 16 f32 lanes (the cpu kernel's)
func.func private @__pbsdk_attn0(memref<1x20x16xbf16>, memref<1x20x16xbf16>, memref<1x20x16xbf16>, memref<1x20x16xbf16>) attributes {pbsdk.attention = {batch = 1 : i64, block_k = 20 : i64, block_q = 32 : i64, causal_offset = 0 : i64, d = 16 : i64, dtype = "bf16", dv = 16 : i64, form = "lanes", kv_groups = 1 : i64, lanes = 16 : i64, level = "l1d", mask = false, mask_scale = 1.000000e+00 : f64, operands = {k = {batch = [], col_stride = 1 : i64, row_stride = 16 : i64, shape = [1, 20, 16]}, mask, o = {shape = [1, 20, 16]}, q = {batch = [], col_stride = 1 : i64, row_stride = 16 : i64, shape = [1, 20, 16]}, v = {batch = [], col_stride = 1 : i64, row_stride = 16 : i64, shape = [1, 20, 16]}}, p_dtype = "bf16", pv_cols = 8 : i64, q_vectors = 2 : i64, qk_keys = 14 : i64, safe_softmax = false, scale = 2.500000e-01 : f64, sk = 20 : i64, sq = 20 : i64, threads = 1 : i64, unit = {accumulator_dtype = "i32", k = 4 : i64, m = 1 : i64, n = 16 : i64, name = "vpdpbusd", operand_dtype = "i8"}, version = 1 : i64, widened = true}}
func.func @main(%q: memref<1x20x16xbf16>, %k: memref<1x20x16xbf16>, %v: memref<1x20x16xbf16>, %o: memref<1x20x16xbf16>) {
  call @__pbsdk_attn0(%q, %k, %v, %o) : (memref<1x20x16xbf16>, memref<1x20x16xbf16>, memref<1x20x16xbf16>, memref<1x20x16xbf16>) -> ()
  return
}

// -----

// CHECK: pbsdk: error: in stage 'attention', op 'func.func': @__pbsdk_attn0: pbsdk.attention descriptor: p_dtype f16 (f32, or the unit's bf16)
func.func private @__pbsdk_attn0(memref<1x20x16xbf16>, memref<1x20x16xbf16>, memref<1x20x16xbf16>, memref<1x20x16xbf16>) attributes {pbsdk.attention = {batch = 1 : i64, block_k = 20 : i64, block_q = 32 : i64, causal_offset = 0 : i64, d = 16 : i64, dtype = "bf16", dv = 16 : i64, form = "lanes", kv_groups = 1 : i64, lanes = 16 : i64, level = "l1d", mask = false, mask_scale = 1.000000e+00 : f64, operands = {k = {batch = [], col_stride = 1 : i64, row_stride = 16 : i64, shape = [1, 20, 16]}, mask, o = {shape = [1, 20, 16]}, q = {batch = [], col_stride = 1 : i64, row_stride = 16 : i64, shape = [1, 20, 16]}, v = {batch = [], col_stride = 1 : i64, row_stride = 16 : i64, shape = [1, 20, 16]}}, p_dtype = "f16", pv_cols = 8 : i64, q_vectors = 2 : i64, qk_keys = 14 : i64, safe_softmax = false, scale = 2.500000e-01 : f64, sk = 20 : i64, sq = 20 : i64, threads = 1 : i64, unit = {accumulator_dtype = "f32", k = 2 : i64, m = 1 : i64, n = 16 : i64, name = "vdpbf16ps", operand_dtype = "bf16"}, version = 1 : i64, widened = true}}
func.func @main(%q: memref<1x20x16xbf16>, %k: memref<1x20x16xbf16>, %v: memref<1x20x16xbf16>, %o: memref<1x20x16xbf16>) {
  call @__pbsdk_attn0(%q, %k, %v, %o) : (memref<1x20x16xbf16>, memref<1x20x16xbf16>, memref<1x20x16xbf16>, memref<1x20x16xbf16>) -> ()
  return
}
