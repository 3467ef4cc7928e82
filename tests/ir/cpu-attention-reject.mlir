// Stage attention (cpu) refuses a "lanes" pbsdk.attention function it cannot build, naming the stage, the
// function and what is wrong: a descriptor missing a field (here "lanes", misspelt), one that is not a dictionary,
// one of another version, a declaration whose arguments are not the descriptor's buffers, and a key length known at
// run time that the kernel cannot take (a causal pattern over it, or no buffer dimension giving its symbol).
// RUN: not %pbsdk opt %s --split-input-file --target cpu --spec intel/xeon-avx512 -p attention 2>&1 | filecheck %s

// CHECK: pbsdk: error: in stage 'attention', op 'func.func': @__pbsdk_attn0: malformed pbsdk.attention descriptor: KeyError('lanes')
func.func private @__pbsdk_attn0(memref<1x20x16xf32>, memref<1x20x16xf32>, memref<1x20x16xf32>, memref<1x20x16xf32>) attributes {pbsdk.attention = {LANES = 16 : i64, batch = 1 : i64, block_k = 28 : i64, block_q = 32 : i64, causal_offset = 0 : i64, d = 16 : i64, dtype = "f32", dv = 16 : i64, form = "lanes", kv_groups = 1 : i64, level = "l1d", mask = false, mask_scale = 1.000000e+00 : f64, operands = {k = {batch = [], col_stride = 1 : i64, row_stride = 16 : i64, shape = [1, 20, 16]}, mask, o = {shape = [1, 20, 16]}, q = {batch = [], col_stride = 1 : i64, row_stride = 16 : i64, shape = [1, 20, 16]}, v = {batch = [], col_stride = 1 : i64, row_stride = 16 : i64, shape = [1, 20, 16]}}, pv_cols = 8 : i64, q_vectors = 2 : i64, qk_keys = 14 : i64, scale = 2.500000e-01 : f64, sk = 20 : i64, sq = 20 : i64, threads = 1 : i64, version = 1 : i64}}
func.func @main(%q: memref<1x20x16xf32>, %k: memref<1x20x16xf32>, %v: memref<1x20x16xf32>, %o: memref<1x20x16xf32>) {
  call @__pbsdk_attn0(%q, %k, %v, %o) : (memref<1x20x16xf32>, memref<1x20x16xf32>, memref<1x20x16xf32>, memref<1x20x16xf32>) -> ()
  return
}

// -----

// CHECK: pbsdk: error: in stage 'attention', op 'func.func': @__pbsdk_attn0: malformed pbsdk.attention descriptor: pbsdk.attention must be a dictionary, got "lanes, please"
func.func private @__pbsdk_attn0(memref<1x20x16xf32>, memref<1x20x16xf32>, memref<1x20x16xf32>, memref<1x20x16xf32>) attributes {pbsdk.attention = "lanes, please"}
func.func @main(%q: memref<1x20x16xf32>, %k: memref<1x20x16xf32>, %v: memref<1x20x16xf32>, %o: memref<1x20x16xf32>) {
  call @__pbsdk_attn0(%q, %k, %v, %o) : (memref<1x20x16xf32>, memref<1x20x16xf32>, memref<1x20x16xf32>, memref<1x20x16xf32>) -> ()
  return
}

// -----

// CHECK: pbsdk: error: in stage 'attention', op 'func.func': @__pbsdk_attn0: pbsdk.attention descriptor version 3 (the cpu target reads 1, 2)
func.func private @__pbsdk_attn0(memref<1x20x16xf32>, memref<1x20x16xf32>, memref<1x20x16xf32>, memref<1x20x16xf32>) attributes {pbsdk.attention = {batch = 1 : i64, block_k = 28 : i64, block_q = 32 : i64, causal_offset = 0 : i64, d = 16 : i64, dtype = "f32", dv = 16 : i64, form = "lanes", kv_groups = 1 : i64, lanes = 16 : i64, level = "l1d", mask = false, mask_scale = 1.000000e+00 : f64, operands = {k = {batch = [], col_stride = 1 : i64, row_stride = 16 : i64, shape = [1, 20, 16]}, mask, o = {shape = [1, 20, 16]}, q = {batch = [], col_stride = 1 : i64, row_stride = 16 : i64, shape = [1, 20, 16]}, v = {batch = [], col_stride = 1 : i64, row_stride = 16 : i64, shape = [1, 20, 16]}}, pv_cols = 8 : i64, q_vectors = 2 : i64, qk_keys = 14 : i64, scale = 2.500000e-01 : f64, sk = 20 : i64, sq = 20 : i64, threads = 1 : i64, version = 3 : i64}}
func.func @main(%q: memref<1x20x16xf32>, %k: memref<1x20x16xf32>, %v: memref<1x20x16xf32>, %o: memref<1x20x16xf32>) {
  call @__pbsdk_attn0(%q, %k, %v, %o) : (memref<1x20x16xf32>, memref<1x20x16xf32>, memref<1x20x16xf32>, memref<1x20x16xf32>) -> ()
  return
}

