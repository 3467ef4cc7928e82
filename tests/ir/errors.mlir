// Inputs the pipeline must reject, each with the stage, the op and the reason, and exit code 2.
// RUN: not %pbsdk compile %s --target template 2>&1 | filecheck %s --check-prefix=DYN
// RUN: echo 'func.func @f(%a: tensor<4xf32>) -> tensor<4xf32> { %b = "nope.op"(%a) : (tensor<4xf32>) -> tensor<4xf32> return %b : tensor<4xf32> }' > %t.bad.mlir
// RUN: not %pbsdk compile %t.bad.mlir 2>&1 | filecheck %s --check-prefix=PARSE
// RUN: not %pbsdk compile %s --emit nosuchstage 2>&1 | filecheck %s --check-prefix=STAGE
// RUN: not %pbsdk compile %s --target nosuchtarget 2>&1 | filecheck %s --check-prefix=TARGET

func.func @dynamic(%a: tensor<?x4xf32>) -> tensor<?x4xf32> {
  return %a : tensor<?x4xf32>
}

// DYN: pbsdk: error: in stage 'input', op 'func.func': argument 0 has dynamic shape tensor<?x4xf32>; the target compiles static shapes
// DYN-NOT: Traceback
// PARSE: pbsdk: error: in stage 'parse': cannot parse the input MLIR
// PARSE-NEXT: error: "-":1:{{[0-9]+}}: operation being parsed with an unregistered dialect
// STAGE: pbsdk: error: unknown stage 'nosuchstage'; stages are: input, isolate-contractions, fuse, bufferize
// TARGET: pbsdk: error: unknown target 'nosuchtarget' (installed targets: cpu
