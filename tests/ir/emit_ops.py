# How pbsdk.ops programs are emitted as linalg on tensors.
# RUN: %python %s | filecheck %s
import numpy as np

import pbsdk
from pbsdk import ops

f32 = np.float32


def show(title, fn, *shapes, dtype=f32, options=None):
    print(f"// ----- {title}")
    print(pbsdk.jit(fn, options=options).lower(*[np.zeros(s, dtype) for s in shapes]))


# Broadcasting reads size-1 and missing dims with constant or dropped indices; scalars are splats.
show("broadcast", lambda a, b: a * b + 2.0, (3, 1, 5), (4, 1))
# CHECK-LABEL: ----- broadcast
# CHECK: #[[A:map[0-9]*]] = affine_map<(d0, d1, d2) -> (d0, 0, d2)>
# CHECK: #[[B:map[0-9]*]] = affine_map<(d0, d1, d2) -> (d1, 0)>
# CHECK: #[[SPLAT:map[0-9]*]] = affine_map<(d0, d1, d2) -> ()>
# CHECK: func.func @main(%arg0: tensor<3x1x5xf32>, %arg1: tensor<4x1xf32>) -> tensor<3x4x5xf32>
# CHECK: indexing_maps = [#[[A]], #[[B]], #{{map[0-9]*}}]
# CHECK: arith.mulf
# CHECK: arith.constant dense<2.0{{0*}}e+00> : tensor<f32>
# CHECK: indexing_maps = [#{{map[0-9]*}}, #[[SPLAT]], #{{map[0-9]*}}]
# CHECK: arith.addf

# Plain 2-D and equal-batch matmuls stay named ops (what the packed kernels take): a transposed operand is
# transposed first, batched rows times a matrix collapse into one matmul; only operands broadcast over
# the batch become a generic contraction that reads them in place.
show("matmul", lambda a, b: a @ b, (5, 7), (7, 3))
# CHECK-LABEL: ----- matmul
# CHECK: linalg.fill
# CHECK: linalg.matmul ins(%arg0, %arg1 : tensor<5x7xf32>, tensor<7x3xf32>)
show("matmul-bt", lambda a, b: ops.matmul(a, b, transpose_b=True), (2, 5, 7), (3, 7))
# CHECK-LABEL: ----- matmul-bt
# CHECK: tensor.collapse_shape %arg0 {{\[}}[0, 1], [2]] : tensor<2x5x7xf32> into tensor<10x7xf32>
# CHECK: linalg.transpose ins(%arg1 : tensor<3x7xf32>) outs(%{{.*}} : tensor<7x3xf32>) permutation = [1, 0]
# CHECK: linalg.matmul ins(%{{.*}}, %{{.*}} : tensor<10x7xf32>, tensor<7x3xf32>)
# CHECK: tensor.expand_shape %{{.*}} {{\[}}[0, 1], [2]] output_shape [2, 5, 3]
show("matmul-bcast", lambda a, b: a @ b, (1, 5, 7), (2, 7, 3))
# CHECK-LABEL: ----- matmul-bcast
# CHECK: #[[A:map[0-9]*]] = affine_map<(d0, d1, d2, d3) -> (0, d1, d3)>
# CHECK: #[[B:map[0-9]*]] = affine_map<(d0, d1, d2, d3) -> (d0, d3, d2)>
# CHECK: #[[C:map[0-9]*]] = affine_map<(d0, d1, d2, d3) -> (d0, d1, d2)>
# CHECK: indexing_maps = [#[[A]], #[[B]], #[[C]]]
# CHECK-SAME: iterator_types = ["parallel", "parallel", "parallel", "reduction"]

# f16 contractions accumulate in f32 and round once at the end.
show("matmul-f16", lambda a, b: a @ b, (4, 8), (8, 4), dtype=np.float16)
# CHECK-LABEL: ----- matmul-f16
# CHECK: linalg.matmul ins(%arg0, %arg1 : tensor<4x8xf16>, tensor<8x4xf16>) outs(%{{.*}} : tensor<4x4xf32>)
# CHECK: arith.truncf %{{.*}} : f32 to f16

