// The template target's stage scratchpad (hook scratchpad_alloc): each memref.alloc in a scratchpad memory
// space (space i = spec.memory[i]; example/npu: 1 sram, 2 spm) is offered to the hook, which may place the
// buffer itself; the emulation's hook keeps the allocation (a separate host buffer). Then the functions
// the hooks built (any private callee) are inlined and dropped, and every memref loses its memory space:
// on the host all levels are host memory.
// RUN: %pbsdk opt %s --target template -p scratchpad | filecheck %s
// After dma, the per-copy functions are inlined too: the byte counts sit where the copies were.
// RUN: %pbsdk opt %s --target template -p dma,scratchpad | filecheck %s --check-prefix=DMA

// CHECK:       memref.global @__pbsdk_counters : memref<64xi64> = dense<0>
// CHECK-LABEL: func.func @staged(
// CHECK-SAME:      %[[A:[^:]*]]: memref<64xf32>, %[[OUT:[^:]*]]: memref<64xf32>)
// CHECK-NEXT:    %[[T:.*]] = memref.alloc() {alignment = 64 : i64} : memref<64xf32>
// CHECK-NEXT:    %[[U:.*]] = memref.alloc() {alignment = 64 : i64} : memref<64xf32>
// CHECK-NEXT:    linalg.copy {pbsdk.dma = "dram->spm"} ins(%[[A]] : memref<64xf32>) outs(%[[T]] : memref<64xf32>)
// CHECK-NEXT:    linalg.generic {{.*}} ins(%[[T]] : memref<64xf32>) outs(%[[U]] : memref<64xf32>) {
// CHECK:           arith.negf
// CHECK:         %[[H:.*]] = memref.subview %[[U]][0] [32] [1] : memref<64xf32> to memref<32xf32, strided<[1]>>
// CHECK:         linalg.copy {pbsdk.dma = "spm->dram"} ins(%[[H]] : memref<32xf32, strided<[1]>>)
// CHECK-NEXT:    memref.dealloc %[[T]] : memref<64xf32>
// CHECK-NEXT:    memref.dealloc %[[U]] : memref<64xf32>
// CHECK-NEXT:    return
// CHECK-NOT:     call
// CHECK-NOT:     __pbsdk_negate
// CHECK-NOT:     , 2>

// DMA-LABEL: func.func @staged(
// DMA-DAG:     %[[IN:.*]] = arith.constant 256 : i64
// DMA-DAG:     %[[SLOT0:.*]] = arith.constant 0 : index
// DMA:         %[[T:.*]] = memref.alloc() {alignment = 64 : i64} : memref<64xf32>
// DMA-NEXT:    memref.alloc() {alignment = 64 : i64} : memref<64xf32>
// DMA-NEXT:    %[[G:.*]] = memref.get_global @__pbsdk_counters : memref<64xi64>
// DMA-NEXT:    %[[OLD:.*]] = memref.load %[[G]][%[[SLOT0]]] : memref<64xi64>
// DMA-NEXT:    %[[NEW:.*]] = arith.addi %[[OLD]], %[[IN]] : i64
// DMA-NEXT:    memref.store %[[NEW]], %[[G]][%[[SLOT0]]] : memref<64xi64>
// DMA-NEXT:    linalg.copy ins(%{{.*}} : memref<64xf32>) outs(%[[T]] : memref<64xf32>)
// DMA-NOT:     pbsdk.dma
// DMA-NOT:     call
// DMA-NOT:     func.func private
memref.global @__pbsdk_counters : memref<64xi64> = dense<0>
func.func @staged(%a: memref<64xf32>, %out: memref<64xf32>) {
  %t = memref.alloc() {alignment = 64 : i64} : memref<64xf32, 2>
  %u = memref.alloc() {alignment = 64 : i64} : memref<64xf32, 2>
  linalg.copy {pbsdk.dma = "dram->spm"} ins(%a : memref<64xf32>) outs(%t : memref<64xf32, 2>)
  call @__pbsdk_negate(%t, %u) : (memref<64xf32, 2>, memref<64xf32, 2>) -> ()
  %h = memref.subview %u[0] [32] [1] : memref<64xf32, 2> to memref<32xf32, strided<[1]>, 2>
  %o = memref.subview %out[0] [32] [1] : memref<64xf32> to memref<32xf32, strided<[1]>>
  linalg.copy {pbsdk.dma = "spm->dram"} ins(%h : memref<32xf32, strided<[1]>, 2>) outs(%o : memref<32xf32, strided<[1]>>)
  memref.dealloc %t : memref<64xf32, 2>
  memref.dealloc %u : memref<64xf32, 2>
  return
}
func.func private @__pbsdk_negate(%x: memref<64xf32, 2>, %y: memref<64xf32, 2>) {
  linalg.generic {indexing_maps = [affine_map<(d0) -> (d0)>, affine_map<(d0) -> (d0)>], iterator_types = ["parallel"]}
      ins(%x : memref<64xf32, 2>) outs(%y : memref<64xf32, 2>) {
  ^bb0(%v: f32, %w: f32):
    %n = arith.negf %v : f32
    linalg.yield %n : f32
  }
  return
}
