// Stage attention (cpu) refuses a "lanes" pbsdk.attention function it cannot build, naming the stage, the
// function and what is wrong: a descriptor missing a field (here "lanes", misspelt), one that is not JSON,
// one of another version, and a declaration whose arguments are not the descriptor's buffers.
// RUN: not %pbsdk opt %s --split-input-file --target cpu --spec intel/xeon-avx512 -p attention 2>&1 | filecheck %s

// CHECK: pbsdk: error: in stage 'attention', op 'func.func': @__pbsdk_attn0: malformed pbsdk.attention descriptor: KeyError('lanes')
func.func private @__pbsdk_attn0(memref<1x20x16xf32>, memref<1x20x16xf32>, memref<1x20x16xf32>, memref<1x20x16xf32>) attributes {pbsdk.attention = "{\22batch\22: 1, \22block_k\22: 28, \22block_q\22: 32, \22causal_offset\22: 0, \22d\22: 16, \22dtype\22: \22f32\22, \22dv\22: 16, \22form\22: \22lanes\22, \22kv_groups\22: 1, \22LANES\22: 16, \22level\22: \22l1d\22, \22mask\22: false, \22mask_scale\22: 1.0, \22operands\22: {\22k\22: {\22batch\22: [], \22col_stride\22: 1, \22row_stride\22: 16, \22shape\22: [1, 20, 16]}, \22mask\22: null, \22o\22: {\22shape\22: [1, 20, 16]}, \22q\22: {\22batch\22: [], \22col_stride\22: 1, \22row_stride\22: 16, \22shape\22: [1, 20, 16]}, \22v\22: {\22batch\22: [], \22col_stride\22: 1, \22row_stride\22: 16, \22shape\22: [1, 20, 16]}}, \22pv_cols\22: 8, \22q_vectors\22: 2, \22qk_keys\22: 14, \22scale\22: 0.25, \22sk\22: 20, \22sq\22: 20, \22threads\22: 1, \22version\22: 1}"}
func.func @main(%q: memref<1x20x16xf32>, %k: memref<1x20x16xf32>, %v: memref<1x20x16xf32>, %o: memref<1x20x16xf32>) {
  call @__pbsdk_attn0(%q, %k, %v, %o) : (memref<1x20x16xf32>, memref<1x20x16xf32>, memref<1x20x16xf32>, memref<1x20x16xf32>) -> ()
  return
}

// -----

// CHECK: pbsdk: error: in stage 'attention', op 'func.func': @__pbsdk_attn0: malformed pbsdk.attention descriptor: Expecting value: line 1 column 1 (char 0)
func.func private @__pbsdk_attn0(memref<1x20x16xf32>, memref<1x20x16xf32>, memref<1x20x16xf32>, memref<1x20x16xf32>) attributes {pbsdk.attention = "lanes, please"}
func.func @main(%q: memref<1x20x16xf32>, %k: memref<1x20x16xf32>, %v: memref<1x20x16xf32>, %o: memref<1x20x16xf32>) {
  call @__pbsdk_attn0(%q, %k, %v, %o) : (memref<1x20x16xf32>, memref<1x20x16xf32>, memref<1x20x16xf32>, memref<1x20x16xf32>) -> ()
  return
}

// -----

// CHECK: pbsdk: error: in stage 'attention', op 'func.func': @__pbsdk_attn0: pbsdk.attention descriptor version 2 (the cpu target reads 1)
func.func private @__pbsdk_attn0(memref<1x20x16xf32>, memref<1x20x16xf32>, memref<1x20x16xf32>, memref<1x20x16xf32>) attributes {pbsdk.attention = "{\22batch\22: 1, \22block_k\22: 28, \22block_q\22: 32, \22causal_offset\22: 0, \22d\22: 16, \22dtype\22: \22f32\22, \22dv\22: 16, \22form\22: \22lanes\22, \22kv_groups\22: 1, \22lanes\22: 16, \22level\22: \22l1d\22, \22mask\22: false, \22mask_scale\22: 1.0, \22operands\22: {\22k\22: {\22batch\22: [], \22col_stride\22: 1, \22row_stride\22: 16, \22shape\22: [1, 20, 16]}, \22mask\22: null, \22o\22: {\22shape\22: [1, 20, 16]}, \22q\22: {\22batch\22: [], \22col_stride\22: 1, \22row_stride\22: 16, \22shape\22: [1, 20, 16]}, \22v\22: {\22batch\22: [], \22col_stride\22: 1, \22row_stride\22: 16, \22shape\22: [1, 20, 16]}}, \22pv_cols\22: 8, \22q_vectors\22: 2, \22qk_keys\22: 14, \22scale\22: 0.25, \22sk\22: 20, \22sq\22: 20, \22threads\22: 1, \22version\22: 2}"}
func.func @main(%q: memref<1x20x16xf32>, %k: memref<1x20x16xf32>, %v: memref<1x20x16xf32>, %o: memref<1x20x16xf32>) {
  call @__pbsdk_attn0(%q, %k, %v, %o) : (memref<1x20x16xf32>, memref<1x20x16xf32>, memref<1x20x16xf32>, memref<1x20x16xf32>) -> ()
  return
}

// -----

// CHECK: pbsdk: error: in stage 'attention', op 'func.func': @__pbsdk_attn0 takes (memref<1x20x16xf32>, memref<1x20x16xf32>, memref<1x20x16xf32>, memref<1x20x16xf16>); its pbsdk.attention descriptor needs (memref<1x20x16xf32>, memref<1x20x16xf32>, memref<1x20x16xf32>, memref<1x20x16xf32>)
func.func private @__pbsdk_attn0(memref<1x20x16xf32>, memref<1x20x16xf32>, memref<1x20x16xf32>, memref<1x20x16xf16>) attributes {pbsdk.attention = "{\22batch\22: 1, \22block_k\22: 28, \22block_q\22: 32, \22causal_offset\22: 0, \22d\22: 16, \22dtype\22: \22f32\22, \22dv\22: 16, \22form\22: \22lanes\22, \22kv_groups\22: 1, \22lanes\22: 16, \22level\22: \22l1d\22, \22mask\22: false, \22mask_scale\22: 1.0, \22operands\22: {\22k\22: {\22batch\22: [], \22col_stride\22: 1, \22row_stride\22: 16, \22shape\22: [1, 20, 16]}, \22mask\22: null, \22o\22: {\22shape\22: [1, 20, 16]}, \22q\22: {\22batch\22: [], \22col_stride\22: 1, \22row_stride\22: 16, \22shape\22: [1, 20, 16]}, \22v\22: {\22batch\22: [], \22col_stride\22: 1, \22row_stride\22: 16, \22shape\22: [1, 20, 16]}}, \22pv_cols\22: 8, \22q_vectors\22: 2, \22qk_keys\22: 14, \22scale\22: 0.25, \22sk\22: 20, \22sq\22: 20, \22threads\22: 1, \22version\22: 1}"}
func.func @main(%q: memref<1x20x16xf32>, %k: memref<1x20x16xf32>, %v: memref<1x20x16xf32>, %o: memref<1x20x16xf16>) {
  call @__pbsdk_attn0(%q, %k, %v, %o) : (memref<1x20x16xf32>, memref<1x20x16xf32>, memref<1x20x16xf32>, memref<1x20x16xf16>) -> ()
  return
}
