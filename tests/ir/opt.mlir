// `pbsdk opt`: runs exactly the named passes, in order, and prints the module (mlir-opt style). Names
// are pbsdk's passes, the --target's stages, or any upstream MLIR pass pipeline element.
// No passes: the module is parsed, verified and printed.
// RUN: %pbsdk opt %s | filecheck %s --check-prefix=ROUND
// Upstream passes, anchored on the module or nested (func.func(...)), mixed with pbsdk's.
// RUN: %pbsdk opt %s -p 'func.func(linalg-fuse-elementwise-ops),canonicalize,cse' | filecheck %s --check-prefix=UP
// RUN: %pbsdk opt %s -p isolate-contractions -p fuse | filecheck %s --check-prefix=UP
// Order matters: bufferize first, then the generics are on buffers and fusion on tensors does nothing.
// RUN: %pbsdk opt %s -p bufferize,fuse | filecheck %s --check-prefix=ORDER
// A later stage needing the entry signature works alone: opt reads it from the tensor-level input as
// `input` would, without running `input` as a pass.
// RUN: %pbsdk opt %s --target cpu -p bufferize,out-params,lower-loops,lower-llvm,llvm-ir | filecheck %s --check-prefix=LLVMIR

// ROUND-LABEL: func.func @two_ops(
// ROUND-COUNT-2: linalg.generic
// UP-LABEL: func.func @two_ops(
// UP:         linalg.generic
// UP-NOT:     linalg.generic
// UP:         arith.negf
// UP-NEXT:    math.exp
// ORDER-LABEL: func.func @two_ops(%{{.*}}: memref<4x8xf32>) -> memref<4x8xf32>
// ORDER-COUNT-2: linalg.generic
// LLVMIR: define void @two_ops(ptr %0, ptr %1)
#id = affine_map<(d0, d1) -> (d0, d1)>
func.func @two_ops(%a: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %e = tensor.empty() : tensor<4x8xf32>
  %n = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%a : tensor<4x8xf32>) outs(%e : tensor<4x8xf32>) {
  ^bb0(%x: f32, %o: f32):
    %0 = arith.negf %x : f32
    linalg.yield %0 : f32
  } -> tensor<4x8xf32>
  %r = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%n : tensor<4x8xf32>) outs(%e : tensor<4x8xf32>) {
  ^bb0(%x: f32, %o: f32):
    %0 = math.exp %x : f32
    linalg.yield %0 : f32
  } -> tensor<4x8xf32>
  return %r : tensor<4x8xf32>
}
