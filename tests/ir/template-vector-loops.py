# The vector unit of a cache-only chip (pbsdk.targets.template.vector_loops, through register_tile's
# vector_tile_op): the template's stage vector-unit on rvv-edge (512-bit vectors: 16 f32 lanes) builds an
# elementwise op and a reduction on packed tiles as vector<16xf32> loops, the last points as one masked step.
# RUN: %python %s | filecheck %s
from pathlib import Path

from mlir import ir

from pbsdk.core.pipeline import StageContext
from pbsdk.core.plan.packing import packing_view
from pbsdk.core.spec import load_spec
from pbsdk.targets.template import emulation, hooks, register_tile

SPEC = packing_view(load_spec(Path(__file__).resolve().parents[2] / "chip_specs" / "example" / "rvv-edge.yaml"))
HOOKS = {**{name: getattr(hooks, name) for name in hooks.TEMPLATE_HOOKS},
         "vector_tile_op": register_tile.vector_tile_op}


def show(title: str, text: str) -> None:
    print(f"// ----- {title}")
    with ir.Context(), ir.Location.unknown():
        module = ir.Module.parse(text)
        ctx = StageContext(SPEC, {})
        emulation.lower_vector_tiles(module, ctx, HOOKS)
        print(module)
        print("// counters:", ", ".join(ctx.notes["counters"]))


# x * 2 + y on a 4x40 tile of l1d (memory space 2): 2 full vectors and 8 points a row (a mask of 8).
# CHECK-LABEL: // ----- elementwise
# CHECK:         scf.for %[[I:.*]] = %{{.*}} to %{{.*}} step %{{.*}} {
# CHECK:           scf.for %[[J:.*]] = %{{.*}} to %{{.*}} step %{{.*}} {
# CHECK:             %[[X:.*]] = vector.transfer_read %{{.*}}[%[[I]], %[[J]]], %{{.*}} {in_bounds = [true]} : memref<4x40xf32, 2>, vector<16xf32>
# CHECK:             %[[Y:.*]] = vector.transfer_read %{{.*}}[%[[I]], %[[J]]], %{{.*}} {in_bounds = [true]} : memref<4x40xf32, 2>, vector<16xf32>
# CHECK:             %[[TWO:.*]] = vector.broadcast %{{.*}} : f32 to vector<16xf32>
# CHECK:             %[[M:.*]] = arith.mulf %[[X]], %[[TWO]] : vector<16xf32>
# CHECK:             %[[S:.*]] = arith.addf %[[M]], %[[Y]] fastmath<contract> : vector<16xf32>
# CHECK:             vector.transfer_write %[[S]], %{{.*}}[%[[I]], %[[J]]] {in_bounds = [true]} : vector<16xf32>, memref<4x40xf32, 2>
# CHECK:           }
# CHECK:           %[[MASK:.*]] = vector.create_mask %{{.*}} : vector<16xi1>
# CHECK:           vector.transfer_read %{{.*}}, %[[MASK]] {in_bounds = [true]} : memref<4x40xf32, 2>, vector<16xf32>
# CHECK:           vector.transfer_write %{{.*}}, %[[MASK]] {in_bounds = [true]} : vector<16xf32>, memref<4x40xf32, 2>
# CHECK-NOT:     linalg.generic
# CHECK:       // counters: vector:l1d, vector_op:load, vector_op:store, vector_op:mulf, vector_op:addf
show("elementwise", """
#id = affine_map<(d0, d1) -> (d0, d1)>
func.func @axpy(%x: memref<4x40xf32, 2>, %y: memref<4x40xf32, 2>, %z: memref<4x40xf32, 2>) {
  %two = arith.constant 2.0 : f32
  linalg.generic {indexing_maps = [#id, #id, #id], iterator_types = ["parallel", "parallel"]}
      ins(%x, %y : memref<4x40xf32, 2>, memref<4x40xf32, 2>) outs(%z : memref<4x40xf32, 2>)
      attrs = {pbsdk.compute = "vector"} {
  ^bb0(%a: f32, %b: f32, %o: f32):
    %m = arith.mulf %a, %two : f32
    %s = arith.addf %m, %b fastmath<contract> : f32
    linalg.yield %s : f32
  }
  return
}
""")

