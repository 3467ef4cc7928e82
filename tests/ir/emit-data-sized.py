# How the ops whose offsets or sizes are data are emitted. A grouped matmul (ops.grouped_matmul: a mixture of experts' rows in consecutive groups, group e ending
# at row ends[e], each times its own weight) is emitted: a zero-filled result; per group, its end read from
# the data and clamped to [the previous end, rows], the group's rows copied out at a run-time offset and
# count, one linalg.matmul on them with the group's weight, and the product inserted back at the group's rows.
# Bad rows or weights are refused when the op is built. put_slices (a cache written at run-time positions): an
# scf.for over the indices carrying the tensor, each slice inserted at its position where 0 <= idx < n.
# RUN: %python %s | filecheck %s
import numpy as np

from pbsdk import ops
from pbsdk.core.errors import PbsdkError
from pbsdk.core.ir.emit import emit_graph
from pbsdk.core.ir.graph import Graph, TensorType
from pbsdk.frontends.tracing import Tensor, tracing


def emit(title, shapes, fn):
    print(f"// ----- {title}")
    graph = Graph()
    with tracing(graph):
        xs = [Tensor(graph.add("input", [], TensorType(tuple(s), dt)), graph) for s, dt in shapes]
        try:
            graph.outputs = [fn(*xs).value]
        except PbsdkError as exc:
            print(f"refused: {exc}")
            return
    print(emit_graph(graph))


weights = [np.full((8, 4), float(e), np.float32) for e in range(2)]
emit("two experts", [((6, 8), "f32"), ((2,), "f64")], lambda x, ends: ops.grouped_matmul(x, ends, weights))
# CHECK-LABEL: ----- two experts
# CHECK:       func.func @main(%[[X:.*]]: tensor<6x8xf32>, %[[E:.*]]: tensor<2xf64>) -> tensor<6x4xf32>
# CHECK:         %[[ACC:.*]] = linalg.fill ins(%{{.*}} : f32) outs(%{{.*}} : tensor<6x4xf32>)
# CHECK:         %[[R0:.*]] = tensor.extract %[[E]][%{{.*}}] : tensor<2xf64>
# CHECK:         arith.maxnumf %[[R0]]
# CHECK:         %[[END0:.*]] = arith.minsi %{{.*}} : index
# CHECK:         %[[M0:.*]] = arith.subi %[[END0]], %{{.*}} : index
# CHECK:         %[[ROWS0:.*]] = tensor.extract_slice %[[X]][%{{.*}}, 0] [%[[M0]], 8] [1, 1] : tensor<6x8xf32> to tensor<?x8xf32>
# CHECK:         %[[COPY0:.*]] = linalg.copy {{.*}}ins(%[[ROWS0]] : tensor<?x8xf32>)
# CHECK:         %[[P0:.*]] = linalg.matmul ins(%[[COPY0]], %{{.*}} : tensor<?x8xf32>, tensor<8x4xf32>) outs(%{{.*}} : tensor<?x4xf32>)
# CHECK:         %[[ACC1:.*]] = tensor.insert_slice %[[P0]] into %[[ACC]][%{{.*}}, 0] [%[[M0]], 4] [1, 1]
# CHECK:         tensor.extract %[[E]]
# CHECK:         %[[END1:.*]] = arith.minsi %{{.*}} : index
# CHECK:         %[[M1:.*]] = arith.subi %[[END1]], %[[END0]] : index
# CHECK:         tensor.extract_slice %[[X]][%[[END0]], 0] [%[[M1]], 8] [1, 1]
# CHECK:         linalg.matmul
# CHECK:         %[[OUT:.*]] = tensor.insert_slice %{{.*}} into %[[ACC1]][%[[END0]], 0] [%[[M1]], 4] [1, 1]
# CHECK:         return %[[OUT]] : tensor<6x4xf32>

# Integer ends are converted to f64 first (whole numbers), then clamped like float ones.
emit("i32 ends", [((6, 8), "f32"), ((2,), "i32")], lambda x, ends: ops.grouped_matmul(x, ends, weights))
# CHECK-LABEL: ----- i32 ends
# CHECK:         arith.sitofp %{{.*}} : i32 to f64
# CHECK:         %[[R:.*]] = tensor.extract %{{.*}} : tensor<2xf64>
# CHECK:         arith.maxnumf %[[R]]

emit("weights of another width", [((6, 8), "f32"), ((2,), "f64")],
     lambda x, ends: ops.grouped_matmul(x, ends, [weights[0], np.zeros((8, 5), np.float32)]))
# CHECK-LABEL: ----- weights of another width
# CHECK:       refused: grouped_matmul: every weight must be 8 x N in f32

emit("ends for three groups, two weights", [((6, 8), "f32"), ((3,), "f64")],
     lambda x, ends: ops.grouped_matmul(x, ends, weights))
# CHECK-LABEL: ----- ends for three groups, two weights
# CHECK:       refused: grouped_matmul: rows of shape (6, 8), ends of shape (3,) and 2 weights

emit("put slices", [((2, 10, 4), "f32"), ((3,), "f64"), ((2, 3, 4), "f32")],
     lambda x, idx, v: ops.put_slices(x, idx, v, 1))
# CHECK-LABEL: ----- put slices
# CHECK:       func.func @main(%[[X:.*]]: tensor<2x10x4xf32>, %[[I:.*]]: tensor<3xf64>, %[[V:.*]]: tensor<2x3x4xf32>)
# CHECK:         %[[OUT:.*]] = scf.for %[[J:.*]] = %{{.*}} to %{{.*}} step %{{.*}} iter_args(%[[ACC:.*]] = %[[X]]) -> (tensor<2x10x4xf32>)
# CHECK:           %[[P:.*]] = tensor.extract %[[I]][%[[J]]] : tensor<3xf64>
# CHECK:           arith.cmpf oge, %[[P]]
# CHECK:           arith.cmpf olt, %[[P]]
# CHECK:           %[[ROW:.*]] = tensor.extract_slice %[[V]][0, %[[J]], 0] [2, 1, 4] [1, 1, 1]
# CHECK:           scf.if %{{.*}} -> (tensor<2x10x4xf32>)
# CHECK:             tensor.insert_slice %[[ROW]] into %[[ACC]][0, %{{.*}}, 0] [2, 1, 4] [1, 1, 1]
# CHECK:           } else {
# CHECK-NEXT:        scf.yield %[[ACC]]
# CHECK:         return %[[OUT]]

emit("put slices of another shape", [((2, 10, 4), "f32"), ((3,), "f64"), ((2, 4, 4), "f32")],
     lambda x, idx, v: ops.put_slices(x, idx, v, 1))
# CHECK-LABEL: ----- put slices of another shape
# CHECK:       refused: put_slices: (3,) indices and values of shape (2, 4, 4) do not fit an array of shape (2, 10, 4)
