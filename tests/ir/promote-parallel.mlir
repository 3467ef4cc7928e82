// Passes promote and promote-vector map the outermost parallel tile loops onto the spec's outermost
// compute level (spec.compute[0]) when the staging level is per unit of it: one scf.forall over the
// plan's parts, marked pbsdk.compute_level = "<level>", whose body allocates that unit's own scratchpad
// buffers and walks its run of ceil(tiles / parts) tiles; buffers of a level the units share (the npu's
// device-wide sram) stay outside. Never a k or reduction loop.
// example/npu: 4 cores, each with its spm (memory space 2), a shared sram (space 1).
// RUN: %pbsdk opt %s --spec npu -p promote,promote-vector | filecheck %s
// tiny-npu: 2 cores, one per-core tcm (space 1).
// RUN: %pbsdk opt %s --spec %S/../bringup/data/tiny_npu.yaml -p promote,promote-vector \
// RUN:   | filecheck %s --check-prefix=TWO
// edge-npu: one core, so nothing is split.
// RUN: %pbsdk opt %s --spec %S/../bringup/data/edge_npu.yaml -p promote,promote-vector \
// RUN:   | filecheck %s --check-prefix=ONE

#x = affine_map<(d0, d1) -> (d0, d1)>
#b = affine_map<(d0, d1) -> (d1)>

// Elementwise, 64 rows: two spm tiles of 32 rows on npu, one per part (so no loop inside: the part's
// offset is its index times the tile); six tcm tiles of 11 rows on tiny-npu, three per core (the last
// tile partial).
// CHECK-DAG:   #[[ROW32:.*]] = affine_map<(d0) -> (d0 * 32)>
// CHECK-DAG:   #[[FIRST64:.*]] = affine_map<(d0) -> (d0 * 64)>
// CHECK-DAG:   #[[LAST64:.*]] = affine_map<(d0) -> (d0 * 64 + 64, 160)>
// CHECK-LABEL: func.func @bias(
// CHECK-SAME:      %[[A:.*]]: memref<64x256xf32>, %[[BIAS:.*]]: memref<256xf32>, %[[OUT:.*]]: memref<64x256xf32>)
// CHECK:         scf.forall (%[[P:.*]]) in (2) {
// CHECK-NEXT:      %[[X0:.*]] = memref.alloc() {alignment = 64 : i64} : memref<32x256xf32, 2>
// CHECK-NEXT:      %[[X1:.*]] = memref.alloc() {alignment = 64 : i64} : memref<256xf32, 2>
// CHECK-NEXT:      %[[Y0:.*]] = memref.alloc() {alignment = 64 : i64} : memref<32x256xf32, 2>
// CHECK-NEXT:      linalg.copy {pbsdk.dma = "dram->spm"} ins(%[[BIAS]] : memref<256xf32>) outs(%[[X1]]
// CHECK-NEXT:      %[[R:.*]] = affine.apply #[[ROW32]](%[[P]])
// CHECK-NOT:       scf.for
// CHECK:           memref.subview %[[A]][%[[R]], 0] [32, 256] [1, 1]
// CHECK:           linalg.generic {{.*}}pbsdk.compute = "vector"
// CHECK:           linalg.copy {pbsdk.dma = "spm->dram"} ins(%[[Y0]]
// CHECK:           memref.dealloc %[[X0]]
// CHECK-NEXT:      memref.dealloc %[[X1]]
// CHECK-NEXT:      memref.dealloc %[[Y0]]
// CHECK-NEXT:    } {pbsdk.compute_level = "core"}
// CHECK-NEXT:    return

// TWO-DAG:     #[[TFIRST:.*]] = affine_map<(d0) -> (d0 * 33)>
// TWO-DAG:     #[[TLAST:.*]] = affine_map<(d0) -> (d0 * 33 + 33, 64)>
// TWO-LABEL:   func.func @bias(
// TWO:           scf.forall (%[[P:.*]]) in (2) {
// TWO-NEXT:        memref.alloc() {{.*}} : memref<11x256xf32, 1>
// TWO-NEXT:        memref.alloc() {{.*}} : memref<256xf32, 1>
// TWO-NEXT:        memref.alloc() {{.*}} : memref<11x256xf32, 1>
// TWO-NEXT:        linalg.copy {pbsdk.dma = "dram->tcm"} ins(%{{.*}} : memref<256xf32>)
// TWO-NEXT:        %[[LO:.*]] = affine.apply #[[TFIRST]](%[[P]])
// TWO-NEXT:        %[[HI:.*]] = affine.min #[[TLAST]](%[[P]])
// TWO-NEXT:        scf.for %{{.*}} = %[[LO]] to %[[HI]] step %{{.*}} {
// TWO:           } {pbsdk.compute_level = "core"}

