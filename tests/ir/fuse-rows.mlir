// Pass fuse-rows (core; the cpu target's stage): a run of row-local linalg ops on buffers moves into
// @__pbsdk_rows<N>_part, which loops over its rows and applies every op to one-row views, so a row stays in
// cache from one op to the next; with enough work the rows are split over the spec's cores (scf.forall).
// RUN: %pbsdk opt %s --split-input-file --spec intel/xeon-avx512 -p fuse-rows | filecheck %s
// RUN: %pbsdk opt %s --split-input-file --target cpu --spec intel/xeon-avx512 -p fuse-rows --options fuse_rows=false \
// RUN:   | filecheck %s --check-prefix=OFF

// Row max then exp(x - max), 64 rows: too little work to fork, so one call covers rows [0, 64).
// CHECK-LABEL: func.func @softmax_head(
// CHECK-SAME:      %[[IN:.*]]: memref<64x128xf32>, %[[MAX:.*]]: memref<64xf32>, %[[OUT:.*]]: memref<64x128xf32>)
// CHECK-NOT:     linalg.
// CHECK:         %[[ZERO:.*]] = arith.constant 0 : index
// CHECK-NEXT:    call @__pbsdk_rows0_part(%[[MAX]], %[[IN]], %[[OUT]], %[[ZERO]])
// CHECK-NEXT:    return
// CHECK-LABEL: func.func @__pbsdk_rows0_part(
// CHECK-SAME:      %[[M:.*]]: memref<64xf32>, %[[I:.*]]: memref<64x128xf32>, %[[O:.*]]: memref<64x128xf32>, %{{.*}}: index)
// CHECK:         scf.for %[[R:.*]] = %{{.*}} to %{{.*}} step %{{.*}} {
// CHECK-NEXT:      %[[MR:.*]] = memref.subview %[[M]][%[[R]]] [1] [1]
// CHECK-NEXT:      %[[IR:.*]] = memref.subview %[[I]][%[[R]], 0] [1, 128] [1, 1]
// CHECK-NEXT:      %[[OR:.*]] = memref.subview %[[O]][%[[R]], 0] [1, 128] [1, 1]
// CHECK:           linalg.fill {{.*}} outs(%[[MR]] :
// CHECK-NEXT:      linalg.generic {{.*}} ins(%[[IR]] : {{.*}}) outs(%[[MR]] :
// CHECK:           linalg.generic {{.*}} ins(%[[IR]], %[[MR]] : {{.*}}) outs(%[[OR]] :
// OFF-LABEL: func.func @softmax_head(
// OFF-NOT:     call
// OFF:         linalg.fill
// OFF-NEXT:    linalg.generic
// OFF:         linalg.generic
#x = affine_map<(d0, d1) -> (d0, d1)>
#r = affine_map<(d0, d1) -> (d0)>
func.func @softmax_head(%in: memref<64x128xf32>, %max: memref<64xf32>, %out: memref<64x128xf32>) {
  %ninf = arith.constant 0xFF800000 : f32
  linalg.fill ins(%ninf : f32) outs(%max : memref<64xf32>)
  linalg.generic {indexing_maps = [#x, #r], iterator_types = ["parallel", "reduction"]}
      ins(%in : memref<64x128xf32>) outs(%max : memref<64xf32>) {
  ^bb0(%a: f32, %m: f32):
    %0 = arith.maximumf %a, %m : f32
    linalg.yield %0 : f32
  }
  linalg.generic {indexing_maps = [#x, #r, #x], iterator_types = ["parallel", "parallel"]}
      ins(%in, %max : memref<64x128xf32>, memref<64xf32>) outs(%out : memref<64x128xf32>) {
  ^bb0(%a: f32, %m: f32, %o: f32):
    %0 = arith.subf %a, %m : f32
    %1 = math.exp %0 : f32
    linalg.yield %1 : f32
  }
  return
}

// -----

// 256 rows: the rows are split over the spec's 2 cores.
// CHECK-LABEL: func.func @wide(
// CHECK:         scf.forall (%[[T:.*]]) in (2) {
// CHECK-NEXT:      func.call @__pbsdk_rows0_part(%{{.*}}, %{{.*}}, %[[T]])
// CHECK-LABEL: func.func @__pbsdk_rows0_part(
// CHECK:         scf.for
#x2 = affine_map<(d0, d1) -> (d0, d1)>
func.func @wide(%in: memref<256x128xf32>, %out: memref<256x128xf32>) {
  linalg.generic {indexing_maps = [#x2, #x2], iterator_types = ["parallel", "parallel"]}
      ins(%in : memref<256x128xf32>) outs(%out : memref<256x128xf32>) {
  ^bb0(%a: f32, %o: f32):
    %0 = math.exp %a : f32
    linalg.yield %0 : f32
  }
  linalg.generic {indexing_maps = [#x2, #x2], iterator_types = ["parallel", "parallel"]}
      ins(%out : memref<256x128xf32>) outs(%out : memref<256x128xf32>) {
  ^bb0(%a: f32, %o: f32):
    %0 = arith.mulf %a, %a : f32
    linalg.yield %0 : f32
  }
  return
}

// -----

// The second op reads the first one's output transposed (row r needs a column): not row-local, so there
// is no run to fuse and the ops stay as they are.
// CHECK-LABEL: func.func @transposed(
// CHECK-NOT:     call
// CHECK:         linalg.generic
// CHECK:         linalg.generic {indexing_maps = [#{{.*}}, #{{.*}}]
// CHECK-NOT:     __pbsdk_rows
#id = affine_map<(d0, d1) -> (d0, d1)>
#tr = affine_map<(d0, d1) -> (d1, d0)>
func.func @transposed(%in: memref<64x64xf32>, %tmp: memref<64x64xf32>, %out: memref<64x64xf32>) {
  linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%in : memref<64x64xf32>) outs(%tmp : memref<64x64xf32>) {
  ^bb0(%a: f32, %o: f32):
    %0 = math.exp %a : f32
    linalg.yield %0 : f32
  }
  linalg.generic {indexing_maps = [#tr, #id], iterator_types = ["parallel", "parallel"]}
      ins(%tmp : memref<64x64xf32>) outs(%out : memref<64x64xf32>) {
  ^bb0(%a: f32, %o: f32):
    %0 = arith.negf %a : f32
    linalg.yield %0 : f32
  }
  return
}

// -----

// A transpose alone, big enough to split: row r of the result reads column r of the input, so the input is
// sliced along its second dimension ([0, r] [256, 1]) and the output along its first.
// CHECK-LABEL: func.func @transpose_split(
// CHECK:         scf.forall (%[[T:.*]]) in (2) {
// CHECK-NEXT:      func.call @__pbsdk_rows0_part(%{{.*}}, %{{.*}}, %[[T]])
// CHECK-LABEL: func.func @__pbsdk_rows0_part(
// CHECK-SAME:      %[[I:.*]]: memref<256x512xf32>, %[[O:.*]]: memref<512x256xf32>, %{{.*}}: index)
// CHECK:         scf.for %[[R:.*]] = %{{.*}} to %{{.*}} step %{{.*}} {
// CHECK-NEXT:      %[[IR:.*]] = memref.subview %[[I]][0, %[[R]]] [256, 1] [1, 1] : memref<256x512xf32> to memref<256x1xf32, strided<[512, 1], offset: ?>>
// CHECK-NEXT:      %[[OR:.*]] = memref.subview %[[O]][%[[R]], 0] [1, 256] [1, 1] : memref<512x256xf32> to memref<1x256xf32, strided<[256, 1], offset: ?>>
// CHECK:           linalg.generic {{.*}} ins(%[[IR]] : {{.*}}) outs(%[[OR]] :
#id3 = affine_map<(d0, d1) -> (d0, d1)>
#tr3 = affine_map<(d0, d1) -> (d1, d0)>
func.func @transpose_split(%in: memref<256x512xf32>, %out: memref<512x256xf32>) {
  linalg.generic {indexing_maps = [#tr3, #id3], iterator_types = ["parallel", "parallel"]}
      ins(%in : memref<256x512xf32>) outs(%out : memref<512x256xf32>) {
  ^bb0(%a: f32, %o: f32):
    linalg.yield %a : f32
  }
  return
}

// -----

// An output written transposed is not a row of the result: not split.
// CHECK-LABEL: func.func @transposed_output(
// CHECK-NOT:     __pbsdk_rows
#id4 = affine_map<(d0, d1) -> (d0, d1)>
#tr4 = affine_map<(d0, d1) -> (d1, d0)>
func.func @transposed_output(%in: memref<512x512xf32>, %out: memref<512x512xf32>) {
  linalg.generic {indexing_maps = [#id4, #tr4], iterator_types = ["parallel", "parallel"]}
      ins(%in : memref<512x512xf32>) outs(%out : memref<512x512xf32>) {
  ^bb0(%a: f32, %o: f32):
    linalg.yield %a : f32
  }
  return
}

// -----

// Two runs that are the same but for their buffers (a repeated layer's residual add): one row function.
// CHECK-LABEL: func.func @repeated(
// CHECK:         func.call @__pbsdk_rows0_part(
// CHECK:         func.call @__pbsdk_rows0_part(
// CHECK-NOT:     func.func @__pbsdk_rows1_part(
#x5 = affine_map<(d0, d1) -> (d0, d1)>
func.func @repeated(%a: memref<256x128xf32>, %b: memref<256x128xf32>, %c: memref<256x128xf32>) {
  linalg.generic {indexing_maps = [#x5, #x5], iterator_types = ["parallel", "parallel"]}
      ins(%a : memref<256x128xf32>) outs(%b : memref<256x128xf32>) {
  ^bb0(%x: f32, %o: f32):
    %0 = math.exp %x : f32
    linalg.yield %0 : f32
  }
  func.call @opaque(%b) : (memref<256x128xf32>) -> ()
  linalg.generic {indexing_maps = [#x5, #x5], iterator_types = ["parallel", "parallel"]}
      ins(%b : memref<256x128xf32>) outs(%c : memref<256x128xf32>) {
  ^bb0(%x: f32, %o: f32):
    %0 = math.exp %x : f32
    linalg.yield %0 : f32
  }
  return
}
func.func private @opaque(memref<256x128xf32>)
