// Pass promote-vector (core; the template target's second stage): every linalg.generic left on main memory
// is staged through the innermost scratchpad. One buffer per memref operand (memref.alloc in the level's
// memory space, aligned as the level asks), scf.for loops over the tiles that do not fit whole, each input
// tile copied in and each output tile copied out by a linalg.copy marked pbsdk.dma, the op itself on the
// buffers marked pbsdk.compute = "vector"; a reduction wider than the level streams through its
// accumulator in chunks; a fill of that accumulator is folded into it; a convolution runs as unit-sized
// pieces marked with the matrix unit. The spec is a single-core edge NPU: memory space 1 = its 64 KiB
// scratchpad 'spm' (32-byte alignment), a 16x16x16 f16->f32 matrix unit 'mac16'.
// RUN: %pbsdk opt %s --split-input-file --spec %S/../bringup/data/edge_npu.yaml -p promote-vector | filecheck %s
// The template target's stage of that name is this pass.
// RUN: %pbsdk opt %s --split-input-file --target template --spec %S/../bringup/data/edge_npu.yaml \
// RUN:   -p promote-vector | filecheck %s

// Elementwise with a broadcast operand: 64 rows of 1 KiB do not fit the double-buffered budget (32 KiB)
// with their output, so rows go in tiles of 13 (the last one partial: affine.min); the bias row, which no
// tile loop moves over, is loaded once before the loop.
// CHECK-LABEL: func.func @bias(
// CHECK-SAME:      %[[A:.*]]: memref<64x256xf32>, %[[BIAS:.*]]: memref<256xf32>, %[[OUT:.*]]: memref<64x256xf32>)
// CHECK-DAG:     %[[C0:.*]] = arith.constant 0 : index
// CHECK-DAG:     %[[C13:.*]] = arith.constant 13 : index
// CHECK-DAG:     %[[C64:.*]] = arith.constant 64 : index
// CHECK:         %[[X0:.*]] = memref.alloc() {alignment = 32 : i64} : memref<13x256xf32, 1>
// CHECK-NEXT:    %[[X1:.*]] = memref.alloc() {alignment = 32 : i64} : memref<256xf32, 1>
// CHECK-NEXT:    %[[Y0:.*]] = memref.alloc() {alignment = 32 : i64} : memref<13x256xf32, 1>
// CHECK-NEXT:    linalg.copy {pbsdk.dma = "dram->spm"} ins(%[[BIAS]] : memref<256xf32>) outs(%[[X1]] : memref<256xf32, 1>)
// CHECK-NEXT:    scf.for %[[R:.*]] = %[[C0]] to %[[C64]] step %[[C13]] {
// CHECK-NEXT:      %[[N:.*]] = affine.min #{{.*}}(%[[R]])
// CHECK-NEXT:      %[[OUT_T:.*]] = memref.subview %[[OUT]][%[[R]], 0] [%[[N]], 256] [1, 1]
// CHECK-NEXT:      %[[Y0_T:.*]] = memref.subview %[[Y0]][0, 0] [%[[N]], 256] [1, 1]
// CHECK-NEXT:      %[[A_T:.*]] = memref.subview %[[A]][%[[R]], 0] [%[[N]], 256] [1, 1]
// CHECK-NEXT:      %[[X0_T:.*]] = memref.subview %[[X0]][0, 0] [%[[N]], 256] [1, 1]
// CHECK-NEXT:      linalg.copy {pbsdk.dma = "dram->spm"} ins(%[[A_T]] : {{.*}}) outs(%[[X0_T]] : memref<?x256xf32, strided<[256, 1]>, 1>)
// CHECK-NEXT:      linalg.generic {{.*}} ins(%[[X0_T]], %[[X1]] : {{.*}}) outs(%[[Y0_T]] : {{.*}}) attrs = {pbsdk.compute = "vector"} {
// CHECK:             arith.addf
// CHECK:           linalg.copy {pbsdk.dma = "spm->dram"} ins(%[[Y0_T]] : {{.*}}) outs(%[[OUT_T]] : {{.*}})
// CHECK-NEXT:    }
// CHECK-NEXT:    memref.dealloc %[[X0]]
// CHECK-NEXT:    memref.dealloc %[[X1]]
// CHECK-NEXT:    memref.dealloc %[[Y0]]
// CHECK-NEXT:    return
#x = affine_map<(d0, d1) -> (d0, d1)>
#b = affine_map<(d0, d1) -> (d1)>
func.func @bias(%a: memref<64x256xf32>, %bias: memref<256xf32>, %out: memref<64x256xf32>) {
  linalg.generic {indexing_maps = [#x, #b, #x], iterator_types = ["parallel", "parallel"]}
      ins(%a, %bias : memref<64x256xf32>, memref<256xf32>) outs(%out : memref<64x256xf32>) {
  ^bb0(%x: f32, %y: f32, %o: f32):
    %s = arith.addf %x, %y : f32
    linalg.yield %s : f32
  }
  return
}

// -----

// A row sum whose rows (80000 B) are wider than the scratchpad: per row, the accumulator stays in the
// scratchpad while chunks of 6672 elements stream through it (the inner loop), and it goes out once per
// row. The fill that initialises it is folded: it fills the scratchpad accumulator, not main memory.
// CHECK-LABEL: func.func @wide_sum(
// CHECK-SAME:      %[[X:.*]]: memref<3x20000xf32>, %[[Y:.*]]: memref<3xf32>)
// CHECK-DAG:     %[[C6672:.*]] = arith.constant 6672 : index
// CHECK-DAG:     %[[C20000:.*]] = arith.constant 20000 : index
// CHECK-DAG:     %[[ZERO:.*]] = arith.constant 0.000000e+00 : f32
// CHECK-NOT:     linalg.
// CHECK:         %[[X0:.*]] = memref.alloc() {alignment = 32 : i64} : memref<1x6672xf32, 1>
// CHECK-NEXT:    %[[ACC:.*]] = memref.alloc() {alignment = 32 : i64} : memref<1xf32, 1>
// CHECK-NEXT:    scf.for %[[R:.*]] = %{{.*}} to %{{.*}} step %{{.*}} {
// CHECK-NEXT:      %[[Y_T:.*]] = memref.subview %[[Y]][%[[R]]] [1] [1]
// CHECK-NEXT:      linalg.fill {pbsdk.compute = "vector"} ins(%[[ZERO]] : f32) outs(%[[ACC]] : memref<1xf32, 1>)
// CHECK-NEXT:      scf.for %[[J:.*]] = %{{.*}} to %[[C20000]] step %[[C6672]] {
// CHECK-NEXT:        %[[N:.*]] = affine.min #{{.*}}(%[[J]])
// CHECK-NEXT:        %[[X_T:.*]] = memref.subview %[[X]][%[[R]], %[[J]]] [1, %[[N]]] [1, 1]
// CHECK-NEXT:        %[[X0_T:.*]] = memref.subview %[[X0]][0, 0] [1, %[[N]]] [1, 1]
// CHECK-NEXT:        linalg.copy {pbsdk.dma = "dram->spm"} ins(%[[X_T]] : {{.*}}) outs(%[[X0_T]] : memref<1x?xf32, strided<[6672, 1]>, 1>)
// CHECK-NEXT:        linalg.generic {{.*}} ins(%[[X0_T]] : {{.*}}) outs(%[[ACC]] : memref<1xf32, 1>) attrs = {pbsdk.compute = "vector"} {
// CHECK:               linalg.yield
// CHECK-NEXT:        }
// CHECK-NEXT:      }
// CHECK-NEXT:      linalg.copy {pbsdk.dma = "spm->dram"} ins(%[[ACC]] : memref<1xf32, 1>) outs(%[[Y_T]] : {{.*}})
// CHECK-NEXT:    }
#x = affine_map<(d0, d1) -> (d0, d1)>
#r = affine_map<(d0, d1) -> (d0)>
#s = affine_map<(d0) -> ()>
#v = affine_map<(d0) -> (d0)>
func.func @wide_sum(%x: memref<3x20000xf32>, %y: memref<3xf32>) {
  %zero = arith.constant 0.0 : f32
  linalg.generic {indexing_maps = [#s, #v], iterator_types = ["parallel"]} ins(%zero : f32) outs(%y : memref<3xf32>) {
  ^bb0(%v: f32, %o: f32):
    linalg.yield %v : f32
  }
  linalg.generic {indexing_maps = [#x, #r], iterator_types = ["parallel", "reduction"]}
      ins(%x : memref<3x20000xf32>) outs(%y : memref<3xf32>) {
  ^bb0(%a: f32, %acc: f32):
    %s = arith.addf %a, %acc : f32
    linalg.yield %s : f32
  }
  return
}

// -----

// A reduction that fits whole: no loops; without a fill before it, the accumulator it reads is copied in.
// CHECK-LABEL: func.func @row_max(
// CHECK-SAME:      %[[X:.*]]: memref<16x128xf32>, %[[Y:.*]]: memref<16xf32>)
// CHECK-NEXT:    %[[X0:.*]] = memref.alloc() {alignment = 32 : i64} : memref<16x128xf32, 1>
// CHECK-NEXT:    %[[Y0:.*]] = memref.alloc() {alignment = 32 : i64} : memref<16xf32, 1>
// CHECK-NEXT:    linalg.copy {pbsdk.dma = "dram->spm"} ins(%[[X]] : memref<16x128xf32>) outs(%[[X0]] : memref<16x128xf32, 1>)
// CHECK-NEXT:    linalg.copy {pbsdk.dma = "dram->spm"} ins(%[[Y]] : memref<16xf32>) outs(%[[Y0]] : memref<16xf32, 1>)
// CHECK-NEXT:    linalg.generic {{.*}} ins(%[[X0]] : memref<16x128xf32, 1>) outs(%[[Y0]] : memref<16xf32, 1>) attrs = {pbsdk.compute = "vector"} {
// CHECK:           arith.maximumf
// CHECK:         linalg.copy {pbsdk.dma = "spm->dram"} ins(%[[Y0]] : memref<16xf32, 1>) outs(%[[Y]] : memref<16xf32>)
// CHECK-NOT:     scf.for
#x = affine_map<(d0, d1) -> (d0, d1)>
#r = affine_map<(d0, d1) -> (d0)>
func.func @row_max(%x: memref<16x128xf32>, %y: memref<16xf32>) {
  linalg.generic {indexing_maps = [#x, #r], iterator_types = ["parallel", "reduction"]}
      ins(%x : memref<16x128xf32>) outs(%y : memref<16xf32>) {
  ^bb0(%a: f32, %acc: f32):
    %s = arith.maximumf %a, %acc : f32
    linalg.yield %s : f32
  }
  return
}

// -----

// An f16 convolution (NHWC x HWCF -> NHWF, 3x3 taps) as an implicit GEMM on the matrix unit: output
// columns (16) are the unit's m, output channels (16) its n, input channels (32) its k. The operands fit
// whole; around the unit-sized pieces loop the output rows, the taps and the input-channel blocks of 16.
// Each piece is a 16x16x16 linalg.generic on 2-D views of the buffers, marked with the unit.
// CHECK-LABEL: func.func @conv(
// CHECK-SAME:      %[[I:.*]]: memref<1x10x18x32xf16>, %[[W:.*]]: memref<3x3x32x16xf16>, %[[O:.*]]: memref<1x8x16x16xf32>)
// CHECK-DAG:     %[[C16:.*]] = arith.constant 16 : index
// CHECK-DAG:     %[[C32:.*]] = arith.constant 32 : index
// CHECK-DAG:     %[[C3:.*]] = arith.constant 3 : index
// CHECK-DAG:     %[[C8:.*]] = arith.constant 8 : index
// CHECK:         %[[IB:.*]] = memref.alloc() {alignment = 32 : i64} : memref<1x10x18x32xf16, 1>
// CHECK-NEXT:    %[[WB:.*]] = memref.alloc() {alignment = 32 : i64} : memref<3x3x32x16xf16, 1>
// CHECK-NEXT:    %[[OB:.*]] = memref.alloc() {alignment = 32 : i64} : memref<1x8x16x16xf32, 1>
// CHECK-NEXT:    linalg.copy {pbsdk.dma = "dram->spm"} ins(%[[I]] : {{.*}}) outs(%[[IB]] : {{.*}})
// CHECK-NEXT:    linalg.copy {pbsdk.dma = "dram->spm"} ins(%[[W]] : {{.*}}) outs(%[[WB]] : {{.*}})
// CHECK-NEXT:    linalg.copy {pbsdk.dma = "dram->spm"} ins(%[[O]] : {{.*}}) outs(%[[OB]] : {{.*}})
// CHECK-NEXT:    scf.for %[[OH:.*]] = %{{.*}} to %[[C8]] step
// CHECK-NEXT:      scf.for %[[KH:.*]] = %{{.*}} to %[[C3]] step
// CHECK-NEXT:        scf.for %[[KW:.*]] = %{{.*}} to %[[C3]] step
// CHECK-NEXT:          scf.for %[[CB:.*]] = %{{.*}} to %[[C32]] step %[[C16]] {
// CHECK-NEXT:            %[[ROW:.*]] = affine.apply #{{.*}}(%[[OH]], %[[KH]])
// CHECK-NEXT:            %[[XP:.*]] = memref.subview %[[IB]][0, %[[ROW]], %[[KW]], %[[CB]]] [1, 1, 16, 16] [1, 1, 1, 1] : {{.*}} to memref<16x16xf16, strided<[32, 1], offset: ?>, 1>
// CHECK-NEXT:            %[[WP:.*]] = memref.subview %[[WB]][%[[KH]], %[[KW]], %[[CB]], 0] [1, 1, 16, 16] [1, 1, 1, 1] : {{.*}} to memref<16x16xf16, strided<[16, 1], offset: ?>, 1>
// CHECK-NEXT:            %[[OP:.*]] = memref.subview %[[OB]][0, %[[OH]], 0, 0] [1, 1, 16, 16] [1, 1, 1, 1] : {{.*}} to memref<16x16xf32, strided<[16, 1], offset: ?>, 1>
// CHECK-NEXT:            linalg.generic {{{.*}}iterator_types = ["parallel", "parallel", "reduction"]} ins(%[[XP]], %[[WP]] : {{.*}}) outs(%[[OP]] : {{.*}}) attrs = {pbsdk.matrix_unit = "mac16", pbsdk.unit_accumulator = "f32", pbsdk.unit_operand = "f16"} {
// CHECK-NOT:     pbsdk.compute
// CHECK:         linalg.copy {pbsdk.dma = "spm->dram"} ins(%[[OB]] : {{.*}}) outs(%[[O]] : {{.*}})
#in = affine_map<(n, oh, ow, f, kh, kw, c) -> (n, oh + kh, ow + kw, c)>
#w = affine_map<(n, oh, ow, f, kh, kw, c) -> (kh, kw, c, f)>
#o = affine_map<(n, oh, ow, f, kh, kw, c) -> (n, oh, ow, f)>
func.func @conv(%i: memref<1x10x18x32xf16>, %w: memref<3x3x32x16xf16>, %o: memref<1x8x16x16xf32>) {
  linalg.generic {indexing_maps = [#in, #w, #o],
                  iterator_types = ["parallel", "parallel", "parallel", "parallel", "reduction", "reduction", "reduction"]}
      ins(%i, %w : memref<1x10x18x32xf16>, memref<3x3x32x16xf16>) outs(%o : memref<1x8x16x16xf32>) {
  ^bb0(%a: f16, %b: f16, %acc: f32):
    %ae = arith.extf %a : f16 to f32
    %be = arith.extf %b : f16 to f32
    %p = arith.mulf %ae, %be : f32
    %s = arith.addf %acc, %p : f32
    linalg.yield %s : f32
  }
  return
}

// -----

// A depthwise convolution reduces over the kernel taps alone (one input channel per output channel): it
// would fill one row of each unit instruction, so it stays one vector op on the buffers.
// CHECK-LABEL: func.func @depthwise(
// CHECK-SAME:      %[[I:.*]]: memref<1x10x10x32xf16>, %[[W:.*]]: memref<3x3x32xf16>, %[[O:.*]]: memref<1x8x8x32xf32>)
// CHECK-NEXT:    %[[IB:.*]] = memref.alloc() {alignment = 32 : i64} : memref<1x10x10x32xf16, 1>
// CHECK-NEXT:    %[[WB:.*]] = memref.alloc() {alignment = 32 : i64} : memref<3x3x32xf16, 1>
// CHECK-NEXT:    %[[OB:.*]] = memref.alloc() {alignment = 32 : i64} : memref<1x8x8x32xf32, 1>
// CHECK-NEXT:    linalg.copy {pbsdk.dma = "dram->spm"} ins(%[[I]] : {{.*}}) outs(%[[IB]] : {{.*}})
// CHECK-NEXT:    linalg.copy {pbsdk.dma = "dram->spm"} ins(%[[W]] : {{.*}}) outs(%[[WB]] : {{.*}})
// CHECK-NEXT:    linalg.copy {pbsdk.dma = "dram->spm"} ins(%[[O]] : {{.*}}) outs(%[[OB]] : {{.*}})
// CHECK-NEXT:    linalg.generic {{.*}} ins(%[[IB]], %[[WB]] : {{.*}}) outs(%[[OB]] : {{.*}}) attrs = {pbsdk.compute = "vector"} {
// CHECK-NOT:     pbsdk.matrix_unit
// CHECK:         linalg.copy {pbsdk.dma = "spm->dram"} ins(%[[OB]] : {{.*}}) outs(%[[O]] : {{.*}})
#in = affine_map<(n, oh, ow, c, kh, kw) -> (n, oh + kh, ow + kw, c)>
#w = affine_map<(n, oh, ow, c, kh, kw) -> (kh, kw, c)>
#o = affine_map<(n, oh, ow, c, kh, kw) -> (n, oh, ow, c)>
func.func @depthwise(%i: memref<1x10x10x32xf16>, %w: memref<3x3x32xf16>, %o: memref<1x8x8x32xf32>) {
  linalg.generic {indexing_maps = [#in, #w, #o],
                  iterator_types = ["parallel", "parallel", "parallel", "parallel", "reduction", "reduction"]}
      ins(%i, %w : memref<1x10x10x32xf16>, memref<3x3x32xf16>) outs(%o : memref<1x8x8x32xf32>) {
  ^bb0(%a: f16, %b: f16, %acc: f32):
    %ae = arith.extf %a : f16 to f32
    %be = arith.extf %b : f16 to f32
    %p = arith.mulf %ae, %be : f32
    %s = arith.addf %acc, %p : f32
    linalg.yield %s : f32
  }
  return
}

// -----

// A fill on its own: filled in the scratchpad (nothing to copy in), copied out.
// CHECK-LABEL: func.func @zeros(
// CHECK-SAME:      %[[O:.*]]: memref<64x64xf32>)
// CHECK-NOT:     dram->spm
// CHECK:         %[[B:.*]] = memref.alloc() {alignment = 32 : i64} : memref<64x64xf32, 1>
// CHECK-NEXT:    linalg.generic {{.*}} ins(%{{.*}} : f32) outs(%[[B]] : memref<64x64xf32, 1>) attrs = {pbsdk.compute = "vector"} {
// CHECK:         linalg.copy {pbsdk.dma = "spm->dram"} ins(%[[B]] : memref<64x64xf32, 1>) outs(%[[O]] : memref<64x64xf32>)
// What the pass cannot stage stays as it is: a body reading linalg.index, a dynamic shape.
// CHECK-LABEL: func.func @iota(
// CHECK-NEXT:    linalg.generic {{.*}} outs(%{{.*}} : memref<64xf32>) {
// CHECK-NOT:     pbsdk.
// CHECK-LABEL: func.func @dynamic(
// CHECK-NEXT:    linalg.generic {{.*}} ins(%{{.*}} : memref<?x64xf32>) outs(%{{.*}} : memref<?x64xf32>) {
// CHECK-NOT:     pbsdk.
// CHECK-NOT:     memref.alloc
#s = affine_map<(d0, d1) -> ()>
#x = affine_map<(d0, d1) -> (d0, d1)>
#v = affine_map<(d0) -> (d0)>
func.func @zeros(%o: memref<64x64xf32>) {
  %zero = arith.constant 0.0 : f32
  linalg.generic {indexing_maps = [#s, #x], iterator_types = ["parallel", "parallel"]}
      ins(%zero : f32) outs(%o : memref<64x64xf32>) {
  ^bb0(%v: f32, %out: f32):
    linalg.yield %v : f32
  }
  return
}
func.func @iota(%o: memref<64xf32>) {
  linalg.generic {indexing_maps = [#v], iterator_types = ["parallel"]} outs(%o : memref<64xf32>) {
  ^bb0(%out: f32):
    %i = linalg.index 0 : index
    %j = arith.index_cast %i : index to i32
    %f = arith.sitofp %j : i32 to f32
    linalg.yield %f : f32
  }
  return
}
func.func @dynamic(%a: memref<?x64xf32>, %o: memref<?x64xf32>) {
  linalg.generic {indexing_maps = [#x, #x], iterator_types = ["parallel", "parallel"]}
      ins(%a : memref<?x64xf32>) outs(%o : memref<?x64xf32>) {
  ^bb0(%v: f32, %out: f32):
    %n = arith.negf %v : f32
    linalg.yield %n : f32
  }
  return
}
