// Pass math-approx run alone (math_approx.mlir covers it inside the cpu pipeline): its `ops` option picks
// which math ops become arith code; f16 is computed in f32 and truncated back; f64 is left to libm.
// RUN: %pbsdk opt %s -p math-approx | filecheck %s
// RUN: %pbsdk opt %s -p 'math-approx{ops=tanh}' | filecheck %s --check-prefix=TANH

// CHECK-LABEL: func.func @scalars(
// CHECK-NOT:     math.exp {{.*}} : f32
// CHECK-NOT:     math.tanh
// CHECK:         arith.bitcast {{.*}} : f32 to i32
// CHECK:         arith.extf %{{.*}} : f16 to f32
// CHECK:         arith.truncf %{{.*}} : f32 to f16
// CHECK:         math.exp %{{.*}} : f64
// CHECK:         return
// TANH-LABEL: func.func @scalars(
// TANH-NEXT:    math.exp %{{.*}} : f32
// TANH-NOT:     math.tanh
// TANH:         math.exp %{{.*}} : f64
func.func @scalars(%x: f32, %h: f16, %d: f64) -> (f32, f16, f64) {
  %e = math.exp %x : f32
  %t = math.tanh %h : f16
  %ed = math.exp %d : f64
  return %e, %t, %ed : f32, f16, f64
}
