// Core pass dynamic-results refuses a dynamic result whose size its callers cannot compute from the
// arguments, and one the function does not allocate itself.
// RUN: not %pbsdk opt %s --split-input-file -p dynamic-results 2>&1 | filecheck %s

// CHECK: pbsdk: error: in stage 'dynamic-results', op 'func.func': @loaded returns a buffer of dynamic size that its callers cannot compute from the arguments
func.func private @loaded(%sizes: memref<1xindex>) -> memref<?xf32> {
  %c0 = arith.constant 0 : index
  %n = memref.load %sizes[%c0] : memref<1xindex>
  %out = memref.alloc(%n) : memref<?xf32>
  return %out : memref<?xf32>
}

// -----

// CHECK: pbsdk: error: in stage 'dynamic-results', op 'func.func': @passed's result 0 is a dynamic buffer it does not allocate itself
func.func private @passed(%x: memref<?xf32>) -> memref<?xf32> {
  return %x : memref<?xf32>
}
