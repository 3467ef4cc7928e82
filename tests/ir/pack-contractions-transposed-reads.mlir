// Pass pack-contractions on matmuls whose operand a linalg.transpose fills just for them (x @ w.T with a w
// that is not a constant, q @ k^T): the kernel reads the transpose's source, B stored [n, k] through
// 16 x 16 register transposes, A stored [k, m] a row at a time, and the transpose and its buffer go. In
// the matmul's own function, and in an isolated contraction function whose every call passes such a
// buffer (the argument takes the source's type). Rejected (the transpose stays): a source that an op
// between the transpose and the matmul may write, a buffer read by something else, a permutation that
// is not the last two dimensions swapped, call sites that do not all pass one.
// RUN: %pbsdk opt %s --split-input-file --target cpu --spec intel/xeon-avx512 -p pack-contractions \
// RUN:   --options threads=1 transpose_gemm=false | filecheck %s
// RUN: %pbsdk opt %s --split-input-file --target cpu --spec intel/xeon-avx512 -p pack-contractions \
// RUN:   --options threads=1 transposed_reads=false | filecheck %s --check-prefix=OFF

// CHECK-LABEL: func.func @x_wt(
// CHECK-SAME:      %[[X:.*]]: memref<256x128xf32>, %[[W:.*]]: memref<512x128xf32>, %[[C:.*]]: memref<256x512xf32>)
// CHECK-NOT:     linalg.transpose
// CHECK-NOT:     memref.alloc
// CHECK:         call @__pbsdk_mm0(%[[X]], %[[W]], %[[C]])
// CHECK-LABEL: func.func @__pbsdk_mm0_part(
// CHECK-SAME:      %{{[^:]*}}: memref<256x128xf32>, %[[PW:[^:]*]]: memref<512x128xf32>, %{{[^:]*}}: memref<256x512xf32>, %{{.*}}: index)
// CHECK:         memref.extract_aligned_pointer_as_index %[[PW]]
// CHECK:         vector.maskedload %[[PW]]
// CHECK:         vector.shuffle
// CHECK:         vector.fma
// OFF-LABEL: func.func @x_wt(
// OFF:         linalg.transpose
// OFF:         call @__pbsdk_mm0(
func.func @x_wt(%x: memref<256x128xf32>, %w: memref<512x128xf32>, %c: memref<256x512xf32>) {
  %zero = arith.constant 0.0 : f32
  %t = memref.alloc() {alignment = 64 : i64} : memref<128x512xf32>
  linalg.transpose ins(%w : memref<512x128xf32>) outs(%t : memref<128x512xf32>) permutation = [1, 0]
  linalg.fill ins(%zero : f32) outs(%c : memref<256x512xf32>)
  linalg.matmul ins(%x, %t : memref<256x128xf32>, memref<128x512xf32>) outs(%c : memref<256x512xf32>)
  memref.dealloc %t : memref<128x512xf32>
  return
}

// -----

// A stored [k, m] (a.T @ b) in an isolated contraction function called twice (identical layers after
// dedupe-functions): the function's A argument takes the source's type, both calls pass their source.
// CHECK-LABEL: func.func @at_b(
// CHECK-SAME:      %[[A1:.*]]: memref<64x96xf32>, %[[A2:.*]]: memref<64x96xf32>, %[[B:.*]]: memref<64x80xf32>
// CHECK-NOT:     linalg.transpose
// CHECK:         call @__pbsdk_contraction0(%[[A1]], %[[B]], %{{.*}}) : (memref<64x96xf32>,
// CHECK-NOT:     linalg.transpose
// CHECK:         call @__pbsdk_contraction0(%[[A2]], %[[B]], %{{.*}}) : (memref<64x96xf32>,
// CHECK-LABEL: func.func private @__pbsdk_contraction0(
// CHECK-SAME:      %[[FA:.*]]: memref<64x96xf32>, %[[FB:.*]]: memref<64x80xf32>, %[[FC:.*]]: memref<96x80xf32>)
// CHECK:         call @__pbsdk_mm0(%[[FA]], %[[FB]], %[[FC]])
// OFF-LABEL: func.func @at_b(
// OFF:         linalg.transpose
// OFF:         linalg.transpose
func.func @at_b(%a1: memref<64x96xf32>, %a2: memref<64x96xf32>, %b: memref<64x80xf32>, %c1: memref<96x80xf32>,
                %c2: memref<96x80xf32>) {
  %t1 = memref.alloc() : memref<96x64xf32>
  linalg.transpose ins(%a1 : memref<64x96xf32>) outs(%t1 : memref<96x64xf32>) permutation = [1, 0]
  call @__pbsdk_contraction0(%t1, %b, %c1) : (memref<96x64xf32>, memref<64x80xf32>, memref<96x80xf32>) -> ()
  memref.dealloc %t1 : memref<96x64xf32>
  %t2 = memref.alloc() : memref<96x64xf32>
  linalg.transpose ins(%a2 : memref<64x96xf32>) outs(%t2 : memref<96x64xf32>) permutation = [1, 0]
  call @__pbsdk_contraction0(%t2, %b, %c2) : (memref<96x64xf32>, memref<64x80xf32>, memref<96x80xf32>) -> ()
  memref.dealloc %t2 : memref<96x64xf32>
  return
}
func.func private @__pbsdk_contraction0(%a: memref<96x64xf32>, %b: memref<64x80xf32>, %c: memref<96x80xf32>) {
  %zero = arith.constant 0.0 : f32
  linalg.fill ins(%zero : f32) outs(%c : memref<96x80xf32>)
  linalg.matmul ins(%a, %b : memref<96x64xf32>, memref<64x80xf32>) outs(%c : memref<96x80xf32>)
  return
}

