// Pass fuse-rows on a dynamic row count: a run of row-local ops whose rows provably have one size (a
// memref.dim of one buffer, or the same size in the entry's signature) becomes @__pbsdk_rows<N>_part, which
// reads the count from its first op's output and takes ceil(count / parts) rows a part. The call forks over
// the cores when there are enough rows for it at run time, and otherwise runs @__pbsdk_rows<N>_one, the
// same loop as one part, on the calling thread. Ops over rows of sizes the IR cannot prove equal are not
// fused together. A row of a dynamic width is viewed with the width read from its buffer.
// RUN: %pbsdk opt %s --split-input-file --spec intel/xeon-avx512 -p fuse-rows | filecheck %s

// CHECK-LABEL: func.func @softmax_head(
// CHECK-SAME:      %[[IN:[^:]*]]: memref<?x128xf32>, %[[OUT:[^:]*]]: memref<?x128xf32>)
// CHECK:         %[[N:.*]] = memref.dim %[[IN]], %{{.*}} : memref<?x128xf32>
// CHECK:         %[[MAX:.*]] = memref.alloc(%[[N]])
// CHECK:         %[[TMP:.*]] = memref.alloc(%[[N]])
// CHECK-NOT:     linalg.
// CHECK:         %[[ROWS:.*]] = memref.dim %[[MAX]], %{{.*}} : memref<?xf32>
// Fork at 170 rows: 2 parts of at least 32768 elements, 387 a row (the fill's 1, the max's 128 + 1, the
// exp's 128 + 1 + 128).
// CHECK-NEXT:    %[[AT:.*]] = arith.constant 170 : index
// CHECK-NEXT:    %[[MANY:.*]] = arith.cmpi sge, %[[ROWS]], %[[AT]] : index
// CHECK-NEXT:    scf.if %[[MANY]] {
// CHECK-NEXT:      scf.forall (%[[T:.*]]) in (2) {
// CHECK-NEXT:        func.call @__pbsdk_rows0_part(%[[MAX]], %[[IN]], %[[TMP]], %[[T]])
// CHECK:         } else {
// CHECK-NEXT:      %[[ZERO:.*]] = arith.constant 0 : index
// CHECK-NEXT:      func.call @__pbsdk_rows0_one(%[[MAX]], %[[IN]], %[[TMP]], %[[ZERO]])
// CHECK:         memref.copy %[[TMP]], %[[OUT]]
// CHECK-LABEL: func.func @__pbsdk_rows0_one(
// CHECK-LABEL: func.func @__pbsdk_rows0_part(
// CHECK-SAME:      %[[M:[^:]*]]: memref<?xf32>, %[[I:[^:]*]]: memref<?x128xf32>, %[[O:[^:]*]]: memref<?x128xf32>, %[[P:[^:]*]]: index)
// CHECK:         %[[CNT:.*]] = memref.dim %[[M]], %{{.*}} : memref<?xf32>
// CHECK-NEXT:    %[[ONE:.*]] = arith.constant 1 : index
// CHECK-NEXT:    %[[SUM:.*]] = arith.addi %[[CNT]], %[[ONE]] : index
// CHECK-NEXT:    %[[TWO:.*]] = arith.constant 2 : index
// CHECK-NEXT:    %[[PER:.*]] = arith.divui %[[SUM]], %[[TWO]] : index
// CHECK:         %[[LO:.*]] = arith.muli %[[P]], %[[PER]] : index
// CHECK:         scf.for %[[R:.*]] = %[[LO]] to %{{.*}} step %{{.*}} {
// CHECK-NEXT:      memref.subview %[[M]][%[[R]]] [1] [1]
// CHECK-NEXT:      memref.subview %[[I]][%[[R]], 0] [1, 128] [1, 1]
#x = affine_map<(d0, d1) -> (d0, d1)>
#r = affine_map<(d0, d1) -> (d0)>
func.func @softmax_head(%in: memref<?x128xf32>, %out: memref<?x128xf32>) {
  %c0 = arith.constant 0 : index
  %n = memref.dim %in, %c0 : memref<?x128xf32>
  %max = memref.alloc(%n) : memref<?xf32>
  %tmp = memref.alloc(%n) : memref<?x128xf32>
  %ninf = arith.constant -3.4e38 : f32
  linalg.fill ins(%ninf : f32) outs(%max : memref<?xf32>)
  linalg.generic {indexing_maps = [#x, #r], iterator_types = ["parallel", "reduction"]}
      ins(%in : memref<?x128xf32>) outs(%max : memref<?xf32>) {
  ^bb0(%a: f32, %m: f32):
    %y = arith.maximumf %a, %m : f32
    linalg.yield %y : f32
  }
  linalg.generic {indexing_maps = [#x, #r, #x], iterator_types = ["parallel", "parallel"]}
      ins(%in, %max : memref<?x128xf32>, memref<?xf32>) outs(%tmp : memref<?x128xf32>) {
  ^bb0(%a: f32, %m: f32, %o: f32):
    %d = arith.subf %a, %m : f32
    %e = math.exp %d : f32
    linalg.yield %e : f32
  }
  memref.copy %tmp, %out : memref<?x128xf32> to memref<?x128xf32>
  return
}

// -----

// Rows of two arguments' dynamic sizes: not provably equal, so each op stays alone (one op on its own
// is still split over the cores).
// CHECK-LABEL: func.func @two_sizes(
// CHECK-SAME:      %[[A:[^:]*]]: memref<?x128xf32>, %[[B:[^:]*]]: memref<?x128xf32>, %[[C:[^:]*]]: memref<?x128xf32>)
// CHECK:         call @__pbsdk_rows0_part(%[[A]], %[[B]], %{{[a-z0-9_]+}})
// CHECK:         call @__pbsdk_rows1_part(%[[A]], %[[C]], %{{[a-z0-9_]+}})
#x = affine_map<(d0, d1) -> (d0, d1)>
func.func @two_sizes(%a: memref<?x128xf32>, %b: memref<?x128xf32>, %c: memref<?x128xf32>) {
  linalg.generic {indexing_maps = [#x, #x], iterator_types = ["parallel", "parallel"]}
      ins(%a : memref<?x128xf32>) outs(%b : memref<?x128xf32>) {
  ^bb0(%x: f32, %o: f32):
    %y = math.exp %x : f32
    linalg.yield %y : f32
  }
  linalg.generic {indexing_maps = [#x, #x], iterator_types = ["parallel", "parallel"]}
      ins(%a : memref<?x128xf32>) outs(%c : memref<?x128xf32>) {
  ^bb0(%x: f32, %o: f32):
    %y = math.tanh %x : f32
    linalg.yield %y : f32
  }
  return
}

// -----

// Rows of a dynamic width (a softmax over a key length): each row view takes its width from the buffer.
// CHECK-LABEL: func.func @key_rows(
// CHECK:         call @__pbsdk_rows0_part(
// CHECK-LABEL: func.func @__pbsdk_rows0_part(
// CHECK-SAME:      %[[M:[^:]*]]: memref<8xf32>, %[[S:[^:]*]]: memref<8x?xf32>, %{{[^:]*}}: index)
// CHECK:         scf.for %[[R:.*]] = %{{.*}} to %{{.*}} step %{{.*}} {
// CHECK:           %[[W:.*]] = memref.dim %[[S]], %{{.*}} : memref<8x?xf32>
// CHECK-NEXT:      memref.subview %[[S]][%[[R]], 0] [1, %[[W]]] [1, 1] : memref<8x?xf32> to memref<1x?xf32, strided<[?, 1], offset: ?>>
#x = affine_map<(d0, d1) -> (d0, d1)>
#r = affine_map<(d0, d1) -> (d0)>
func.func @key_rows(%s: memref<8x?xf32>, %max: memref<8xf32>) {
  %ninf = arith.constant -3.4e38 : f32
  linalg.fill ins(%ninf : f32) outs(%max : memref<8xf32>)
  linalg.generic {indexing_maps = [#x, #r], iterator_types = ["parallel", "reduction"]}
      ins(%s : memref<8x?xf32>) outs(%max : memref<8xf32>) {
  ^bb0(%a: f32, %m: f32):
    %y = arith.maximumf %a, %m : f32
    linalg.yield %y : f32
  }
  linalg.generic {indexing_maps = [#x, #r, #x], iterator_types = ["parallel", "parallel"]}
      ins(%s, %max : memref<8x?xf32>, memref<8xf32>) outs(%s : memref<8x?xf32>) {
  ^bb0(%a: f32, %m: f32, %o: f32):
    %d = arith.subf %a, %m : f32
    %e = math.exp %d : f32
    linalg.yield %e : f32
  }
  return
}

// -----

// A body that reads the row index (an iota over a dynamic row count, fused into its user) is not fused:
// on a one-row view `linalg.index 0` would be 0 on every row. Reading another loop's index is fine.
// CHECK-LABEL: func.func @row_iota(
// CHECK-NOT:     call @__pbsdk_rows
// CHECK:         linalg.index 0
// CHECK-LABEL: func.func @column_iota(
// CHECK:         call @__pbsdk_rows0_part(
#m = affine_map<(d0, d1) -> (d0, d1)>
func.func @row_iota(%x: memref<?x4xf32>, %y: memref<?x4xf32>) {
  linalg.generic {indexing_maps = [#m, #m], iterator_types = ["parallel", "parallel"]}
      ins(%x : memref<?x4xf32>) outs(%y : memref<?x4xf32>) {
  ^bb0(%a: f32, %o: f32):
    %i = linalg.index 0 : index
    %n = arith.index_cast %i : index to i64
    %f = arith.sitofp %n : i64 to f32
    %s = arith.addf %a, %f : f32
    linalg.yield %s : f32
  }
  return
}
func.func @column_iota(%x: memref<?x4xf32>, %y: memref<?x4xf32>) {
  linalg.generic {indexing_maps = [#m, #m], iterator_types = ["parallel", "parallel"]}
      ins(%x : memref<?x4xf32>) outs(%y : memref<?x4xf32>) {
  ^bb0(%a: f32, %o: f32):
    %i = linalg.index 1 : index
    %n = arith.index_cast %i : index to i64
    %f = arith.sitofp %n : i64 to f32
    %s = arith.addf %a, %f : f32
    linalg.yield %s : f32
  }
  return
}
