// Pass promote refuses a tiling whose buffers do not fit a level: the error names the stage, the buffer
// that overflows, the level, what the level's live buffers need and its capacity (example/npu's spm holds
// 256 KiB; the tiles come from the template target's `tiles` option).
// RUN: not %pbsdk opt %s --target template -p promote --options 'tiles={"spm": [256, 128, 256]}' 2>&1 \
// RUN:   | filecheck %s

// CHECK: pbsdk: error: in stage 'promote', op 'linalg.generic': scratchpad overflow: buffer C_spm does not fit in level 'spm': the level's live buffers need 327680 B (A_spm 256x256 bf16 (131072 B), B_spm 256x128 bf16 (65536 B), C_spm 256x128 f32 (131072 B)), its capacity is 262144 B
// CHECK-NOT: Traceback
func.func @mm(%a: memref<256x256xbf16>, %b: memref<256x128xbf16>, %c: memref<256x128xf32>) {
  linalg.matmul ins(%a, %b : memref<256x256xbf16>, memref<256x128xbf16>) outs(%c : memref<256x128xf32>)
  return
}
