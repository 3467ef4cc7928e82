// Stage schedule (nvgpu) refuses a compute-level loop it cannot map onto the grid: blocks have at most
// three dimensions, and the error names the stage, the op and the count.
// RUN: not %pbsdk opt %s --target nvgpu --spec h100 -p schedule 2>&1 | filecheck %s

// CHECK: pbsdk: error: in stage 'schedule', op 'scf.forall': 4 parallel loops over the sms (blocks take at most 3)
// CHECK-NOT: Traceback
func.func @f(%out: memref<2x2x2x2xf32>) {
  %one = arith.constant 1.0 : f32
  scf.forall (%i, %j, %k, %l) in (2, 2, 2, 2) {
    memref.store %one, %out[%i, %j, %k, %l] : memref<2x2x2x2xf32>
  } {pbsdk.compute_level = "sm"}
  return
}