# A sum of rows of a dynamic number of rows of 53 (3 full vectors, 5 left): one vector<16xf32> accumulator
# from 0.0, the masked rest kept by a select, one vector.reduction combined with the output's value.
# CHECK-LABEL: // ----- reduction
# CHECK:         memref.dim
# CHECK:         scf.for %[[I:.*]] = %{{.*}} to %{{.*}} step %{{.*}} {
# CHECK:           %[[ZERO:.*]] = vector.broadcast %{{.*}} : f32 to vector<16xf32>
# CHECK:           %[[ACC:.*]] = scf.for %[[J:.*]] = %{{.*}} to %{{.*}} step %{{.*}} iter_args(%[[A:.*]] = %[[ZERO]]) -> (vector<16xf32>) {
# CHECK:             %[[X:.*]] = vector.transfer_read %{{.*}}[%[[I]], %[[J]]], %{{.*}} {in_bounds = [true]} : memref<?x53xf32, 2>, vector<16xf32>
# CHECK:             %[[S:.*]] = arith.addf %[[X]], %[[A]] fastmath<reassoc> : vector<16xf32>
# CHECK:             scf.yield %[[S]] : vector<16xf32>
# CHECK:           %[[MASK:.*]] = vector.create_mask %{{.*}} : vector<16xi1>
# CHECK:           %[[R:.*]] = vector.transfer_read %{{.*}}, %[[MASK]] {in_bounds = [true]} : memref<?x53xf32, 2>, vector<16xf32>
# CHECK:           %[[T:.*]] = arith.addf %[[R]], %[[ACC]] fastmath<reassoc> : vector<16xf32>
# CHECK:           %[[KEPT:.*]] = arith.select %[[MASK]], %[[T]], %[[ACC]] : vector<16xi1>, vector<16xf32>
# CHECK:           %[[OLD:.*]] = memref.load %{{.*}}[%[[I]]] : memref<?xf32, 2>
# CHECK:           %[[SUM:.*]] = vector.reduction <add>, %[[KEPT]], %[[OLD]] fastmath<reassoc> : vector<16xf32> into f32
# CHECK:           memref.store %[[SUM]], %{{.*}}[%[[I]]] : memref<?xf32, 2>
# CHECK-NOT:     linalg.generic
# CHECK:       // counters: vector:l1d, vector_op:select, vector_op:load, vector_op:addf, vector_op:reduction
show("reduction", """
#in = affine_map<(d0, d1) -> (d0, d1)>
#out = affine_map<(d0, d1) -> (d0)>
func.func @sum_rows(%x: memref<?x53xf32, 2>, %y: memref<?xf32, 2>) {
  linalg.generic {indexing_maps = [#in, #out], iterator_types = ["parallel", "reduction"]}
      ins(%x : memref<?x53xf32, 2>) outs(%y : memref<?xf32, 2>) attrs = {pbsdk.compute = "vector"} {
  ^bb0(%a: f32, %acc: f32):
    %s = arith.addf %a, %acc fastmath<reassoc> : f32
    linalg.yield %s : f32
  }
  return
}
""")

# i32 max over columns (the vector loop is parallel: one row at a time into the output vector), and a
# fill of i32 zeros: vector<16xi32>.
# CHECK-LABEL: // ----- i32
# CHECK:         scf.for
# CHECK:           scf.for
# CHECK:             vector.transfer_read %{{.*}} : memref<8x32xi32, 2>, vector<16xi32>
# CHECK:             vector.transfer_read %{{.*}} : memref<32xi32, 2>, vector<16xi32>
# CHECK:             arith.maxsi %{{.*}} : vector<16xi32>
# CHECK:             vector.transfer_write %{{.*}} : vector<16xi32>, memref<32xi32, 2>
# CHECK:         vector.broadcast %{{.*}} : i32 to vector<16xi32>
# CHECK:         scf.for
# CHECK:           vector.transfer_write %{{.*}} : vector<16xi32>, memref<32xi32, 2>
# CHECK-NOT:     linalg
show("i32", """
#in = affine_map<(d0, d1) -> (d0, d1)>
#out = affine_map<(d0, d1) -> (d1)>
func.func @max_cols(%x: memref<8x32xi32, 2>, %y: memref<32xi32, 2>, %z: memref<32xi32, 2>) {
  linalg.generic {indexing_maps = [#in, #out], iterator_types = ["reduction", "parallel"]}
      ins(%x : memref<8x32xi32, 2>) outs(%y : memref<32xi32, 2>) attrs = {pbsdk.compute = "vector"} {
  ^bb0(%a: i32, %acc: i32):
    %s = arith.maxsi %a, %acc : i32
    linalg.yield %s : i32
  }
  %zero = arith.constant 0 : i32
  linalg.fill {pbsdk.compute = "vector"} ins(%zero : i32) outs(%z : memref<32xi32, 2>)
  return
}
""")

