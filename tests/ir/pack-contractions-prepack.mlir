// Pass pack-contractions on constant B operands (frozen weights: entry arguments marked pbsdk.constant),
// and on constant A operands of products computed transposed (last case):
// each one read by a single packed contraction is packed at compile time into the kernel's micro-panels,
// [ceil(n/nr), k, nr], and the argument takes that type; the kernel then packs no B at run time (nor A
// here: 64 columns are two register tiles, so A is read in place and the kernel allocates nothing). `pbsdk opt` gives text constants zeros of their type, so the rewrite shows here.
// RUN: %pbsdk opt %s --split-input-file --target cpu --spec intel/xeon-avx512 -p pack-contractions | filecheck %s
// RUN: %pbsdk opt %s --split-input-file --target cpu --spec intel/xeon-avx512 -p pack-contractions \
// RUN:   --options prepack_b=false | filecheck %s --check-prefix=OFF

// Two layers share one contraction function (as dedupe-functions leaves them): every call passes a
// constant, so the function's parameter and both constants take the packed type.
// CHECK-LABEL: func.func @layers(
// CHECK-SAME:      %{{.*}}: memref<20x64xf32>, %[[W0:.*]]: memref<2x64x32xf32> {pbsdk.constant = 0 : i64}, %[[W1:.*]]: memref<2x64x32xf32> {pbsdk.constant = 1 : i64}
// CHECK:         call @__pbsdk_contraction0(%{{.*}}, %[[W0]], %{{.*}}) : (memref<20x64xf32>, memref<2x64x32xf32>, memref<20x64xf32>) -> ()
// CHECK:         call @__pbsdk_contraction0(%{{.*}}, %[[W1]], %{{.*}}) : (memref<20x64xf32>, memref<2x64x32xf32>, memref<20x64xf32>) -> ()
// CHECK-LABEL: func.func private @__pbsdk_contraction0(
// CHECK-SAME:      %{{.*}}: memref<2x64x32xf32>
// CHECK:         call @__pbsdk_mm0(
// CHECK-LABEL: func.func @__pbsdk_mm0_part(
// CHECK-SAME:      %[[B:[^:]*]]: memref<2x64x32xf32>
// CHECK-NOT:     memref.alloc
// CHECK:         vector.load %[[B]][%{{.*}}, %{{.*}}, %{{.*}}] : memref<2x64x32xf32>, vector<16xf32>
// CHECK-NOT:     memref.alloc
// CHECK:         return
// OFF-LABEL: func.func @layers(
// OFF-SAME:      memref<64x64xf32> {pbsdk.constant = 0 : i64}
// OFF-LABEL: func.func @__pbsdk_mm0_part(
// OFF:           memref.alloc() {alignment = 64 : i64} : memref<2x64x32xf32>
func.func @layers(%x: memref<20x64xf32>, %w0: memref<64x64xf32> {pbsdk.constant = 0 : i64},
                  %w1: memref<64x64xf32> {pbsdk.constant = 1 : i64}, %out: memref<20x64xf32>) {
  %t = memref.alloc() : memref<20x64xf32>
  call @__pbsdk_contraction0(%x, %w0, %t) : (memref<20x64xf32>, memref<64x64xf32>, memref<20x64xf32>) -> ()
  call @__pbsdk_contraction0(%t, %w1, %out) : (memref<20x64xf32>, memref<64x64xf32>, memref<20x64xf32>) -> ()
  memref.dealloc %t : memref<20x64xf32>
  return
}
func.func private @__pbsdk_contraction0(%a: memref<20x64xf32>, %b: memref<64x64xf32>, %c: memref<20x64xf32>) {
  %zero = arith.constant 0.0 : f32
  linalg.fill ins(%zero : f32) outs(%c : memref<20x64xf32>)
  linalg.matmul ins(%a, %b : memref<20x64xf32>, memref<64x64xf32>) outs(%c : memref<20x64xf32>)
  return
}

// -----

// Convolution weights (KH, KW, C, O) viewed as a (KH*KW*C, O) matrix: the view goes, the constant is
// packed whole: the plan's register tile is 48 columns wide, so the 40 columns make one panel,
// zero-padded past column 40.
// CHECK-LABEL: func.func @conv_weights(
// CHECK-SAME:      %{{.*}}: memref<16x72xf32>, %[[W:.*]]: memref<1x72x48xf32> {pbsdk.constant = 0 : i64}
// CHECK-NOT:     memref.collapse_shape
// CHECK:         call @__pbsdk_mm0(%{{.*}}, %[[W]], %{{.*}})
func.func @conv_weights(%a: memref<16x72xf32>, %w: memref<3x3x8x40xf32> {pbsdk.constant = 0 : i64},
                        %c: memref<16x40xf32>) {
  %b = memref.collapse_shape %w [[0, 1, 2], [3]] : memref<3x3x8x40xf32> into memref<72x40xf32>
  linalg.matmul ins(%a, %b : memref<16x72xf32>, memref<72x40xf32>) outs(%c : memref<16x40xf32>)
  return
}

