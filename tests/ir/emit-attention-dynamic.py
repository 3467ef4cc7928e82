# A fused "lanes" attention over a key length known only at run time (a decode step: 1 query, 8 query heads
# over 2 K/V heads of a cache s0 + 1 long, the cache and the new key concatenated, a (2, 1, 1, s0 + 1)
# additive mask): the declaration takes `?` where the key length is; its pbsdk.attention descriptor
# (version 2) writes the key length and the strides that depend on it as dimension expressions in the
# symbols it lists. The cpu target's attention stage reads the symbol once (memref.dim of the first
# buffer dimension that is it plus a constant) and loops over the key blocks up to it.
# RUN: %python %s | filecheck %s
# RUN: %python %s | %pbsdk opt - --target cpu --spec amd/zen4 -p attention | filecheck %s --check-prefix=BODY
from pbsdk import ops
from pbsdk.core.dims import Dim
from pbsdk.core.ir.emit import emit_graph
from pbsdk.core.ir.graph import TensorType
from pbsdk.core.spec import load_spec
from pbsdk.frontends.jit import trace

s0 = Dim.parse("s0")


def step(q, kc, vc, kn, vn, m):
    return ops.attention(q, ops.concatenate([kc, kn], axis=2), ops.concatenate([vc, vn], axis=2), mask=m)


shapes = [(2, 8, 1, 32), (2, 2, s0, 32), (2, 2, s0, 32), (2, 2, 1, 32), (2, 2, 1, 32), (2, 1, 1, s0 + 1)]
graph, _ = trace(step, tuple(TensorType(s, "f32") for s in shapes))
print(emit_graph(graph, spec=load_spec("amd/zen4"), options={"threads": 1}, forms=("lanes",)))

# CHECK:       func.func private @__pbsdk_attn0(memref<2x8x1x32xf32>, memref<2x2x?x32xf32>, memref<2x2x?x32xf32>, memref<2x1x1x?xf32>, memref<2x8x1x32xf32>)
# CHECK-SAME:    k = {batch = {{\[}}[2, "64*s0 + 64", 8], [2, "32*s0 + 32", 4], [4, 0, 1]], col_stride = 1 : i64, row_stride = 32 : i64, shape = [2, 2, "s0 + 1", 32]}
# CHECK-SAME:    mask = {batch = {{\[}}[2, "s0 + 1", 8], [8, 0, 1]], col_stride = 1 : i64, row_stride = 0 : i64, shape = [2, 1, 1, "s0 + 1"]}
# CHECK-SAME:    sk = "s0 + 1"
# CHECK-SAME:    symbols = ["s0"]
# CHECK-SAME:    version = 2 : i64
# CHECK-LABEL: func.func @main(
# CHECK:         %[[K:.*]] = bufferization.to_buffer %{{.*}} read_only : tensor<2x2x?x32xf32> to memref<2x2x?x32xf32>
# CHECK:         call @__pbsdk_attn0(%{{.*}}, %[[K]], %{{.*}}, %{{.*}}, %{{.*}}) : (memref<2x8x1x32xf32>, memref<2x2x?x32xf32>, memref<2x2x?x32xf32>, memref<2x1x1x?xf32>, memref<2x8x1x32xf32>) -> ()

# BODY-LABEL: func.func private @__pbsdk_attn0_part(
# BODY-SAME:      %[[KB:[^:]*]]: memref<2x2x?x32xf32>, %{{.*}}: memref<2x2x?x32xf32>, %{{.*}}: memref<2x1x1x?xf32>, %{{.*}}: memref<2x8x1x32xf32>, %{{.*}}: index)
# BODY:         memref.collapse_shape %[[KB]] {{\[}}[0, 1, 2, 3]] : memref<2x2x?x32xf32> into memref<?xf32>
# BODY:         %[[D:.*]] = memref.dim %[[KB]], %{{.*}} : memref<2x2x?x32xf32>
# BODY:         %[[S0:.*]] = arith.subi %[[D]], %{{.*}} : index
# The key loop runs to the key length read at run time (s0 + 1), in blocks; a partial last block.
# BODY:         scf.for %{{.*}} = %{{.*}} to %[[D]] step %{{.*}} iter_args(
# BODY:           arith.minsi
# BODY-NOT:   pbsdk.attention
