// The core's and the cpu target's stages on one small program: matmul + bias + relu.
// RUN: %pbsdk compile %s --emit input | filecheck %s --check-prefix=INPUT
// RUN: %pbsdk compile %s --emit fuse | filecheck %s --check-prefix=FUSE
// RUN: %pbsdk compile %s --emit out-params | filecheck %s --check-prefix=BUF
// RUN: %pbsdk compile %s --emit lower-loops | filecheck %s --check-prefix=LOOPS
// RUN: %pbsdk compile %s --emit lower-llvm | filecheck %s --check-prefix=LLVMD
// RUN: %pbsdk compile %s --emit llvm-ir | filecheck %s --check-prefix=LLVMIR
// RUN: %pbsdk compile %s | filecheck %s --check-prefix=LLVMIR

#id = affine_map<(d0, d1) -> (d0, d1)>
#row = affine_map<(d0, d1) -> (d1)>
func.func @layer(%x: tensor<4x8xf32>, %w: tensor<8x16xf32>, %b: tensor<16xf32>) -> tensor<4x16xf32> {
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<4x16xf32>
  %f = linalg.fill ins(%zero : f32) outs(%e : tensor<4x16xf32>) -> tensor<4x16xf32>
  %mm = linalg.matmul ins(%x, %w : tensor<4x8xf32>, tensor<8x16xf32>) outs(%f : tensor<4x16xf32>) -> tensor<4x16xf32>
  %e1 = tensor.empty() : tensor<4x16xf32>
  %biased = linalg.generic {indexing_maps = [#id, #row, #id], iterator_types = ["parallel", "parallel"]}
      ins(%mm, %b : tensor<4x16xf32>, tensor<16xf32>) outs(%e1 : tensor<4x16xf32>) {
  ^bb0(%a: f32, %c: f32, %o: f32):
    %s = arith.addf %a, %c : f32
    linalg.yield %s : f32
  } -> tensor<4x16xf32>
  %e2 = tensor.empty() : tensor<4x16xf32>
  %relu = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%biased : tensor<4x16xf32>) outs(%e2 : tensor<4x16xf32>) {
  ^bb0(%a: f32, %o: f32):
    %r = arith.maximumf %a, %zero : f32
    linalg.yield %r : f32
  } -> tensor<4x16xf32>
  return %relu : tensor<4x16xf32>
}

// INPUT-LABEL: func.func @layer
// INPUT: linalg.matmul
// INPUT-COUNT-2: linalg.generic

// Bias and relu fuse into one elementwise op after the matmul.
// FUSE-LABEL: func.func @layer
// FUSE: linalg.matmul
// FUSE-COUNT-1: linalg.generic
// FUSE-NOT: linalg.generic
// FUSE: arith.addf
// FUSE-NEXT: arith.maximumf

// The result becomes a caller-allocated output buffer; no tensors remain.
// BUF-LABEL: func.func @layer(%{{.*}}: memref<4x8xf32>, %{{.*}}: memref<8x16xf32>, %{{.*}}: memref<16xf32>, %{{.*}}: memref<4x16xf32>)
// BUF-NOT: tensor<
// BUF: linalg.matmul
// BUF: return
// BUF-NOT: memref.alloc

// LOOPS-LABEL: func.func @layer
// LOOPS-NOT: linalg.
// LOOPS: cf.br

// LLVMD: llvm.func @layer(%{{.*}}: !llvm.ptr, %{{.*}}: !llvm.ptr, %{{.*}}: !llvm.ptr, %{{.*}}: !llvm.ptr)
// LLVMD-NOT: memref.

// LLVMIR: define void @layer(ptr %0, ptr %1, ptr %2, ptr %3)
// LLVMIR: {{fmul float|@llvm.fmuladd.v[0-9]+f32}}
