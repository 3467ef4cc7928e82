// The cpu target's stage lower-parallel: an scf.forall over kernel parts (one func.call of a part with
// static buffers and the induction variable, a constant trip count, as fuse-rows and pack-contractions
// build it) becomes a call of @__pbsdk_fork_<part> on the same buffers, declared once per part; the loader
// defines it (GOMP_parallel over the parts). A forall of another shape is left for the upstream
// scf-forall-to-for. A part forked with another trip count gets a fork of its own (a fork runs a fixed
// number of parts).
// RUN: %pbsdk opt %s --target cpu --spec intel/xeon-avx512 -p lower-parallel | filecheck %s

// CHECK-DAG:   func.func private @__pbsdk_fork_part(memref<256x128xf32>, memref<256x128xf32>)
// CHECK-DAG:   func.func private @__pbsdk_fork_part_1(memref<256x128xf32>, memref<256x128xf32>)
// CHECK-NOT:   func.func private @__pbsdk_fork_
// CHECK-LABEL: func.func @rows(
// CHECK-SAME:      %[[IN:[^:]*]]: memref<256x128xf32>, %[[OUT:[^:]*]]: memref<256x128xf32>)
// CHECK-NEXT:    call @__pbsdk_fork_part(%[[IN]], %[[OUT]]) : (memref<256x128xf32>, memref<256x128xf32>) -> ()
// CHECK-NEXT:    call @__pbsdk_fork_part(%[[OUT]], %[[IN]])
// CHECK-NEXT:    call @__pbsdk_fork_part_1(%[[IN]], %[[OUT]])
// A forall whose body is not one call of a part stays.
// CHECK-NEXT:    arith.constant
// CHECK-NEXT:    scf.forall
// CHECK-NEXT:      memref.store
// CHECK-NOT:     scf.forall
func.func @rows(%in: memref<256x128xf32>, %out: memref<256x128xf32>) {
  scf.forall (%t) in (2) {
    func.call @part(%in, %out, %t) : (memref<256x128xf32>, memref<256x128xf32>, index) -> ()
  }
  scf.forall (%t) in (2) {
    func.call @part(%out, %in, %t) : (memref<256x128xf32>, memref<256x128xf32>, index) -> ()
  }
  scf.forall (%t) in (4) {
    func.call @part(%in, %out, %t) : (memref<256x128xf32>, memref<256x128xf32>, index) -> ()
  }
  %zero = arith.constant 0.0 : f32
  scf.forall (%t) in (2) {
    memref.store %zero, %out[%t, %t] : memref<256x128xf32>
  }
  return
}
func.func private @part(%in: memref<256x128xf32>, %out: memref<256x128xf32>, %t: index) {
  return
}