// -----

// CHECK: pbsdk: error: in stage 'attention', op 'func.func': @__pbsdk_attn0 takes (memref<1x20x16xf32>, memref<1x20x16xf32>, memref<1x20x16xf32>, memref<1x20x16xf16>); its pbsdk.attention descriptor needs (memref<1x20x16xf32>, memref<1x20x16xf32>, memref<1x20x16xf32>, memref<1x20x16xf32>)
func.func private @__pbsdk_attn0(memref<1x20x16xf32>, memref<1x20x16xf32>, memref<1x20x16xf32>, memref<1x20x16xf16>) attributes {pbsdk.attention = {batch = 1 : i64, block_k = 28 : i64, block_q = 32 : i64, causal_offset = 0 : i64, d = 16 : i64, dtype = "f32", dv = 16 : i64, form = "lanes", kv_groups = 1 : i64, lanes = 16 : i64, level = "l1d", mask = false, mask_scale = 1.000000e+00 : f64, operands = {k = {batch = [], col_stride = 1 : i64, row_stride = 16 : i64, shape = [1, 20, 16]}, mask, o = {shape = [1, 20, 16]}, q = {batch = [], col_stride = 1 : i64, row_stride = 16 : i64, shape = [1, 20, 16]}, v = {batch = [], col_stride = 1 : i64, row_stride = 16 : i64, shape = [1, 20, 16]}}, pv_cols = 8 : i64, q_vectors = 2 : i64, qk_keys = 14 : i64, scale = 2.500000e-01 : f64, sk = 20 : i64, sq = 20 : i64, threads = 1 : i64, version = 1 : i64}}
func.func @main(%q: memref<1x20x16xf32>, %k: memref<1x20x16xf32>, %v: memref<1x20x16xf32>, %o: memref<1x20x16xf16>) {
  call @__pbsdk_attn0(%q, %k, %v, %o) : (memref<1x20x16xf32>, memref<1x20x16xf32>, memref<1x20x16xf32>, memref<1x20x16xf16>) -> ()
  return
}

// -----

// A key length known at run time (version 2) with a causal pattern: its diagonal is planned from static sizes.
// CHECK: pbsdk: error: in stage 'attention', op 'func.func': @__pbsdk_attn0: pbsdk.attention descriptor: a causal pattern over a key length known at run time
func.func private @__pbsdk_attn0(memref<1x1x16xf32>, memref<1x?x16xf32>, memref<1x?x16xf32>, memref<1x1x16xf32>) attributes {pbsdk.attention = {batch = 1 : i64, block_k = 28 : i64, block_q = 16 : i64, causal_offset = 0 : i64, d = 16 : i64, dtype = "f32", dv = 16 : i64, form = "lanes", kv_groups = 1 : i64, lanes = 16 : i64, level = "l1d", mask = false, mask_scale = 1.000000e+00 : f64, operands = {k = {batch = [], col_stride = 1 : i64, row_stride = 16 : i64, shape = [1, "s0", 16]}, mask, o = {shape = [1, 1, 16]}, q = {batch = [], col_stride = 1 : i64, row_stride = 16 : i64, shape = [1, 1, 16]}, v = {batch = [], col_stride = 1 : i64, row_stride = 16 : i64, shape = [1, "s0", 16]}}, pv_cols = 8 : i64, q_vectors = 1 : i64, qk_keys = 14 : i64, scale = 2.500000e-01 : f64, sk = "s0", sq = 1 : i64, symbols = ["s0"], threads = 1 : i64, version = 2 : i64}}
func.func @main(%q: memref<1x1x16xf32>, %k: memref<1x?x16xf32>, %v: memref<1x?x16xf32>, %o: memref<1x1x16xf32>) {
  call @__pbsdk_attn0(%q, %k, %v, %o) : (memref<1x1x16xf32>, memref<1x?x16xf32>, memref<1x?x16xf32>, memref<1x1x16xf32>) -> ()
  return
}