// -----

// Rejected: a constant something else reads too, and a function one of whose calls passes a value
// computed at run time. Both stay unpacked (and the kernel packs B as it runs).
// CHECK-LABEL: func.func @shared(
// CHECK-SAME:      memref<64x64xf32> {pbsdk.constant = 0 : i64}
// CHECK-SAME:      memref<64x64xf32> {pbsdk.constant = 1 : i64}
// CHECK:         memref.copy
// CHECK-LABEL: func.func private @__pbsdk_contraction0(
// CHECK-SAME:      memref<64x64xf32>
func.func @shared(%x: memref<20x64xf32>, %w0: memref<64x64xf32> {pbsdk.constant = 0 : i64},
                  %w1: memref<64x64xf32> {pbsdk.constant = 1 : i64}, %out: memref<20x64xf32>,
                  %seen: memref<64x64xf32>) {
  %t = memref.alloc() : memref<20x64xf32>
  %r = memref.alloc() : memref<64x64xf32>
  memref.copy %w1, %seen : memref<64x64xf32> to memref<64x64xf32>
  call @__pbsdk_contraction0(%x, %w0, %t) : (memref<20x64xf32>, memref<64x64xf32>, memref<20x64xf32>) -> ()
  call @__pbsdk_contraction0(%t, %r, %out) : (memref<20x64xf32>, memref<64x64xf32>, memref<20x64xf32>) -> ()
  call @__pbsdk_contraction1(%t, %w1, %out) : (memref<20x64xf32>, memref<64x64xf32>, memref<20x64xf32>) -> ()
  memref.dealloc %t : memref<20x64xf32>
  memref.dealloc %r : memref<64x64xf32>
  return
}
func.func private @__pbsdk_contraction0(%a: memref<20x64xf32>, %b: memref<64x64xf32>, %c: memref<20x64xf32>) {
  linalg.matmul ins(%a, %b : memref<20x64xf32>, memref<64x64xf32>) outs(%c : memref<20x64xf32>)
  return
}
func.func private @__pbsdk_contraction1(%a: memref<20x64xf32>, %b: memref<64x64xf32>, %c: memref<20x64xf32>) {
  linalg.matmul ins(%a, %b : memref<20x64xf32>, memref<64x64xf32>) outs(%c : memref<20x64xf32>)
  return
}

// -----

// A constant A (the (O, C, 1, 1) weights of a 1x1 NCHW convolution viewed as O x C) of a product the
// planner computes transposed (512 rows, 49 columns): the kernel's B is A^T, packed here as its panels,
// [ceil(512/32), 256, 32], instead of through register transposes on every call; the view goes.
// CHECK-LABEL: func.func @nchw_1x1(
// CHECK-SAME:      %[[X:[^:]*]]: memref<256x49xf32>, %[[W:[^:]*]]: memref<16x256x32xf32> {pbsdk.constant = 0 : i64}
// CHECK-NOT:     memref.collapse_shape
// CHECK:         call @__pbsdk_mm0(%[[X]], %[[W]], %{{.*}}) : (memref<256x49xf32>, memref<16x256x32xf32>, memref<512x49xf32>) -> ()
// CHECK-LABEL: func.func @__pbsdk_mm0_part(
// CHECK-SAME:      %{{[^:]*}}: memref<256x49xf32>, %[[PW:[^:]*]]: memref<16x256x32xf32>
// CHECK-NOT:     vector.shuffle {{.*}} [0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23]
// CHECK:         vector.load %[[PW]][%{{.*}}, %{{.*}}, %{{.*}}] : memref<16x256x32xf32>, vector<16xf32>
// CHECK:         return
// OFF-LABEL: func.func @nchw_1x1(
// OFF-SAME:      memref<512x256x1x1xf32> {pbsdk.constant = 0 : i64}
// OFF:           memref.collapse_shape
func.func @nchw_1x1(%x: memref<256x49xf32>, %w: memref<512x256x1x1xf32> {pbsdk.constant = 0 : i64},
                    %c: memref<512x49xf32>) {
  %a = memref.collapse_shape %w [[0], [1, 2, 3]] : memref<512x256x1x1xf32> into memref<512x256xf32>
  %zero = arith.constant 0.0 : f32
  linalg.fill ins(%zero : f32) outs(%c : memref<512x49xf32>)
  linalg.matmul ins(%a, %x : memref<512x256xf32>, memref<256x49xf32>) outs(%c : memref<512x49xf32>)
  return
}