// -----

// Batched q @ k^T: the transpose swaps the last two of three dimensions.
// CHECK-LABEL: func.func @q_kt(
// CHECK-SAME:      %[[Q:.*]]: memref<4x64x32xf32>, %[[K:.*]]: memref<4x48x32xf32>, %[[S:.*]]: memref<4x64x48xf32>)
// CHECK-NOT:     linalg.transpose
// CHECK:         call @__pbsdk_mm0(%[[Q]], %[[K]], %[[S]])
func.func @q_kt(%q: memref<4x64x32xf32>, %k: memref<4x48x32xf32>, %s: memref<4x64x48xf32>) {
  %zero = arith.constant 0.0 : f32
  %t = memref.alloc() : memref<4x32x48xf32>
  linalg.transpose ins(%k : memref<4x48x32xf32>) outs(%t : memref<4x32x48xf32>) permutation = [0, 2, 1]
  linalg.fill ins(%zero : f32) outs(%s : memref<4x64x48xf32>)
  linalg.batch_matmul ins(%q, %t : memref<4x64x32xf32>, memref<4x32x48xf32>) outs(%s : memref<4x64x48xf32>)
  memref.dealloc %t : memref<4x32x48xf32>
  return
}

// -----

// A 4-D batch (b, h, s, d): the transposed buffer reaches the batched matmul through a collapse of its
// batch dimensions; the kernel reads the same collapse of the source.
// CHECK-LABEL: func.func @q_kt_4d(
// CHECK-SAME:      %[[Q:.*]]: memref<6x64x32xf32>, %[[K:.*]]: memref<2x3x48x32xf32>, %[[S:.*]]: memref<6x64x48xf32>)
// CHECK-NOT:     linalg.transpose
// CHECK:         %[[KV:.*]] = memref.collapse_shape %[[K]] {{\[}}[0, 1], [2], [3]] : memref<2x3x48x32xf32> into memref<6x48x32xf32>
// CHECK:         call @__pbsdk_mm0(%[[Q]], %[[KV]], %[[S]])
func.func @q_kt_4d(%q: memref<6x64x32xf32>, %k: memref<2x3x48x32xf32>, %s: memref<6x64x48xf32>) {
  %zero = arith.constant 0.0 : f32
  %t = memref.alloc() : memref<2x3x32x48xf32>
  linalg.transpose ins(%k : memref<2x3x48x32xf32>) outs(%t : memref<2x3x32x48xf32>) permutation = [0, 1, 3, 2]
  %tv = memref.collapse_shape %t [[0, 1], [2], [3]] : memref<2x3x32x48xf32> into memref<6x32x48xf32>
  linalg.fill ins(%zero : f32) outs(%s : memref<6x64x48xf32>)
  linalg.batch_matmul ins(%q, %tv : memref<6x64x32xf32>, memref<6x32x48xf32>) outs(%s : memref<6x64x48xf32>)
  memref.dealloc %t : memref<2x3x32x48xf32>
  return
}

// -----

