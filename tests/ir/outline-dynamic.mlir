// Pass outline (cpu): a nest that uses a buffer whose sizes (or strides) are known only at run time stays
// in its function — the bare-pointer convention cannot pass such a buffer to a new one — while the
// function's other nests are outlined as usual.
// RUN: %pbsdk opt %s --target cpu -p outline | filecheck %s

// CHECK-LABEL: func.func @mixed(
// CHECK-SAME:      %[[X:[a-z0-9]+]]: memref<64xf32>, %[[Y:[a-z0-9]+]]: memref<64xf32>, %[[D:[a-z0-9]+]]: memref<?xf32>, %[[E:[a-z0-9]+]]: memref<?xf32>)
// CHECK-COUNT-7: call @__pbsdk_nest_0(%[[X]], %[[Y]]) : (memref<64xf32>, memref<64xf32>) -> ()
// CHECK-NEXT:    memref.copy %[[D]], %[[E]] : memref<?xf32> to memref<?xf32>
// CHECK-NEXT:    return
// CHECK-NOT:   func.func private @__pbsdk_nest_7(
func.func @mixed(%x: memref<64xf32>, %y: memref<64xf32>, %d: memref<?xf32>, %e: memref<?xf32>) {
  memref.copy %x, %y : memref<64xf32> to memref<64xf32>
  memref.copy %x, %y : memref<64xf32> to memref<64xf32>
  memref.copy %x, %y : memref<64xf32> to memref<64xf32>
  memref.copy %x, %y : memref<64xf32> to memref<64xf32>
  memref.copy %x, %y : memref<64xf32> to memref<64xf32>
  memref.copy %x, %y : memref<64xf32> to memref<64xf32>
  memref.copy %x, %y : memref<64xf32> to memref<64xf32>
  memref.copy %d, %e : memref<?xf32> to memref<?xf32>
  return
}
