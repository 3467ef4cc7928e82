// The template target's stage dma refuses a marked copy whose source or destination lies in a memory space
// that is no level of the spec (space i = spec.memory[i]; example/npu has three): the error names the
// stage, the op, the space, the type and the spec's levels.
// RUN: not %pbsdk opt %s --target template -p dma 2>&1 | filecheck %s

// CHECK: pbsdk: error: in stage 'dma', op 'linalg.copy': memory space 5 of memref<64xf32, 5> is not a memory level of spec 'example/npu' (its levels: 0 dram, 1 sram, 2 spm)
// CHECK-NOT: Traceback
func.func @far(%a: memref<64xf32>) {
  %t = memref.alloc() : memref<64xf32, 5>
  linalg.copy {pbsdk.dma = "dram->l5"} ins(%a : memref<64xf32>) outs(%t : memref<64xf32, 5>)
  return
}