// Reject: the source is written between the transpose and the matmul (the product must see the old w),
// and read between them by a linalg op that takes it as an input (fine on its own).
// CHECK-LABEL: func.func @written_between(
// CHECK:         linalg.transpose
// CHECK:         linalg.generic
// CHECK:         call @__pbsdk_mm0(%{{.*}}, %{{.*}}, %{{.*}})
// CHECK-LABEL: func.func @read_between(
// CHECK-NOT:     linalg.transpose
// CHECK:         call @__pbsdk_mm1(
#id = affine_map<(d0, d1) -> (d0, d1)>
func.func @written_between(%x: memref<64x32xf32>, %w: memref<48x32xf32>, %c: memref<64x48xf32>) {
  %t = memref.alloc() : memref<32x48xf32>
  linalg.transpose ins(%w : memref<48x32xf32>) outs(%t : memref<32x48xf32>) permutation = [1, 0]
  linalg.generic {indexing_maps = [#id], iterator_types = ["parallel", "parallel"]} outs(%w : memref<48x32xf32>) {
  ^bb0(%o: f32):
    %two = arith.constant 2.0 : f32
    linalg.yield %two : f32
  }
  linalg.matmul ins(%x, %t : memref<64x32xf32>, memref<32x48xf32>) outs(%c : memref<64x48xf32>)
  memref.dealloc %t : memref<32x48xf32>
  return
}
func.func @read_between(%x: memref<64x32xf32>, %w: memref<48x32xf32>, %c: memref<64x48xf32>, %d: memref<48x32xf32>) {
  %t = memref.alloc() : memref<32x48xf32>
  linalg.transpose ins(%w : memref<48x32xf32>) outs(%t : memref<32x48xf32>) permutation = [1, 0]
  linalg.copy ins(%w : memref<48x32xf32>) outs(%d : memref<48x32xf32>)
  linalg.matmul ins(%x, %t : memref<64x32xf32>, memref<32x48xf32>) outs(%c : memref<64x48xf32>)
  memref.dealloc %t : memref<32x48xf32>
  return
}

// -----

// Reject: the transposed buffer is read again after the matmul; a permutation that moves the batch; a
// product that writes its output into the source's own buffer (the kernel would read what it overwrites).
// CHECK-LABEL: func.func @read_again(
// CHECK:         linalg.transpose
// CHECK:         call @__pbsdk_mm0(
// CHECK:         linalg.copy
// CHECK-LABEL: func.func @output_is_the_source(
// CHECK:         linalg.transpose
// CHECK:         call @__pbsdk_mm1(
// CHECK-LABEL: func.func @batch_moved(
// CHECK:         linalg.transpose
// CHECK:         call @__pbsdk_mm2(
func.func @read_again(%x: memref<64x32xf32>, %w: memref<48x32xf32>, %c: memref<64x48xf32>, %d: memref<32x48xf32>) {
  %t = memref.alloc() : memref<32x48xf32>
  linalg.transpose ins(%w : memref<48x32xf32>) outs(%t : memref<32x48xf32>) permutation = [1, 0]
  linalg.matmul ins(%x, %t : memref<64x32xf32>, memref<32x48xf32>) outs(%c : memref<64x48xf32>)
  linalg.copy ins(%t : memref<32x48xf32>) outs(%d : memref<32x48xf32>)
  memref.dealloc %t : memref<32x48xf32>
  return
}
func.func @output_is_the_source(%x: memref<48x48xf32>, %w: memref<48x48xf32>) {
  %t = memref.alloc() : memref<48x48xf32>
  linalg.transpose ins(%w : memref<48x48xf32>) outs(%t : memref<48x48xf32>) permutation = [1, 0]
  linalg.matmul ins(%x, %t : memref<48x48xf32>, memref<48x48xf32>) outs(%w : memref<48x48xf32>)
  memref.dealloc %t : memref<48x48xf32>
  return
}
func.func @batch_moved(%q: memref<4x64x32xf32>, %k: memref<32x4x48xf32>, %s: memref<4x64x48xf32>) {
  %t = memref.alloc() : memref<4x32x48xf32>
  linalg.transpose ins(%k : memref<32x4x48xf32>) outs(%t : memref<4x32x48xf32>) permutation = [1, 0, 2]
  linalg.batch_matmul ins(%q, %t : memref<4x64x32xf32>, memref<4x32x48xf32>) outs(%s : memref<4x64x48xf32>)
  memref.dealloc %t : memref<4x32x48xf32>
  return
}

// -----

// Reject: one call of the contraction function passes a transposed buffer, the other a plain matrix.
// CHECK-LABEL: func.func @mixed_calls(
// CHECK:         linalg.transpose
// CHECK-LABEL: func.func private @__pbsdk_contraction0(
// CHECK-SAME:      memref<48x32xf32>
func.func @mixed_calls(%x: memref<64x48xf32>, %w: memref<32x48xf32>, %v: memref<48x32xf32>, %c1: memref<64x32xf32>,
                       %c2: memref<64x32xf32>) {
  %t = memref.alloc() : memref<48x32xf32>
  linalg.transpose ins(%w : memref<32x48xf32>) outs(%t : memref<48x32xf32>) permutation = [1, 0]
  call @__pbsdk_contraction0(%x, %t, %c1) : (memref<64x48xf32>, memref<48x32xf32>, memref<64x32xf32>) -> ()
  call @__pbsdk_contraction0(%x, %v, %c2) : (memref<64x48xf32>, memref<48x32xf32>, memref<64x32xf32>) -> ()
  memref.dealloc %t : memref<48x32xf32>
  return
}
func.func private @__pbsdk_contraction0(%a: memref<64x48xf32>, %b: memref<48x32xf32>, %c: memref<64x32xf32>) {
  linalg.matmul ins(%a, %b : memref<64x48xf32>, memref<48x32xf32>) outs(%c : memref<64x32xf32>)
  return
}
