// Pass vectorize-rows (core; the cpu target's stage): a row op's loop over its last dimension as vector loops
// at the spec's width (zen3: 8 f32 lanes), a reduction's partial results carried in registers.
// RUN: %pbsdk opt %s --split-input-file --spec zen3 -p vectorize-rows | filecheck %s

// A softmax row's max: 4 accumulators over 32 values a step, the 100 - 96 = 4 values past them masked (their
// lanes the identity, -inf), one vector.reduction, the old value combined once and stored once.
// CHECK-LABEL: func.func @row_max(
// CHECK-SAME:      %[[X:.*]]: memref<1x100xf32>, %[[ACC:.*]]: memref<1x1xf32>)
// CHECK-NOT:     memref.load
// CHECK:         %[[NEG:.*]] = arith.constant dense<0xFF800000> : vector<8xf32>
// CHECK:         %[[MAIN:.*]]:4 = scf.for %{{.*}} = %{{.*}} to %{{.*}} step %{{.*}} iter_args(
// CHECK-COUNT-4:   vector.load %[[X]]
// CHECK:           scf.yield
// CHECK:         arith.maxnumf %[[MAIN]]#0, %[[MAIN]]#1 fastmath<reassoc> : vector<8xf32>
// CHECK:         vector.create_mask
// CHECK:         vector.maskedload %[[X]]
// CHECK:         arith.select
// CHECK:         %[[R:.*]] = vector.reduction <maxnumf>, %{{.*}} : vector<8xf32> into f32
// CHECK:         %[[OLD:.*]] = memref.load %[[ACC]]
// CHECK:         %[[NEW:.*]] = arith.maxnumf %[[R]], %[[OLD]]
// CHECK:         memref.store %[[NEW]], %[[ACC]]
// CHECK-NOT:     linalg.generic
#row = affine_map<(d0, d1) -> (d0, d1)>
#acc = affine_map<(d0, d1) -> (d0, 0)>
func.func @row_max(%x: memref<1x100xf32>, %acc: memref<1x1xf32>) {
  linalg.generic {indexing_maps = [#row, #acc], iterator_types = ["parallel", "reduction"]}
      ins(%x : memref<1x100xf32>) outs(%acc : memref<1x1xf32>) {
  ^bb0(%a: f32, %o: f32):
    %m = arith.maxnumf %a, %o fastmath<reassoc> : f32
    linalg.yield %m : f32
  }
  return
}

// -----

// A map reading the row's scalar: loaded once and broadcast; the row in place (input and output one buffer).
// CHECK-LABEL: func.func @row_div(
// CHECK-SAME:      %[[Y:.*]]: memref<1x16xf32>, %[[S:.*]]: memref<1x1xf32>)
// CHECK:         %[[SV:.*]] = memref.load %[[S]]
// CHECK:         %[[B:.*]] = vector.broadcast %[[SV]] : f32 to vector<8xf32>
// CHECK:         scf.for
// CHECK:           %[[V:.*]] = vector.load %[[Y]]
// CHECK:           %[[D:.*]] = arith.divf %[[V]], %[[B]] fastmath<arcp> : vector<8xf32>
// CHECK:           vector.store %[[D]], %[[Y]]
// CHECK-NOT:     linalg.generic
#row = affine_map<(d0, d1) -> (d0, d1)>
#s = affine_map<(d0, d1) -> (d0, 0)>
func.func @row_div(%y: memref<1x16xf32>, %s: memref<1x1xf32>) {
  linalg.generic {indexing_maps = [#row, #s, #row], iterator_types = ["parallel", "parallel"]}
      ins(%y, %s : memref<1x16xf32>, memref<1x1xf32>) outs(%y : memref<1x16xf32>) {
  ^bb0(%a: f32, %b: f32, %o: f32):
    %d = arith.divf %a, %b fastmath<arcp> : f32
    linalg.yield %d : f32
  }
  return
}

// -----

// Left alone: a sum without reassoc (reordering it would change the result), a row shorter than a vector,
// and a body that reads its loop index.
// CHECK-LABEL: func.func @kept(
// CHECK-COUNT-3: linalg.generic
// CHECK-NOT:     vector.
#row = affine_map<(d0, d1) -> (d0, d1)>
#acc = affine_map<(d0, d1) -> (d0, 0)>
func.func @kept(%x: memref<1x100xf32>, %acc: memref<1x1xf32>, %short: memref<1x4xf32>) {
  linalg.generic {indexing_maps = [#row, #acc], iterator_types = ["parallel", "reduction"]}
      ins(%x : memref<1x100xf32>) outs(%acc : memref<1x1xf32>) {
  ^bb0(%a: f32, %o: f32):
    %m = arith.addf %a, %o : f32
    linalg.yield %m : f32
  }
  linalg.generic {indexing_maps = [#row, #acc], iterator_types = ["parallel", "reduction"]}
      ins(%short : memref<1x4xf32>) outs(%acc : memref<1x1xf32>) {
  ^bb0(%a: f32, %o: f32):
    %m = arith.maxnumf %a, %o : f32
    linalg.yield %m : f32
  }
  linalg.generic {indexing_maps = [#row, #row], iterator_types = ["parallel", "parallel"]}
      ins(%x : memref<1x100xf32>) outs(%x : memref<1x100xf32>) {
  ^bb0(%a: f32, %o: f32):
    %i = linalg.index 1 : index
    %c = arith.index_cast %i : index to i32
    %f = arith.sitofp %c : i32 to f32
    %m = arith.addf %a, %f : f32
    linalg.yield %m : f32
  }
  return
}

// -----

// A row whose length is known at run time (a decode step's keys): the bounds read from the row, the main loop,
// the vector-at-a-time loop and the masked tail all kept (the tail's count may be 0: an all-false mask).
// CHECK-LABEL: func.func @row_sum_dynamic(
// CHECK-SAME:      %[[X:.*]]: memref<1x?xf32, strided<[?, 1], offset: ?>>, %[[ACC:.*]]: memref<1x1xf32>)
// CHECK:         %[[N:.*]] = memref.dim %[[X]], %{{.*}}
// CHECK:         arith.divui %[[N]]
// CHECK:         scf.for {{.*}} iter_args(
// CHECK:         scf.for {{.*}} iter_args(
// CHECK:         vector.create_mask
// CHECK:         vector.maskedload %[[X]]
// CHECK:         vector.reduction <add>
// CHECK-NOT:     linalg.generic
#row = affine_map<(d0, d1) -> (d0, d1)>
#acc = affine_map<(d0, d1) -> (d0, 0)>
func.func @row_sum_dynamic(%x: memref<1x?xf32, strided<[?, 1], offset: ?>>, %acc: memref<1x1xf32>) {
  linalg.generic {indexing_maps = [#row, #acc], iterator_types = ["parallel", "reduction"]}
      ins(%x : memref<1x?xf32, strided<[?, 1], offset: ?>>) outs(%acc : memref<1x1xf32>) {
  ^bb0(%a: f32, %o: f32):
    %m = arith.addf %a, %o fastmath<reassoc> : f32
    linalg.yield %m : f32
  }
  return
}

// -----

// Rows of a count and a length known at run time (fuse-rows did not split them): a loop over the rows, each
// row's scalar loaded in it, the row's vector loops inside.
// CHECK-LABEL: func.func @rows_div_dynamic(
// CHECK-SAME:      %[[Y:.*]]: memref<?x?xf32>, %[[S:.*]]: memref<?x1xf32>)
// CHECK:         %[[R:.*]] = memref.dim %[[Y]], %c0
// CHECK:         scf.for %[[I:.*]] = %{{.*}} to %[[R]] step %{{.*}} {
// CHECK:           %[[SV:.*]] = memref.load %[[S]][%[[I]], %{{.*}}]
// CHECK:           vector.broadcast %[[SV]]
// CHECK:           scf.for
// CHECK:             vector.load %[[Y]][%[[I]],
// CHECK:             arith.divf
// CHECK:           vector.maskedstore %[[Y]][%[[I]],
// CHECK-NOT:     linalg.generic
#row = affine_map<(d0, d1) -> (d0, d1)>
#s = affine_map<(d0, d1) -> (d0, 0)>
func.func @rows_div_dynamic(%y: memref<?x?xf32>, %s: memref<?x1xf32>) {
  linalg.generic {indexing_maps = [#row, #s, #row], iterator_types = ["parallel", "parallel"]}
      ins(%y, %s : memref<?x?xf32>, memref<?x1xf32>) outs(%y : memref<?x?xf32>) {
  ^bb0(%a: f32, %b: f32, %o: f32):
    %d = arith.divf %a, %b fastmath<arcp> : f32
    linalg.yield %d : f32
  }
  return
}
