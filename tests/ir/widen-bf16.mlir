// Stage widen-bf16 of the cpu lowering: every extension from bf16 to f32, scalar or vector, becomes the
// shift of its bits into the top half of an f32, so that LLVM sees no fpext to narrow arithmetic back to
// bf16 with; the rounding back (truncf) stays.
// RUN: %pbsdk opt %s --split-input-file --target cpu --spec amd/zen4 -p widen-bf16 | filecheck %s

// CHECK-LABEL: func.func @max3(
// CHECK-NOT:     arith.extf
// CHECK:         %[[B:.*]] = arith.bitcast %{{.*}} : bf16 to i16
// CHECK:         %[[E:.*]] = arith.extui %[[B]] : i16 to i32
// CHECK:         %[[S:.*]] = arith.shli %[[E]], %{{.*}} : i32
// CHECK:         arith.bitcast %[[S]] : i32 to f32
// CHECK:         arith.maximumf
// CHECK:         arith.truncf %{{.*}} : f32 to bf16
func.func @max3(%a: bf16, %b: bf16) -> bf16 {
  %x = arith.extf %a : bf16 to f32
  %y = arith.extf %b : bf16 to f32
  %m = arith.maximumf %x, %y : f32
  %r = arith.truncf %m : f32 to bf16
  return %r : bf16
}

// -----

// CHECK-LABEL: func.func @vectors(
// CHECK:         arith.bitcast %{{.*}} : vector<16xbf16> to vector<16xi16>
// CHECK:         arith.extui %{{.*}} : vector<16xi16> to vector<16xi32>
// CHECK:         arith.constant dense<16> : vector<16xi32>
// CHECK:         arith.bitcast %{{.*}} : vector<16xi32> to vector<16xf32>
// CHECK-NOT:     arith.extf
func.func @vectors(%a: vector<16xbf16>) -> vector<16xf32> {
  %x = arith.extf %a : vector<16xbf16> to vector<16xf32>
  return %x : vector<16xf32>
}

// -----

// Left alone: extensions from f16, and from bf16 to f64.
// CHECK-LABEL: func.func @others(
// CHECK:         arith.extf %{{.*}} : f16 to f32
// CHECK:         arith.extf %{{.*}} : bf16 to f64
func.func @others(%a: f16, %b: bf16) -> (f32, f64) {
  %x = arith.extf %a : f16 to f32
  %y = arith.extf %b : bf16 to f64
  return %x, %y : f32, f64
}