# Reductions: a fill with the identity, then a generic with reduction iterators.
show("reduce", lambda a: ops.max(a, axis=(0, 2)), (3, 4, 5))
# CHECK-LABEL: ----- reduce
# CHECK: #[[IN:map[0-9]*]] = affine_map<(d0, d1, d2) -> (d0, d1, d2)>
# CHECK: #[[OUT:map[0-9]*]] = affine_map<(d0, d1, d2) -> (d1)>
# CHECK: arith.constant 0xFF800000 : f32
# CHECK: indexing_maps = [#[[IN]], #[[OUT]]]
# CHECK-SAME: iterator_types = ["reduction", "parallel", "reduction"]
# CHECK: arith.maximumf

# Grouped, strided, dilated, padded conv2d (on a spec with vector FMAs: `grouped_as_batch`, the direct route
# turned off; channels last across layers makes it an NHWC conv2d, its weights (KH, KW, CG, O)): the input to
# NHWC and padded, one strided slice per tap into the patches, rearranged to (groups, pixels, taps x
# channels); the weights to (groups, taps x channels, outputs); one batch_matmul; the result back to NCHW.
show("conv", lambda x, w: ops.conv2d(x, w, stride=2, padding=1, dilation=2, groups=2), (1, 4, 9, 9), (6, 2, 3, 3),
     options={"direct_conv": False})
# CHECK-LABEL: ----- conv
# CHECK: tensor.pad %{{.*}} low[0, 1, 1, 0] high[0, 1, 1, 0]
# CHECK-COUNT-9: tensor.insert_slice
# CHECK: linalg.transpose ins(%{{.*}} : tensor<1x4x4x3x3x2x2xf32>) outs(%{{.*}} : tensor<2x1x4x4x3x3x2xf32>) permutation = [5, 0, 1, 2, 3, 4, 6]
# CHECK: tensor.collapse_shape {{.*}} into tensor<2x16x18xf32>
# CHECK: linalg.transpose ins(%{{.*}} : tensor<3x3x2x2x3xf32>) outs(%{{.*}} : tensor<2x3x3x2x3xf32>) permutation = [3, 0, 1, 2, 4]
# CHECK: linalg.batch_matmul ins(%{{.*}}, %{{.*}} : tensor<2x16x18xf32>, tensor<2x18x3xf32>) outs(%{{.*}} : tensor<2x16x3xf32>)
# CHECK: tensor.collapse_shape {{.*}} into tensor<1x4x4x6xf32>
# CHECK: -> tensor<1x6x4x4xf32>

# The same conv2d where the planner finds a direct kernel cheaper (`direct_conv`, the default): the input
# transposed to NHWC straight into the interior of the zero-filled padded tensor, the weights to (KH, KW, CG,
# O), one generic with loops (n, oh, ow, g, o, kh, kw, c) over (N, Hp, Wp, G, CG) and (KH, KW, CG, G, OG)
# into (N, OH, OW, G, OG), the result back to NCHW.
show("conv_direct", lambda x, w: ops.conv2d(x, w, stride=2, padding=1, dilation=2, groups=2), (1, 4, 9, 9),
     (6, 2, 3, 3))
# CHECK-LABEL: ----- conv_direct
# CHECK: #[[X:map[0-9]*]] = affine_map<(d0, d1, d2, d3, d4, d5, d6, d7) -> (d0, d1 * 2 + d5 * 2, d2 * 2 + d6 * 2, d3, d7)>
# CHECK: #[[W:map[0-9]*]] = affine_map<(d0, d1, d2, d3, d4, d5, d6, d7) -> (d5, d6, d7, d3, d4)>
# CHECK: #[[O:map[0-9]*]] = affine_map<(d0, d1, d2, d3, d4, d5, d6, d7) -> (d0, d1, d2, d3, d4)>
# CHECK-NOT: tensor.pad
# CHECK: tensor.extract_slice %{{.*}}[0, 1, 1, 0] [1, 9, 9, 4] [1, 1, 1, 1] : tensor<1x11x11x4xf32> to tensor<1x9x9x4xf32>
# CHECK: tensor.insert_slice %{{.*}} into %{{.*}}[0, 1, 1, 0] [1, 9, 9, 4] [1, 1, 1, 1] : tensor<1x9x9x4xf32> into tensor<1x11x11x4xf32>
# CHECK: tensor.expand_shape {{.*}} : tensor<1x11x11x4xf32> into tensor<1x11x11x2x2xf32>
# CHECK: tensor.expand_shape {{.*}} : tensor<3x3x2x6xf32> into tensor<3x3x2x2x3xf32>
# CHECK: linalg.generic {indexing_maps = [#[[X]], #[[W]], #[[O]]], iterator_types = ["parallel", "parallel", "parallel", "parallel", "parallel", "reduction", "reduction", "reduction"]}
# CHECK-SAME: outs(%{{.*}} : tensor<1x4x4x2x3xf32>)
# CHECK: tensor.collapse_shape {{.*}} into tensor<1x4x4x6xf32>
# CHECK-NOT: batch_matmul

