// Pass plan-workspace (core; the cpu target's last scheduling stage): the entry function's temporaries
// become views of one workspace argument (marked pbsdk.workspace = its bytes) that the loader allocates
// once. Buffers live at the same time get disjoint bytes; a buffer whose last use comes before another's
// first shares its bytes. Each offset is 64-byte aligned (or the alloc's larger alignment).
// Buffers under the pass's min-bytes (1 MiB by default) stay allocs: the cases below plan every buffer.
// RUN: %pbsdk opt %s --split-input-file -p "plan-workspace{min-bytes=0}" | filecheck %s
// RUN: %pbsdk opt %s --split-input-file -p plan-workspace | filecheck %s --check-prefix=DEFAULT
// DEFAULT-NOT: memref.view
// DEFAULT-NOT: pbsdk.workspace

// Three 4 KiB buffers: %a and %b are live together (both read by the second call), %c only after %a's
// last use, so %c takes %a's bytes and the workspace is 8 KiB, not 12.
// CHECK-LABEL: func.func @chain(
// CHECK-SAME:      %[[X:[^:]*]]: memref<1024xf32>, %[[Y:[^:]*]]: memref<1024xf32>, %[[WS:[^:]*]]: memref<8192xi8> {pbsdk.workspace = 8192 : i64})
// CHECK:         %[[O0:.*]] = arith.constant 0 : index
// CHECK:         %[[A:.*]] = memref.view %[[WS]][%[[O0]]][] : memref<8192xi8> to memref<1024xf32>
// CHECK:         %[[O1:.*]] = arith.constant 4096 : index
// CHECK:         %[[B:.*]] = memref.view %[[WS]][%[[O1]]][] : memref<8192xi8> to memref<1024xf32>
// CHECK:         call @produce(%[[X]], %[[A]])
// CHECK:         call @combine(%[[A]], %[[X]], %[[B]])
// CHECK:         %[[C:.*]] = memref.view %[[WS]][%{{.*}}][] : memref<8192xi8> to memref<32x32xf32>
// CHECK:         %[[CF:.*]] = memref.collapse_shape %[[C]]
// CHECK:         call @combine(%[[B]], %[[X]], %[[CF]])
// CHECK:         call @produce(%[[CF]], %[[Y]])
// CHECK-NOT:     memref.alloc
// CHECK-NOT:     memref.dealloc
// CHECK:         return
func.func @chain(%x: memref<1024xf32>, %y: memref<1024xf32>) {
  %a = memref.alloc() {alignment = 64 : i64} : memref<1024xf32>
  %b = memref.alloc() : memref<1024xf32>
  call @produce(%x, %a) : (memref<1024xf32>, memref<1024xf32>) -> ()
  call @combine(%a, %x, %b) : (memref<1024xf32>, memref<1024xf32>, memref<1024xf32>) -> ()
  %c = memref.alloc() : memref<32x32xf32>
  %cf = memref.collapse_shape %c [[0, 1]] : memref<32x32xf32> into memref<1024xf32>
  call @combine(%b, %x, %cf) : (memref<1024xf32>, memref<1024xf32>, memref<1024xf32>) -> ()
  call @produce(%cf, %y) : (memref<1024xf32>, memref<1024xf32>) -> ()
  memref.dealloc %a : memref<1024xf32>
  memref.dealloc %b : memref<1024xf32>
  memref.dealloc %c : memref<32x32xf32>
  return
}
func.func private @produce(memref<1024xf32>, memref<1024xf32>)
func.func private @combine(memref<1024xf32>, memref<1024xf32>, memref<1024xf32>)

// -----

// A use inside a loop keeps the buffer live over the whole loop: %s and %t, both used on every trip, get
// disjoint bytes; %u, first used after the loop (through a subview), takes %t's, whose last use is the loop.
// CHECK-LABEL: func.func @loop(
// CHECK-SAME:      %[[X:[^:]*]]: memref<64xf32>, %[[WS:[^:]*]]: memref<768xi8> {pbsdk.workspace = 768 : i64})
// CHECK:         %[[O512:.*]] = arith.constant 512 : index
// CHECK:         %[[S:.*]] = memref.view %[[WS]][%[[O512]]][] : memref<768xi8> to memref<64xf32>
// CHECK:         %[[O0:.*]] = arith.constant 0 : index
// CHECK:         %[[T:.*]] = memref.view %[[WS]][%[[O0]]][] : memref<768xi8> to memref<64xf32>
// CHECK:         scf.for
// CHECK:           func.call @copy(%[[S]], %[[T]])
// CHECK:           func.call @copy(%[[T]], %[[S]])
// CHECK:         %[[U:.*]] = memref.view %[[WS]][%{{.*}}][] : memref<768xi8> to memref<128xf32>
// CHECK:         memref.subview %[[U]]
func.func @loop(%x: memref<64xf32>) {
  %s = memref.alloc() : memref<64xf32>
  %t = memref.alloc() : memref<64xf32>
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c4 = arith.constant 4 : index
  call @copy(%x, %s) : (memref<64xf32>, memref<64xf32>) -> ()
  scf.for %i = %c0 to %c4 step %c1 {
    func.call @copy(%s, %t) : (memref<64xf32>, memref<64xf32>) -> ()
    func.call @copy(%t, %s) : (memref<64xf32>, memref<64xf32>) -> ()
  }
  %u = memref.alloc() : memref<128xf32>
  %s2 = memref.subview %u[0] [64] [1] : memref<128xf32> to memref<64xf32, strided<[1]>>
  call @copy_s(%s, %s2) : (memref<64xf32>, memref<64xf32, strided<[1]>>) -> ()
  memref.dealloc %s : memref<64xf32>
  memref.dealloc %t : memref<64xf32>
  memref.dealloc %u : memref<128xf32>
  return
}
func.func private @copy(memref<64xf32>, memref<64xf32>)
func.func private @copy_s(memref<64xf32>, memref<64xf32, strided<[1]>>)

// -----

// Left alone: a dynamic shape, a buffer allocated inside a loop, a buffer freed inside a region, and a
// buffer the entry returns. Nothing is planned, so no workspace argument is added.
// CHECK-LABEL: func.func @left(
// CHECK-SAME:      %[[N:[^:]*]]: index, %[[F:[^:]*]]: i1) -> memref<16xf32> {
// CHECK-NOT:     memref.view
// CHECK-COUNT-4: memref.alloc
// CHECK-NOT:     memref.view
func.func @left(%n: index, %f: i1) -> memref<16xf32> {
  %d = memref.alloc(%n) : memref<?xf32>
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c2 = arith.constant 2 : index
  scf.for %i = %c0 to %c2 step %c1 {
    %l = memref.alloc() : memref<16xf32>
    memref.dealloc %l : memref<16xf32>
  }
  %r = memref.alloc() : memref<16xf32>
  scf.if %f {
    memref.dealloc %r : memref<16xf32>
  }
  %out = memref.alloc() : memref<16xf32>
  memref.dealloc %d : memref<?xf32>
  return %out : memref<16xf32>
}