// -----

// A key length no buffer dimension gives (each is twice it): the kernel could not read it.
// CHECK: pbsdk: error: in stage 'attention', op 'func.func': @__pbsdk_attn0: pbsdk.attention descriptor: no buffer dimension gives s0
func.func private @__pbsdk_attn0(memref<1x1x16xf32>, memref<1x?x16xf32>, memref<1x?x16xf32>, memref<1x1x16xf32>) attributes {pbsdk.attention = {batch = 1 : i64, block_k = 28 : i64, block_q = 16 : i64, causal_offset, d = 16 : i64, dtype = "f32", dv = 16 : i64, form = "lanes", kv_groups = 1 : i64, lanes = 16 : i64, level = "l1d", mask = false, mask_scale = 1.000000e+00 : f64, operands = {k = {batch = [], col_stride = 1 : i64, row_stride = 16 : i64, shape = [1, "2*s0", 16]}, mask, o = {shape = [1, 1, 16]}, q = {batch = [], col_stride = 1 : i64, row_stride = 16 : i64, shape = [1, 1, 16]}, v = {batch = [], col_stride = 1 : i64, row_stride = 16 : i64, shape = [1, "2*s0", 16]}}, pv_cols = 8 : i64, q_vectors = 1 : i64, qk_keys = 14 : i64, scale = 2.500000e-01 : f64, sk = "s0", sq = 1 : i64, symbols = ["s0"], threads = 1 : i64, version = 2 : i64}}
func.func @main(%q: memref<1x1x16xf32>, %k: memref<1x?x16xf32>, %v: memref<1x?x16xf32>, %o: memref<1x1x16xf32>) {
  call @__pbsdk_attn0(%q, %k, %v, %o) : (memref<1x1x16xf32>, memref<1x?x16xf32>, memref<1x?x16xf32>, memref<1x1x16xf32>) -> ()
  return
}

// -----

// Keys along the lanes are one query's keys in f32 FMAs: a descriptor that also names a unit is refused.
// CHECK: pbsdk: error: in stage 'attention', op 'func.func': @__pbsdk_attn0: pbsdk.attention descriptor: along 'keys' ("queries", or "keys" with no unit, a power-of-two lane count and key blocks of one vector)
func.func private @__pbsdk_attn0(memref<2x1x32xbf16>, memref<2x40x32xbf16>, memref<2x40x32xbf16>, memref<2x1x32xbf16>) attributes {pbsdk.attention = {along = "keys", batch = 2 : i64, block_k = 16 : i64, block_q = 16 : i64, causal_offset, d = 32 : i64, dtype = "bf16", dv = 32 : i64, form = "lanes", kv_groups = 1 : i64, lanes = 16 : i64, level = "l1d", mask = false, mask_scale = 1.000000e+00 : f64, operands = {k = {batch = [[2, 1280, 1]], col_stride = 1 : i64, row_stride = 32 : i64, shape = [2, 40, 32]}, mask, o = {shape = [2, 1, 32]}, q = {batch = [[2, 32, 1]], col_stride = 1 : i64, row_stride = 0 : i64, shape = [2, 1, 32]}, v = {batch = [[2, 1280, 1]], col_stride = 1 : i64, row_stride = 32 : i64, shape = [2, 40, 32]}}, p_dtype = "f32", pv_cols = 2 : i64, q_vectors = 1 : i64, qk_keys = 16 : i64, scale = 0.17677669529663687 : f64, sk = 40 : i64, sq = 1 : i64, threads = 1 : i64, unit = {accumulator_dtype = "f32", k = 2 : i64, m = 1 : i64, n = 16 : i64, name = "vdpbf16ps", operand_dtype = "bf16"}, version = 1 : i64}}
func.func @main(%q: memref<2x1x32xbf16>, %k: memref<2x40x32xbf16>, %v: memref<2x40x32xbf16>, %o: memref<2x1x32xbf16>) {
  call @__pbsdk_attn0(%q, %k, %v, %o) : (memref<2x1x32xbf16>, memref<2x40x32xbf16>, memref<2x40x32xbf16>, memref<2x1x32xbf16>) -> ()
  return
}
