// The cpu target's math-approx stage: f32 exp/log/tanh/erf/powf become arith code (no libm calls left in
// the LLVM IR); f64 keeps its libm call.
// RUN: %pbsdk compile %s --emit math-approx | filecheck %s --check-prefix=APPROX
// RUN: %pbsdk compile %s --emit llvm-ir | filecheck %s --check-prefix=LLVMIR

#m = affine_map<(d0) -> (d0)>
func.func @gelu_ish(%a: tensor<16xf32>, %d: tensor<16xf64>) -> (tensor<16xf32>, tensor<16xf64>) {
  %e = tensor.empty() : tensor<16xf32>
  %r = linalg.generic {indexing_maps = [#m, #m], iterator_types = ["parallel"]}
      ins(%a : tensor<16xf32>) outs(%e : tensor<16xf32>) {
  ^bb0(%x: f32, %o: f32):
    %0 = math.exp %x : f32
    %1 = math.log %0 : f32
    %2 = math.tanh %1 : f32
    %3 = math.erf %2 : f32
    %4 = math.powf %3, %x : f32
    linalg.yield %4 : f32
  } -> tensor<16xf32>
  %ed = tensor.empty() : tensor<16xf64>
  %rd = linalg.generic {indexing_maps = [#m, #m], iterator_types = ["parallel"]}
      ins(%d : tensor<16xf64>) outs(%ed : tensor<16xf64>) {
  ^bb0(%x: f64, %o: f64):
    %0 = math.exp %x : f64
    linalg.yield %0 : f64
  } -> tensor<16xf64>
  return %r, %rd : tensor<16xf32>, tensor<16xf64>
}

// APPROX-LABEL: func.func @gelu_ish
// APPROX-NOT: math.{{(exp|log|tanh|erf|powf)}} {{.*}} : f32
// APPROX: arith.bitcast {{.*}} : f32 to i32
// APPROX: arith.shli
// APPROX: math.exp {{.*}} : f64
// APPROX-NOT: math.{{(exp|log|tanh|erf|powf)}} {{.*}} : f32

// LLVMIR-NOT: @expf
// LLVMIR-NOT: @logf
// LLVMIR-NOT: @erff
// LLVMIR-NOT: @tanhf
// LLVMIR-NOT: llvm.exp.f32
// LLVMIR-NOT: llvm.log.f32
// LLVMIR: llvm.exp.f64