// ONE-LABEL:   func.func @bias(
// ONE-NOT:       scf.forall
// ONE:           scf.for
// ONE-NOT:       scf.forall
// ONE:           return
func.func @bias(%a: memref<64x256xf32>, %bias: memref<256xf32>, %out: memref<64x256xf32>) {
  linalg.generic {indexing_maps = [#x, #b, #x], iterator_types = ["parallel", "parallel"]}
      ins(%a, %bias : memref<64x256xf32>, memref<256xf32>) outs(%out : memref<64x256xf32>) {
  ^bb0(%x: f32, %y: f32, %o: f32):
    %s = arith.addf %x, %y : f32
    linalg.yield %s : f32
  }
  return
}

// A matmul of 160 rows: npu's spm tiles are 32x32, five of them along m (one along n) for 4 cores: 3
// parts of 2 tiles (the last of one), never the k loop. The sram buffers, shared by the cores, are
// allocated and filled once, outside the forall; each core's spm buffers inside it.
// CHECK-LABEL: func.func private @__pbsdk_promoted_0(
// CHECK-DAG:     %[[A1:.*]] = memref.alloc() {{.*}} : memref<160x64xbf16, 1>
// CHECK-DAG:     %[[C1:.*]] = memref.alloc() {{.*}} : memref<160x32xf32, 1>
// CHECK:         linalg.copy {pbsdk.dma = "dram->sram"}
// CHECK:         scf.forall (%[[P:.*]]) in (3) {
// CHECK-NEXT:      %[[A2:.*]] = memref.alloc() {{.*}} : memref<32x64xbf16, 2>
// CHECK-NEXT:      %[[B2:.*]] = memref.alloc() {{.*}} : memref<64x32xbf16, 2>
// CHECK-NEXT:      %[[C2:.*]] = memref.alloc() {{.*}} : memref<32x32xf32, 2>
// CHECK-NEXT:      %[[LO:.*]] = affine.apply #[[FIRST64]](%[[P]])
// CHECK-NEXT:      %[[HI:.*]] = affine.min #[[LAST64]](%[[P]])
// CHECK-NEXT:      scf.for %[[M:.*]] = %[[LO]] to %[[HI]] step %{{.*}} {
// CHECK-NEXT:        memref.subview %[[A1]][%[[M]], 0] [32, 64] [1, 1]
// CHECK:             scf.for
// CHECK:               linalg.generic {{.*}} outs(%[[C2]] : memref<32x32xf32, 2>) {{.*}}pbsdk.matrix_unit = "mxu"
// CHECK:             linalg.copy {pbsdk.dma = "spm->sram"} ins(%[[C2]]
// CHECK:           memref.dealloc %[[A2]]
// CHECK:         } {pbsdk.compute_level = "core"}
// CHECK-NEXT:    linalg.copy {pbsdk.dma = "sram->dram"} ins(%[[C1]]

// TWO-LABEL:   func.func private @__pbsdk_promoted_0(
// TWO:           scf.forall (%{{.*}}) in (2) {
// TWO-NEXT:        memref.alloc() {{.*}} : memref<64x64xbf16, 1>
// TWO:           } {pbsdk.compute_level = "core"}

// ONE-LABEL:   func.func private @__pbsdk_promoted_0(
// ONE-NOT:       scf.forall
// ONE:           return
func.func @mm(%a: memref<160x64xbf16>, %b: memref<64x32xbf16>, %c: memref<160x32xf32>) {
  linalg.matmul ins(%a, %b : memref<160x64xbf16>, memref<64x32xbf16>) outs(%c : memref<160x32xf32>)
  return
}
