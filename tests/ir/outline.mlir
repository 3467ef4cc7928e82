// Pass outline (cpu): a function body with at least 8 loop nests (ops with regions, or copies) gets each
// nest moved into a private noinline function called in its place; identical nests (same op, same types,
// as in repeated layers) become one function. Free constants are cloned in; memrefs and other values
// become arguments. Ops with results and bodies with fewer nests stay as they are (@few).
// RUN: %pbsdk opt %s --target cpu -p outline | filecheck %s

#id = affine_map<(d0) -> (d0)>

// CHECK-LABEL: func.func @layers(
// CHECK-SAME:      %[[X:[a-z0-9]+]]: memref<64xf32>, %[[Y:[a-z0-9]+]]: memref<64xf32>, %[[S:[a-z0-9]+]]: f32)
// CHECK-NEXT:    arith.constant
// CHECK-COUNT-4: call @__pbsdk_nest_0(%[[X]], %[[Y]]) : (memref<64xf32>, memref<64xf32>) -> ()
// CHECK-COUNT-3: call @__pbsdk_nest_4(%[[S]], %[[Y]], %[[X]])
// CHECK-NEXT:    call @__pbsdk_nest_7(%[[X]], %[[Y]]) : (memref<64xf32>, memref<64xf32>) -> ()
// CHECK-NEXT:    return
// CHECK-LABEL: func.func @few(
// CHECK-NEXT:    linalg.generic
// CHECK-NOT:     call
// CHECK:       func.func private @__pbsdk_nest_0(%[[A:[a-z0-9]+]]: memref<64xf32>, %[[B:[a-z0-9]+]]: memref<64xf32>) attributes {passthrough = ["noinline"]} {
// CHECK-NEXT:    %[[TWO:[a-z0-9_]+]] = arith.constant 2.000000e+00 : f32
// CHECK-NEXT:    linalg.generic {{.*}} ins(%[[A]] : memref<64xf32>) outs(%[[B]] : memref<64xf32>)
// CHECK:           arith.mulf %{{.*}}, %[[TWO]] : f32
// CHECK:         return
// CHECK:       func.func private @__pbsdk_nest_4(%[[SS:[a-z0-9]+]]: f32, %{{.*}}: memref<64xf32>, %{{.*}}: memref<64xf32>) attributes {passthrough = ["noinline"]} {
// CHECK:           arith.addf %{{.*}}, %[[SS]] : f32
// CHECK:       func.func private @__pbsdk_nest_7(
// CHECK-NEXT:    memref.copy
// CHECK-NOT:   func.func private @__pbsdk_nest_1(
func.func @layers(%x: memref<64xf32>, %y: memref<64xf32>, %s: f32) {
  %two = arith.constant 2.0 : f32
  linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel"]} ins(%x : memref<64xf32>) outs(%y : memref<64xf32>) {
  ^bb0(%in: f32, %out: f32):
    %0 = arith.mulf %in, %two : f32
    linalg.yield %0 : f32
  }
  linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel"]} ins(%x : memref<64xf32>) outs(%y : memref<64xf32>) {
  ^bb0(%in: f32, %out: f32):
    %0 = arith.mulf %in, %two : f32
    linalg.yield %0 : f32
  }
  linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel"]} ins(%x : memref<64xf32>) outs(%y : memref<64xf32>) {
  ^bb0(%in: f32, %out: f32):
    %0 = arith.mulf %in, %two : f32
    linalg.yield %0 : f32
  }
  linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel"]} ins(%x : memref<64xf32>) outs(%y : memref<64xf32>) {
  ^bb0(%in: f32, %out: f32):
    %0 = arith.mulf %in, %two : f32
    linalg.yield %0 : f32
  }
  linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel"]} ins(%y : memref<64xf32>) outs(%x : memref<64xf32>) {
  ^bb0(%in: f32, %out: f32):
    %0 = arith.addf %in, %s : f32
    linalg.yield %0 : f32
  }
  linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel"]} ins(%y : memref<64xf32>) outs(%x : memref<64xf32>) {
  ^bb0(%in: f32, %out: f32):
    %0 = arith.addf %in, %s : f32
    linalg.yield %0 : f32
  }
  linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel"]} ins(%y : memref<64xf32>) outs(%x : memref<64xf32>) {
  ^bb0(%in: f32, %out: f32):
    %0 = arith.addf %in, %s : f32
    linalg.yield %0 : f32
  }
  memref.copy %x, %y : memref<64xf32> to memref<64xf32>
  return
}

func.func @few(%x: memref<64xf32>, %y: memref<64xf32>) {
  linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel"]} ins(%x : memref<64xf32>) outs(%y : memref<64xf32>) {
  ^bb0(%in: f32, %out: f32):
    linalg.yield %in : f32
  }
  return
}
