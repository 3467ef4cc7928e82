# How a graph with sizes known only at run time (pbsdk.core.dims.Dim, from a torch graph traced with
# symbolic sizes) is emitted: ? dimensions, each symbol read once with tensor.dim from the first input
# dimension that is that symbol (or solved from one that is the symbol plus a constant), the sizes of
# tensor.empty / extract_slice / insert_slice / expand_shape built from them, and the size ops (a Dim's
# value as data, an iota over a Dim). A size no input binds is refused.
# RUN: %python %s | filecheck %s
from pbsdk import ops
from pbsdk.core.dims import Dim
from pbsdk.core.errors import DynamicShapeError
from pbsdk.core.ir.emit import emit_graph
from pbsdk.core.ir.graph import Graph, TensorType
from pbsdk.frontends.tracing import Tensor, tracing

s0 = Dim.parse("s0")


def emit(title, shapes, fn):
    print(f"// ----- {title}")
    graph = Graph()
    with tracing(graph):
        xs = [Tensor(graph.add("input", [], TensorType(tuple(s), "f32")), graph) for s in shapes]
        graph.outputs = [fn(*xs).value]
    try:
        print(emit_graph(graph))
    except DynamicShapeError as exc:
        print(f"refused: {exc}")


# A cache one longer than its input: the symbol from the cache's dimension 1, the new keys inserted at s0.
emit("cat", [(1, s0, 8), (1, 1, 8)], lambda cache, new: ops.concatenate([cache, new], axis=1))
# CHECK-LABEL: ----- cat
# CHECK:       func.func @main(%[[C:.*]]: tensor<1x?x8xf32>, %[[N:.*]]: tensor<1x1x8xf32>) -> tensor<1x?x8xf32>
# CHECK:         %[[ONE:.*]] = arith.constant 1 : index
# CHECK:         %[[S0:.*]] = tensor.dim %[[C]], %[[ONE]] : tensor<1x?x8xf32>
# CHECK:         %[[LEN:.*]] = arith.addi %[[S0]], %{{.*}} : index
# CHECK:         tensor.empty(%[[LEN]]) : tensor<1x?x8xf32>
# CHECK:         tensor.insert_slice %[[C]] into %{{.*}}[0, 0, 0] [1, %[[S0]], 8] [1, 1, 1]
# CHECK:         tensor.insert_slice %[[N]] into %{{.*}}[0, %[[S0]], 0] [1, 1, 8] [1, 1, 1]

# Only the cache plus one arrives: s0 is solved from it (s0 + 1 - 1); the last row sliced at s0.
emit("solve", [(s0 + 1, 8)], lambda x: ops.slice(x, 0, s0, None))
# CHECK-LABEL: ----- solve
# CHECK:       func.func @main(%[[X:.*]]: tensor<?x8xf32>) -> tensor<1x8xf32>
# CHECK:         %[[D:.*]] = tensor.dim %[[X]], %{{.*}} : tensor<?x8xf32>
# CHECK:         %[[S0:.*]] = arith.subi %[[D]], %{{.*}} : index
# CHECK:         tensor.extract_slice %[[X]][%[[S0]], 0] [1, 8] [1, 1] : tensor<?x8xf32> to tensor<1x8xf32>

# A reshape with a symbolic dimension: collapsed, then expanded with its output sizes.
emit("reshape", [(s0, 64)], lambda x: ops.reshape(x, (s0, 4, 16)))
# CHECK-LABEL: ----- reshape
# CHECK:         tensor.collapse_shape %{{.*}} {{\[}}[0, 1]] : tensor<?x64xf32> into tensor<?xf32>
# CHECK:         tensor.expand_shape %{{.*}} {{\[}}[0, 1, 2]] output_shape [%{{.*}}, 4, 16] : tensor<?xf32> into tensor<?x4x16xf32>

# Positions over the length divided by it: an iota over s0 and s0's value as a 0-d tensor.
emit("size-ops", [(s0,)], lambda x: ops.add(x, ops.div(ops.iota(s0, "f32"), ops.size_value(s0, "f32"))))
# CHECK-LABEL: ----- size-ops
# CHECK:         %[[S0:.*]] = tensor.dim
# CHECK:         linalg.index 0 : index
# CHECK:         arith.sitofp %{{.*}} : i64 to f32
# CHECK:         %[[I:.*]] = arith.index_cast %[[S0]] : index to i64
# CHECK:         %[[F:.*]] = arith.sitofp %[[I]] : i64 to f32
# CHECK:         tensor.from_elements %[[F]] : tensor<f32>

# An output size no input binds.
emit("unbound", [(4,)], lambda x: ops.add(ops.iota(s0, "f32"), 1.0))
# CHECK-LABEL: ----- unbound
# CHECK:       refused: size s0: no input's shape binds s0
