// `pbsdk opt` refuses bad input with one line on stderr and exit status 2, never a traceback.
// RUN: not %pbsdk opt %s -p nosuch-pass 2>&1 | filecheck %s --check-prefix=UNKNOWN
// RUN: not %pbsdk opt %s --target template -p nosuch-pass 2>&1 | filecheck %s --check-prefix=TARGET
// RUN: not %pbsdk opt %s -p 'math-approx{nope=1}' 2>&1 | filecheck %s --check-prefix=PASSOPT
// RUN: not %pbsdk opt %s -p 'canonicalize{nope=1}' 2>&1 | filecheck %s --check-prefix=UPOPT
// RUN: not %pbsdk opt %s -p 'func.func(cse' 2>&1 | filecheck %s --check-prefix=PARENS
// RUN: not %pbsdk opt %s -p fuse --options nope=1 2>&1 | filecheck %s --check-prefix=OPTION
// RUN: not %pbsdk opt %s -p fuse-rows --options fuse_rows=false 2>&1 | filecheck %s --check-prefix=TARGETOPT
// RUN: not %pbsdk opt %s --split-input-file -p fuse 2>&1 | filecheck %s --check-prefix=PARSE
// RUN: not %pbsdk opt %s --split-input-file --target cpu -p llvm-ir 2>&1 | filecheck %s --check-prefix=STAGE

// UNKNOWN: pbsdk: error: unknown pass 'nosuch-pass': not a pbsdk pass (pbsdk passes: input, isolate-contractions, fuse, bufferize, copy-strided-casts, distinct-results, dynamic-results, out-params, forward-outputs, collapse-loops, copies-to-linalg, dedupe-functions, dynamic-expand, dynamic-sizes, expose-rows, fill-borders, fuse-rows, math-approx, plan-workspace, promote{{(, [a-z-]+)*}}) and not an upstream MLIR pass ('nosuch-pass' does not refer to a registered pass or pass pipeline)
// UNKNOWN-NOT: Traceback
// TARGET: pbsdk: error: unknown pass 'nosuch-pass': not a pbsdk pass (pbsdk passes: {{.*}}; target 'template' adds: {{.*}}matrix-unit, vector-unit, dma, {{.*}}) and not an upstream MLIR pass
// PASSOPT: pbsdk: error: pass 'math-approx' has no option 'nope' (options: ops)
// UPOPT: pbsdk: error: upstream pass 'canonicalize{nope=1}': <Pass-Options-Parser>: no such option nope
// PARENS: pbsdk: error: unclosed '(' in pass pipeline 'func.func(cse'
// OPTION: pbsdk: error: unknown option 'nope'; known options (pbsdk's): {{.*}}threads{{.*}}
// A target's own option needs the target: the error names the target that takes it.
// TARGETOPT: pbsdk: error: unknown option 'fuse_rows'; known options (pbsdk's): {{.*}}threads{{.*}} ('fuse_rows' is an option of target 'cpu': give --target)
// The first chunk compiles; the second does not parse, and says so.
// PARSE: func.func @ok
// PARSE: // -----
// PARSE: pbsdk: error: in stage 'parse': cannot parse the input MLIR
// PARSE: unregistered dialect
// A stage run on IR it does not expect fails as it would in a compile, naming the stage and the op.
// STAGE: pbsdk: error: in stage 'llvm-ir', op 'func.return': op 'func.return' was not lowered to the LLVM dialect
func.func @ok(%a: tensor<4xf32>) -> tensor<4xf32> {
  return %a : tensor<4xf32>
}

// -----

func.func @bad(%a: tensor<4xf32>) -> tensor<4xf32> {
  %b = "nope.op"(%a) : (tensor<4xf32>) -> tensor<4xf32>
  return %b : tensor<4xf32>
}
