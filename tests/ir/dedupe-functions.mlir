// Pass dedupe-functions: private functions equal but for their names become one; their callers call it.
// RUN: %pbsdk opt %s --split-input-file -p dedupe-functions | filecheck %s

// Two identical kernels (and a different one) called from the entry: the second identical one goes.
// CHECK-LABEL: func.func @main(
// CHECK:         call @k0(%arg0)
// CHECK-NEXT:    call @k0(%arg1)
// CHECK-NEXT:    call @k2(%arg0)
// CHECK-LABEL: func.func private @k0(
// CHECK-NOT:   func.func private @k1(
// CHECK-LABEL: func.func private @k2(
func.func @main(%a: memref<4xf32>, %b: memref<4xf32>) {
  call @k0(%a) : (memref<4xf32>) -> ()
  call @k1(%b) : (memref<4xf32>) -> ()
  call @k2(%a) : (memref<4xf32>) -> ()
  return
}
func.func private @k0(%x: memref<4xf32>) {
  %c = arith.constant 1.0 : f32
  linalg.fill ins(%c : f32) outs(%x : memref<4xf32>)
  return
}
func.func private @k1(%x: memref<4xf32>) {
  %c = arith.constant 1.0 : f32
  linalg.fill ins(%c : f32) outs(%x : memref<4xf32>)
  return
}
func.func private @k2(%x: memref<4xf32>) {
  %c = arith.constant 2.0 : f32
  linalg.fill ins(%c : f32) outs(%x : memref<4xf32>)
  return
}

// -----

// Callers of merged functions merge in turn; public functions and declarations are kept.
// CHECK-LABEL: func.func @entry(
// CHECK:         call @outer0(%arg0)
// CHECK-NEXT:    call @outer0(%arg0)
// CHECK-LABEL: func.func @public_twin(
// CHECK-LABEL: func.func private @outer0(
// CHECK:         call @inner0(
// CHECK-LABEL: func.func private @inner0(
// CHECK-NOT:   func.func private @outer1(
// CHECK-NOT:   func.func private @inner1(
// CHECK:       func.func private @ext0(
// CHECK:       func.func private @ext1(
func.func @entry(%a: memref<4xf32>) {
  call @outer0(%a) : (memref<4xf32>) -> ()
  call @outer1(%a) : (memref<4xf32>) -> ()
  return
}
func.func @public_twin(%x: memref<4xf32>) {
  return
}
func.func private @outer0(%x: memref<4xf32>) {
  call @inner0(%x) : (memref<4xf32>) -> ()
  return
}
func.func private @outer1(%x: memref<4xf32>) {
  call @inner1(%x) : (memref<4xf32>) -> ()
  return
}
func.func private @inner0(%x: memref<4xf32>) {
  %c = arith.constant 3.0 : f32
  linalg.fill ins(%c : f32) outs(%x : memref<4xf32>)
  return
}
func.func private @inner1(%x: memref<4xf32>) {
  %c = arith.constant 3.0 : f32
  linalg.fill ins(%c : f32) outs(%x : memref<4xf32>)
  return
}
func.func private @ext0(memref<4xf32>)
func.func private @ext1(memref<4xf32>)

// -----

// Fused attention declarations with one descriptor are one kernel; with another, or without one, not.
// CHECK-LABEL: func.func @attn(
// CHECK:         call @a0(
// CHECK-NEXT:    call @a0(
// CHECK-NEXT:    call @a2(
// CHECK-NEXT:    call @x0(
// CHECK-NEXT:    call @x1(
// CHECK:       func.func private @a0(
// CHECK-NOT:   func.func private @a1(
// CHECK:       func.func private @a2(
// CHECK:       func.func private @x0(
// CHECK:       func.func private @x1(
func.func @attn(%a: memref<4xf32>) {
  call @a0(%a) : (memref<4xf32>) -> ()
  call @a1(%a) : (memref<4xf32>) -> ()
  call @a2(%a) : (memref<4xf32>) -> ()
  call @x0(%a) : (memref<4xf32>) -> ()
  call @x1(%a) : (memref<4xf32>) -> ()
  return
}
func.func private @a0(memref<4xf32>) attributes {pbsdk.attention = {d = 1}}
func.func private @a1(memref<4xf32>) attributes {pbsdk.attention = {d = 1}}
func.func private @a2(memref<4xf32>) attributes {pbsdk.attention = {d = 2}}
func.func private @x0(memref<4xf32>)
func.func private @x1(memref<4xf32>)
