// Pass promote-vector refuses what it cannot stage within the chip: the error names the stage, the op, the
// buffer that overflows, the level, what the level's live buffers need and its capacity. The specs are the
// edge NPU's with its scratchpad shrunk: to 4 B (one f32 element of the input fits, not the accumulator's
// too) and to 1 KiB (a convolution on the 16x16x16 matrix unit needs unit-sized tiles of each operand:
// 2 KiB, even with one output row and one kernel tap per tile).
// RUN: sed 's/size_bytes: 65536/size_bytes: 4/' %S/../bringup/data/edge_npu.yaml > %t.4B.yaml
// RUN: sed 's/size_bytes: 65536/size_bytes: 1024/' %S/../bringup/data/edge_npu.yaml > %t.1KiB.yaml
// RUN: not %pbsdk opt %s --split-input-file --spec %t.4B.yaml -p promote-vector 2>&1 | filecheck %s --check-prefix=TINY
// RUN: not %pbsdk opt %s --split-input-file --spec %t.1KiB.yaml -p promote-vector 2>&1 | filecheck %s --check-prefix=UNIT
// A spec with no software-managed level besides main memory (caches only) has nowhere to stage.
// RUN: not %pbsdk opt %s --split-input-file --spec intel/xeon-avx512 -p promote-vector 2>&1 \
// RUN:   | filecheck %s --check-prefix=CACHES

// TINY: pbsdk: error: in stage 'promote-vector', op 'linalg.generic': scratchpad overflow: buffer y0_spm does not fit in level 'spm': the level's live buffers need 8 B (x0_spm 1x1 f32 (4 B), y0_spm 1 f32 (4 B)), its capacity is 4 B
// With 1 KiB the row sum streams through the scratchpad in chunks (promote-vector.mlir): no error.
// UNIT-NOT: error
// CACHES: pbsdk: error: in stage 'promote-vector': spec 'intel/xeon-avx512' has no software-managed level to stage vector work in
#x = affine_map<(d0, d1) -> (d0, d1)>
#r = affine_map<(d0, d1) -> (d0)>
func.func @row_sum(%x: memref<3x20000xf32>, %y: memref<3xf32>) {
  linalg.generic {indexing_maps = [#x, #r], iterator_types = ["parallel", "reduction"]}
      ins(%x : memref<3x20000xf32>) outs(%y : memref<3xf32>) {
  ^bb0(%a: f32, %acc: f32):
    %s = arith.addf %a, %acc : f32
    linalg.yield %s : f32
  }
  return
}

// -----

// TINY: // -----
// TINY-NEXT: pbsdk: error: in stage 'promote-vector', op 'linalg.generic': scratchpad overflow: buffer x0_spm does not fit in level 'spm': the level's live buffers need 2048 B (x0_spm 1x1x16x16 f16 (512 B), x1_spm 1x1x16x16 f16 (512 B), y0_spm 1x1x16x16 f32 (1024 B)), its capacity is 4 B
// UNIT: // -----
// UNIT-NEXT: pbsdk: error: in stage 'promote-vector', op 'linalg.generic': scratchpad overflow: buffer y0_spm does not fit in level 'spm': the level's live buffers need 2048 B (x0_spm 1x1x16x16 f16 (512 B), x1_spm 1x1x16x16 f16 (512 B), y0_spm 1x1x16x16 f32 (1024 B)), its capacity is 1024 B
// CACHES: // -----
// CACHES-NEXT: pbsdk: error: in stage 'promote-vector': spec 'intel/xeon-avx512' has no software-managed level to stage vector work in
#in = affine_map<(n, oh, ow, f, kh, kw, c) -> (n, oh + kh, ow + kw, c)>
#w = affine_map<(n, oh, ow, f, kh, kw, c) -> (kh, kw, c, f)>
#o = affine_map<(n, oh, ow, f, kh, kw, c) -> (n, oh, ow, f)>
func.func @conv(%i: memref<1x10x18x32xf16>, %w: memref<3x3x32x16xf16>, %o: memref<1x8x16x16xf32>) {
  linalg.generic {indexing_maps = [#in, #w, #o],
                  iterator_types = ["parallel", "parallel", "parallel", "parallel", "reduction", "reduction", "reduction"]}
      ins(%i, %w : memref<1x10x18x32xf16>, memref<3x3x32x16xf16>) outs(%o : memref<1x8x16x16xf32>) {
  ^bb0(%a: f16, %b: f16, %acc: f32):
    %ae = arith.extf %a : f16 to f32
    %be = arith.extf %b : f16 to f32
    %p = arith.mulf %ae, %be : f32
    %s = arith.addf %acc, %p : f32
    linalg.yield %s : f32
  }
  return
}
