// The core stage `input` refuses entry functions the runtime cannot call; each diagnostic names the stage,
// the op and the reason (one chunk per case; a failing chunk does not stop the others).
// RUN: not %pbsdk opt %s --split-input-file -p input 2>&1 | filecheck %s
// RUN: not %pbsdk opt %s --split-input-file -p input --options entry=nosuch 2>&1 | filecheck %s --check-prefix=ENTRY

// CHECK: pbsdk: error: in stage 'input', op 'func.func': argument 0 has dynamic shape tensor<?x4xf32>; the target compiles static shapes (one kernel per shape)
// ENTRY-COUNT-6: pbsdk: error: in stage 'input', op 'func.func': no function named 'nosuch' in the module
func.func @dynamic(%a: tensor<?x4xf32>) -> tensor<?x4xf32> {
  return %a : tensor<?x4xf32>
}

// -----

// CHECK: pbsdk: error: in stage 'input', op 'func.func': argument 0 has type memref<4xf32>; entry functions take and return ranked tensors
func.func @buffers(%a: memref<4xf32>) -> tensor<4xf32> {
  %t = bufferization.to_tensor %a : memref<4xf32> to tensor<4xf32>
  return %t : tensor<4xf32>
}

// -----

// CHECK: pbsdk: error: in stage 'input', op 'func.func': argument 0 has an empty dimension: tensor<0x4xf32>
func.func @empty(%a: tensor<0x4xf32>) -> tensor<0x4xf32> {
  return %a : tensor<0x4xf32>
}

// -----

// CHECK: pbsdk: error: in stage 'input', op 'func.func': argument 0 has element type i16; supported: bf16, f16, f32, f64, i32, i8
func.func @ints(%a: tensor<4xi16>) -> tensor<4xi16> {
  return %a : tensor<4xi16>
}

// -----

// CHECK: pbsdk: error: in stage 'input', op 'func.func': the entry function returns nothing
func.func @nothing(%a: tensor<4xf32>) {
  return
}

// -----

// CHECK: pbsdk: error: in stage 'input', op 'func.func': expected exactly one public function with a body, found ['first', 'second']; pass options={'entry': NAME}
// CHECK-NOT: pbsdk: error
func.func @first(%a: tensor<4xf32>) -> tensor<4xf32> {
  return %a : tensor<4xf32>
}
func.func @second(%a: tensor<4xf32>) -> tensor<4xf32> {
  return %a : tensor<4xf32>
}