# An operand the vector loop does not index, read at a constant column: loaded at that column once a row
# and broadcast (counted as one broadcast a row).
# CHECK-LABEL: // ----- constant-index
# CHECK:         scf.for %[[I:.*]] = %{{.*}} to %{{.*}} step %{{.*}} {
# CHECK-NEXT:      %[[C2:.*]] = arith.constant 2 : index
# CHECK-NEXT:      %[[S:.*]] = memref.load %{{.*}}[%[[I]], %[[C2]]] : memref<4x3xf32, 2>
# CHECK-NEXT:      vector.broadcast %[[S]] : f32 to vector<16xf32>
# CHECK:       // counters: vector:l1d, vector_op:load, vector_op:store, vector_op:subf, vector_op:broadcast
show("constant-index", """
#x = affine_map<(d0, d1) -> (d0, d1)>
#c = affine_map<(d0, d1) -> (d0, 2)>
func.func @minus_column(%x: memref<4x32xf32, 2>, %s: memref<4x3xf32, 2>, %y: memref<4x32xf32, 2>) {
  linalg.generic {indexing_maps = [#x, #c, #x], iterator_types = ["parallel", "parallel"]}
      ins(%x, %s : memref<4x32xf32, 2>, memref<4x3xf32, 2>) outs(%y : memref<4x32xf32, 2>)
      attrs = {pbsdk.compute = "vector"} {
  ^bb0(%a: f32, %b: f32, %o: f32):
    %d = arith.subf %a, %b : f32
    linalg.yield %d : f32
  }
  return
}
""")

# A transposing add, y = x + w^T: x and y are read and written along their rows (contiguous), w down its
# column (a strided vector load along its first dimension: permutation_map (d0, d1) -> (d0)).
# CHECK-LABEL: // ----- transposed
# CHECK:       #[[COL:.*]] = affine_map<(d0, d1) -> (d0)>
# CHECK:         scf.for %[[I:.*]] = %{{.*}} to %{{.*}} step %{{.*}} {
# CHECK:           scf.for %[[J:.*]] = %{{.*}} to %{{.*}} step %{{.*}} {
# CHECK:             vector.transfer_read %{{.*}}[%[[I]], %[[J]]], %{{.*}} {in_bounds = [true]} : memref<4x32xf32, 2>, vector<16xf32>
# CHECK:             vector.transfer_read %{{.*}}[%[[J]], %[[I]]], %{{.*}} {in_bounds = [true], permutation_map = #[[COL]]} : memref<32x4xf32, 2>, vector<16xf32>
# CHECK:             arith.addf %{{.*}} : vector<16xf32>
# CHECK:             vector.transfer_write %{{.*}}[%[[I]], %[[J]]] {in_bounds = [true]} : vector<16xf32>, memref<4x32xf32, 2>
# CHECK-NOT:     linalg.generic
show("transposed", """
#x = affine_map<(d0, d1) -> (d0, d1)>
#t = affine_map<(d0, d1) -> (d1, d0)>
func.func @add_transposed(%x: memref<4x32xf32, 2>, %w: memref<32x4xf32, 2>, %y: memref<4x32xf32, 2>) {
  linalg.generic {indexing_maps = [#x, #t, #x], iterator_types = ["parallel", "parallel"]}
      ins(%x, %w : memref<4x32xf32, 2>, memref<32x4xf32, 2>) outs(%y : memref<4x32xf32, 2>)
      attrs = {pbsdk.compute = "vector"} {
  ^bb0(%a: f32, %b: f32, %o: f32):
    %s = arith.addf %a, %b : f32
    linalg.yield %s : f32
  }
  return
}
""")
