/* pbsdk deploy runtime, C API: load a .pbsdk file written by pbsdk.export and call its entries.
 *
 * Needs libc, libdl and (for the code inside the file) libgomp and libm; no compiler, no Python.
 * Build: `make runtime-c` (build/runtime/libpbsdk_runtime.so). See docs/deploy.md.
 *
 * Every function reports failure as a pbsdk_status and, where given a buffer, a one-line message. Loading
 * checks the file as pbsdk.runtime.load does (format, version, CRC-32 of every part, target, machine, CPU
 * features); a damaged or foreign file is an error code, never a crash. Host code only: files of the cpu
 * and template targets; an nvgpu file is PBSDK_ERR_TARGET (pbsdk.runtime runs it through the CUDA driver). pbsdk_run may be called from
 * several threads at once on one model.
 */
#ifndef PBSDK_RUNTIME_H
#define PBSDK_RUNTIME_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  PBSDK_OK = 0,
  PBSDK_ERR_IO = 1,           /* the file cannot be opened or read */
  PBSDK_ERR_FORMAT = 2,       /* not a pbsdk artifact, or a malformed index */
  PBSDK_ERR_TRUNCATED = 3,    /* shorter than its header says */
  PBSDK_ERR_CHECKSUM = 4,     /* a part's CRC-32 does not match: damaged */
  PBSDK_ERR_VERSION = 5,      /* a format version this runtime does not read */
  PBSDK_ERR_TARGET = 6,       /* code for another target (nvgpu: GPU code), machine or OS */
  PBSDK_ERR_CPU_FEATURES = 7, /* code for CPU features this host lacks */
  PBSDK_ERR_LIBRARY = 8,      /* the dynamic loader refused the code */
  PBSDK_ERR_INPUT = 9,        /* wrong entry, argument count, dtype or shape */
  PBSDK_ERR_MEMORY = 10       /* out of memory */
} pbsdk_status;

typedef struct pbsdk_model pbsdk_model;

/* A tensor: data (C order, dense), dtype as numpy names it ("float32", "float16", "bfloat16", "float64",
 * "int8", "int32"), rank and shape. */
typedef struct {
  void *data;
  const char *dtype;
  int ndim;
  const int64_t *shape;
} pbsdk_tensor;

/* Load `path`. verify != 0 also checks the weights' checksums (the code's always are). On success *out is
 * the model (free it with pbsdk_unload); otherwise *out is NULL and `err` (if not NULL) holds the reason. */
pbsdk_status pbsdk_load(const char *path, int verify, pbsdk_model **out, char *err, size_t err_len);
void pbsdk_unload(pbsdk_model *model);

int pbsdk_num_entries(const pbsdk_model *model);
const char *pbsdk_entry_name(const pbsdk_model *model, int entry);
int pbsdk_find_entry(const pbsdk_model *model, const char *name); /* -1 when absent */
int pbsdk_num_inputs(const pbsdk_model *model, int entry);
int pbsdk_num_outputs(const pbsdk_model *model, int entry);
/* The expected input/output (data is NULL); NULL for an index out of range. */
const pbsdk_tensor *pbsdk_input(const pbsdk_model *model, int entry, int i);
const pbsdk_tensor *pbsdk_output(const pbsdk_model *model, int entry, int i);
size_t pbsdk_tensor_bytes(const pbsdk_tensor *t);

/* Run `entry` on inputs[0..n_inputs) writing outputs[0..n_outputs) (caller-allocated, each of the expected
 * size). Count, dtype and shape of each are checked first (PBSDK_ERR_INPUT). Thread-safe. */
pbsdk_status pbsdk_run(pbsdk_model *model, int entry, const pbsdk_tensor *inputs, int n_inputs,
                       const pbsdk_tensor *outputs, int n_outputs, char *err, size_t err_len);

const char *pbsdk_status_name(pbsdk_status status);
uint32_t pbsdk_crc32(const void *data, size_t len, uint32_t crc);

#ifdef __cplusplus
}
#endif
#endif
