// The template target's stage vector-unit (hook vector_tile_op): every op the core marked
// pbsdk.compute, on scratchpad tiles, is lowered in place. The emulation counts the points it computes
// for the tiles' level (vector:<level>: a static product, or memref.dim for a dynamic tile) and builds the
// same op for the host, without the mark. Unmarked ops stay.
// RUN: %pbsdk opt %s --split-input-file --target template --spec %S/../bringup/data/edge_npu.yaml -p vector-unit \
// RUN:   | filecheck %s

// CHECK:       memref.global @__pbsdk_counters : memref<64xi64>
// CHECK-LABEL: func.func @scale(
// CHECK-SAME:      %[[X:[^:]*]]: memref<4x64xf32, 1>, %[[Y:[^:]*]]: memref<4x64xf32, 1>)
// CHECK:         %[[N:.*]] = arith.constant 256 : index
// CHECK:         %[[N64:.*]] = arith.index_cast %[[N]] : index to i64
// CHECK:         %[[G:.*]] = memref.get_global @__pbsdk_counters
// CHECK:         memref.store %{{.*}}, %[[G]]
// CHECK:         linalg.generic {{.*}} ins(%[[X]] : memref<4x64xf32, 1>) outs(%[[Y]] : memref<4x64xf32, 1>) {
// CHECK-NOT:     pbsdk.compute
// CHECK:         arith.mulf
// CHECK:         return
#id = affine_map<(d0, d1) -> (d0, d1)>
func.func @scale(%x: memref<4x64xf32, 1>, %y: memref<4x64xf32, 1>) {
  %two = arith.constant 2.0 : f32
  linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%x : memref<4x64xf32, 1>) outs(%y : memref<4x64xf32, 1>) attrs = {pbsdk.compute = "vector"} {
  ^bb0(%a: f32, %o: f32):
    %s = arith.mulf %a, %two : f32
    linalg.yield %s : f32
  }
  return
}

// -----

// A dynamic tile (a partial row block) counts rows x 1000 with memref.dim; a fill is lowered the same way;
// an unmarked op stays as it is.
// CHECK-LABEL: func.func @partial(
// CHECK:         memref.dim
// CHECK:         arith.muli
// CHECK:         linalg.generic {{.*}} ins(%{{.*}} : memref<?x1000xf32, 1>) outs(%{{.*}} : memref<?xf32, 1>) {
// CHECK:         linalg.fill ins(%{{.*}} : f32) outs(%{{.*}} : memref<8xf32, 1>)
// CHECK-NOT:     pbsdk.compute
// CHECK:         linalg.fill ins(%{{.*}} : f32) outs(%{{.*}} : memref<8xf32>)
#in = affine_map<(d0, d1) -> (d0, d1)>
#out = affine_map<(d0, d1) -> (d0)>
func.func @partial(%x: memref<?x1000xf32, 1>, %y: memref<?xf32, 1>, %z: memref<8xf32, 1>, %w: memref<8xf32>) {
  linalg.generic {indexing_maps = [#in, #out], iterator_types = ["parallel", "reduction"]}
      ins(%x : memref<?x1000xf32, 1>) outs(%y : memref<?xf32, 1>) attrs = {pbsdk.compute = "vector"} {
  ^bb0(%a: f32, %acc: f32):
    %s = arith.addf %a, %acc : f32
    linalg.yield %s : f32
  }
  %zero = arith.constant 0.0 : f32
  linalg.fill {pbsdk.compute = "vector"} ins(%zero : f32) outs(%z : memref<8xf32, 1>)
  linalg.fill ins(%zero : f32) outs(%w : memref<8xf32>)
  return
}
