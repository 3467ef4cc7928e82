// The template target's stage scratchpad refuses a buffer in a memory space that is no level of the spec,
// and a function still taking scratchpad memrefs once the hooks' functions are inlined (a public function
// is not inlined: on the host it would take a memref of a level that no longer exists). The errors name
// the stage (the op where there is one) and what is wrong.
// RUN: not %pbsdk opt %s --split-input-file --target template -p scratchpad 2>&1 | filecheck %s

// CHECK: pbsdk: error: in stage 'scratchpad', op 'memref.alloc': memory space 5 of memref<64xf32, 5> is not a memory level of spec 'example/npu' (its levels: 0 dram, 1 sram, 2 spm)
func.func @far() {
  %t = memref.alloc() : memref<64xf32, 5>
  memref.dealloc %t : memref<64xf32, 5>
  return
}

// -----

// CHECK: // -----
// CHECK-NEXT: pbsdk: error: in stage 'scratchpad': function @takes still takes scratchpad memrefs after inlining: on the host, a hook's external functions take addresses (hooks.address, hooks.strides), not memrefs in a scratchpad's memory space
func.func @takes(%a: memref<64xf32, 2>) {
  return
}