# A patch embedding (stride = kernel, 17x17 = 289 taps > PATCHIFY_TAPS): its patches are the input's covered
# extent (38x55 -> 34x51) split into (patch, row in patch) x (patch, column in patch) and one transpose, not
# 289 slices inserted one by one (whose bufferization took minutes for CLIP's 32x32 patches).
show("conv_patchify", lambda x, w: ops.conv2d(x, w, stride=17), (2, 3, 38, 55), (8, 3, 17, 17),
     options={"direct_conv": False})
# CHECK-LABEL: ----- conv_patchify
# CHECK-NOT: tensor.insert_slice
# CHECK: tensor.extract_slice %arg0[0, 0, 0, 0] [2, 3, 34, 51] [1, 1, 1, 1] : tensor<2x3x38x55xf32> to tensor<2x3x34x51xf32>
# CHECK: tensor.expand_shape {{.*}} {{\[}}[0], [1], [2, 3], [4, 5]] output_shape [2, 3, 2, 17, 3, 17]
# CHECK: linalg.transpose ins(%{{.*}} : tensor<2x3x2x17x3x17xf32>) outs(%{{.*}} : tensor<2x3x17x17x2x3xf32>) permutation = [0, 1, 3, 5, 2, 4]
# CHECK-NOT: tensor.insert_slice
# CHECK: linalg.batch_matmul
# CHECK-NOT: tensor.insert_slice

# A 16x16 one (256 taps, not more than PATCHIFY_TAPS) keeps one strided slice per tap (a target reads them in
# place).
show("conv_patch_taps", lambda x, w: ops.conv2d(x, w, stride=16), (1, 3, 32, 32), (8, 3, 16, 16),
     options={"direct_conv": False})
# CHECK-LABEL: ----- conv_patch_taps
# CHECK-COUNT-256: tensor.insert_slice
# CHECK-NOT: tensor.insert_slice
# CHECK: linalg.matmul

# Layout ops: transpose is linalg.transpose; reshape is a collapse and an expand (views after bufferization).
show("layout", lambda a: ops.reshape(ops.transpose(a, (1, 0, 2)), (4, -1)), (3, 4, 5))
# CHECK-LABEL: ----- layout
# CHECK: linalg.transpose ins(%arg0 : tensor<3x4x5xf32>) outs(%{{.*}} : tensor<4x3x5xf32>) permutation = [1, 0, 2]
# CHECK: tensor.collapse_shape {{.*}} {{\[\[}}0, 1, 2]] : tensor<4x3x5xf32> into tensor<60xf32>
# CHECK: tensor.expand_shape {{.*}} {{\[\[}}0, 1]] output_shape [4, 15] : tensor<60xf32> into tensor<4x15xf32>

# An interleave writes each part once into its strided positions of one destination; a part whose last
# positions fall past the cropped output is sliced first, and a part with none is not written.
show("interleave", lambda a, b, c: ops.interleave([a, b, c], (1,), (3,), (2, 5)), (2, 2), (2, 2), (2, 2))
# (positions 0, 3 | 1, 4 | 2: the third part is one short)
# CHECK-LABEL: ----- interleave
# CHECK: %[[D:.*]] = tensor.empty() : tensor<2x5xf32>
# CHECK: %[[D0:.*]] = tensor.insert_slice %arg0 into %[[D]][0, 0] [2, 2] [1, 3] : tensor<2x2xf32> into tensor<2x5xf32>
# CHECK: %[[D1:.*]] = tensor.insert_slice %arg1 into %[[D0]][0, 1] [2, 2] [1, 3] : tensor<2x2xf32> into tensor<2x5xf32>
# CHECK: %[[C:.*]] = tensor.extract_slice %arg2[0, 0] [2, 1] [1, 1] : tensor<2x2xf32> to tensor<2x1xf32>
# CHECK: tensor.insert_slice %[[C]] into %[[D1]][0, 2] [2, 1] [1, 3] : tensor<2x1xf32> into tensor<2x5xf32>
