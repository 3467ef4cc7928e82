// The template target's stage dma (hook dma_copy): every copy marked pbsdk.dma (a linalg.copy or a
// memref.copy between memory spaces: space i = spec.memory[i], here example/npu's 0 dram, 1 sram, 2 spm)
// becomes a call to a private function @__pbsdk_dma_<N>, one per (source type, destination type), that
// the hook built. The emulation's hook adds the bytes moved to the counter of the level pair
// (bytes:<from>-><to>, one slot of the global @__pbsdk_counters each) — memref.dim of the source for a
// dynamic size — then copies on the host. An unmarked copy is not the stage's.
// RUN: %pbsdk opt %s --target template -p dma | filecheck %s

// CHECK:       memref.global @__pbsdk_counters : memref<64xi64> = dense<0>
// CHECK-LABEL: func.func @moves(
// CHECK-SAME:      %[[A:[^:]*]]: memref<64x64xf32>, %[[B:[^:]*]]: memref<64x64xf32>, %[[N:[^:]*]]: index)
// CHECK-NEXT:    %[[SRAM:.*]] = memref.alloc() : memref<64x64xf32, 1>
// CHECK-NEXT:    %[[SPM:.*]] = memref.alloc() : memref<32x64xf32, 2>
// CHECK-NEXT:    call @__pbsdk_dma_0(%[[A]], %[[SRAM]]) : (memref<64x64xf32>, memref<64x64xf32, 1>) -> ()
// CHECK-NEXT:    call @__pbsdk_dma_0(%[[B]], %[[SRAM]]) : (memref<64x64xf32>, memref<64x64xf32, 1>) -> ()
// CHECK-NEXT:    %[[V:.*]] = memref.subview %[[SRAM]]
// CHECK-NEXT:    %[[W:.*]] = memref.subview %[[SPM]]
// CHECK-NEXT:    call @__pbsdk_dma_1(%[[V]], %[[W]]) : (memref<?x64xf32, strided<[64, 1]>, 1>, memref<?x64xf32, strided<[64, 1]>, 2>) -> ()
// CHECK-NEXT:    call @__pbsdk_dma_2(%[[SRAM]], %[[A]]) : (memref<64x64xf32, 1>, memref<64x64xf32>) -> ()
// CHECK-NEXT:    linalg.copy ins(%[[A]] : memref<64x64xf32>) outs(%[[B]] : memref<64x64xf32>)
// CHECK-NEXT:    return
// dram -> sram, 64 x 64 f32: 16384 bytes into slot 0.
// CHECK-LABEL: func.func private @__pbsdk_dma_0(
// CHECK-SAME:      %[[S0:[^:]*]]: memref<64x64xf32>, %[[D0:[^:]*]]: memref<64x64xf32, 1>) {
// CHECK-NEXT:    %[[BYTES:.*]] = arith.constant 16384 : index
// CHECK-NEXT:    %[[INC:.*]] = arith.index_cast %[[BYTES]] : index to i64
// CHECK-NEXT:    %[[G:.*]] = memref.get_global @__pbsdk_counters : memref<64xi64>
// CHECK-NEXT:    %[[SLOT:.*]] = arith.constant 0 : index
// CHECK-NEXT:    %[[OLD:.*]] = memref.load %[[G]][%[[SLOT]]] : memref<64xi64>
// CHECK-NEXT:    %[[NEW:.*]] = arith.addi %[[OLD]], %[[INC]] : i64
// CHECK-NEXT:    memref.store %[[NEW]], %[[G]][%[[SLOT]]] : memref<64xi64>
// CHECK-NEXT:    linalg.copy ins(%[[S0]] : memref<64x64xf32>) outs(%[[D0]] : memref<64x64xf32, 1>)
// CHECK-NEXT:    return
// sram -> spm, a partial tile of ? rows of 256 bytes: slot 1.
// CHECK-LABEL: func.func private @__pbsdk_dma_1(
// CHECK-SAME:      %[[S1:[^:]*]]: memref<?x64xf32, strided<[64, 1]>, 1>, %[[D1:[^:]*]]: memref<?x64xf32, strided<[64, 1]>, 2>) {
// CHECK-NEXT:    %[[ROW:.*]] = arith.constant 256 : index
// CHECK-NEXT:    %[[ZERO:.*]] = arith.constant 0 : index
// CHECK-NEXT:    %[[ROWS:.*]] = memref.dim %[[S1]], %[[ZERO]]
// CHECK-NEXT:    %[[SIZE:.*]] = arith.muli %[[ROW]], %[[ROWS]] : index
// CHECK-NEXT:    %[[INC1:.*]] = arith.index_cast %[[SIZE]] : index to i64
// CHECK-NEXT:    %[[G1:.*]] = memref.get_global @__pbsdk_counters
// CHECK-NEXT:    %[[SLOT1:.*]] = arith.constant 1 : index
// CHECK-NEXT:    %[[OLD1:.*]] = memref.load %[[G1]][%[[SLOT1]]]
// CHECK-NEXT:    %[[NEW1:.*]] = arith.addi %[[OLD1]], %[[INC1]] : i64
// CHECK-NEXT:    memref.store %[[NEW1]], %[[G1]][%[[SLOT1]]]
// CHECK-NEXT:    linalg.copy ins(%[[S1]] : {{.*}}) outs(%[[D1]] : {{.*}})
// sram -> dram (a marked memref.copy): slot 2.
// CHECK-LABEL: func.func private @__pbsdk_dma_2(
// CHECK:         arith.constant 16384 : index
// CHECK:         %[[SLOT2:.*]] = arith.constant 2 : index
// CHECK-NEXT:    memref.load %{{.*}}[%[[SLOT2]]]
// CHECK:         linalg.copy ins(%{{.*}} : memref<64x64xf32, 1>) outs(%{{.*}} : memref<64x64xf32>)
func.func @moves(%a: memref<64x64xf32>, %b: memref<64x64xf32>, %n: index) {
  %s = memref.alloc() : memref<64x64xf32, 1>
  %t = memref.alloc() : memref<32x64xf32, 2>
  linalg.copy {pbsdk.dma = "dram->sram"} ins(%a : memref<64x64xf32>) outs(%s : memref<64x64xf32, 1>)
  linalg.copy {pbsdk.dma = "dram->sram"} ins(%b : memref<64x64xf32>) outs(%s : memref<64x64xf32, 1>)
  %v = memref.subview %s[0, 0] [%n, 64] [1, 1] : memref<64x64xf32, 1> to memref<?x64xf32, strided<[64, 1]>, 1>
  %w = memref.subview %t[0, 0] [%n, 64] [1, 1] : memref<32x64xf32, 2> to memref<?x64xf32, strided<[64, 1]>, 2>
  linalg.copy {pbsdk.dma = "sram->spm"} ins(%v : memref<?x64xf32, strided<[64, 1]>, 1>) outs(%w : memref<?x64xf32, strided<[64, 1]>, 2>)
  memref.copy %s, %a {pbsdk.dma = "sram->dram"} : memref<64x64xf32, 1> to memref<64x64xf32>
  linalg.copy ins(%a : memref<64x64xf32>) outs(%b : memref<64x64xf32>)
  return
}
