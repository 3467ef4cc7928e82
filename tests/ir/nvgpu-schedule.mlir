// Stage schedule (nvgpu): the core's tiled form mapped onto the GPU. Here promote (run first, with the
// units nvgpu issues and accumulators in static shared memory) has staged a 512x512x32 f16 matmul in
// shared memory (memory space 2 = h100's smem) with one mma.sync.m16n8k16-sized op per unit step, each
// block's tile holding several 16x8 C tiles;
// schedule retypes the buffers to the workgroup address space, maps the compute-level forall to blocks,
// turns each unit step — here the whole k loop of them, one strip call, so that map-gpu's mma.sync body
// keeps the C fragment in registers across k — into a call of a private function marked
// pbsdk.matrix_unit (its host body the multiply-accumulate), spreads the loops that pick C tiles over the
// block's warps, and tiles every copy over the block's threads.
// RUN: %pbsdk opt %s --target nvgpu --spec h100 -p promote,schedule | filecheck %s

// CHECK-LABEL: func.func @mm(
// CHECK:         scf.forall ({{.*}}) in ({{.*}}) {
// CHECK-DAG:       memref.alloc() {{.*}} : memref<{{.*}}xf16, #gpu.address_space<workgroup>>
// CHECK-DAG:       memref.alloc() {{.*}} : memref<{{.*}}xf32, #gpu.address_space<workgroup>>
// CHECK:           scf.forall ({{.*}}) in ({{.*}}) {
// CHECK:             linalg.generic {{.*}} outs({{.*}}#gpu.address_space<workgroup>>)
// CHECK:           } {mapping = [#gpu.thread<linear_dim_{{[0-9]}}>{{.*}}]}
// CHECK:           scf.forall (%[[W:.*]]) in ({{[0-9]+}}) {
// CHECK:             scf.for %{{.*}} = %[[W]] to
// CHECK-NOT:           scf.for
// CHECK:               func.call @__pbsdk_mma_0({{.*}}) {no_inline}
// CHECK:           } {mapping = [#gpu.warp<linear_dim_0>]}
// CHECK:         } {mapping = [#gpu.block<{{.*}}>], pbsdk.compute_level = "sm"}
// CHECK-LABEL: func.func private @__pbsdk_mma_0(
// CHECK-SAME:      memref<16x32xf16, {{.*}}#gpu.address_space<workgroup>>, %{{.*}}: memref<32x8xf16, {{.*}}, %{{.*}}: memref<16x8xf32, {{.*}}#gpu.address_space<workgroup>>)
// CHECK-SAME:      attributes {pbsdk.matrix_unit = "mma.sync.m16n8k16"}
// CHECK:         linalg.generic
// CHECK-NOT:     vector.
func.func @mm(%a: memref<512x32xf16>, %b: memref<32x512xf16>, %c: memref<512x512xf32>) {
  linalg.matmul ins(%a, %b : memref<512x32xf16>, memref<32x512xf16>) outs(%c : memref<512x512xf32>)
  return
}
