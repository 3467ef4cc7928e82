// Core pass dynamic-sizes refuses what a pointer cannot carry: a dynamic buffer with a strided layout, and
// a declaration taking dynamic buffers (its body could not rebuild them).
// RUN: not %pbsdk opt %s --split-input-file --target cpu -p dynamic-sizes 2>&1 | filecheck %s

// CHECK: pbsdk: error: in stage 'dynamic-sizes', op 'func.func': @strided's argument 0 is a dynamic buffer with a strided layout (memref<?x8xf32, strided<[16, 1]>>); only identity layouts pass as pointers
func.func @strided(%x: memref<?x8xf32, strided<[16, 1]>>) {
  return
}

// -----

// CHECK: pbsdk: error: in stage 'dynamic-sizes', op 'func.func': declaration @kernel takes dynamic buffers; its body would need their sizes
func.func private @kernel(memref<?x8xf32>)
func.func @f(%x: memref<?x8xf32>) {
  func.call @kernel(%x) : (memref<?x8xf32>) -> ()
  return
}

// -----

// A view of a dynamic buffer has static sizes but strides known at run time: no pointer carries them.
// CHECK: pbsdk: error: in stage 'dynamic-sizes', op 'func.func': @last_row's argument 0 is a view whose strides or offset are known only at run time (memref<4x1x32xf32, strided<[?, 32, 1], offset: ?>>); only identity layouts pass as pointers
func.func @last_row(%x: memref<4x1x32xf32, strided<[?, 32, 1], offset: ?>>) {
  return
}
