/* A fake CUDA driver for testing pbsdk's nvgpu runtime without a GPU: memory is host memory, a kernel
   launch is recorded (kernel name, grid, block, shared bytes, the first FAKE_CUDA_NARGS pointer arguments)
   and, with FAKE_CUDA_COPY=N, copies N bytes from its argument 0 to its argument 1. Build:
   cc -shared -fPIC -o libfakecuda.so fake_cuda.c */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef uint64_t CUdeviceptr;
static char names[64][128];
static int n_names = 0;
static char log_buf[65536];
static size_t log_len = 0;
static int cc_major = 8, cc_minor = 0;

int cuInit(unsigned flags) { (void)flags; const char *e = getenv("FAKE_CUDA_CC");
  if (e) { cc_major = e[0] - '0'; cc_minor = e[1] - '0'; } return 0; }
int cuGetErrorString(int rc, const char **s) { (void)rc; *s = "fake error"; return 0; }
int cuDeviceGetCount(int *n) { *n = 1; return 0; }
int cuDeviceGet(int *d, int i) { *d = i; return 0; }
int cuDevicePrimaryCtxRetain(void **ctx, int d) { (void)d; *ctx = (void *)1; return 0; }
int cuCtxSetCurrent(void *ctx) { (void)ctx; return 0; }
int cuDeviceGetAttribute(int *v, int attr, int d) { (void)d; *v = attr == 75 ? cc_major : cc_minor; return 0; }
int cuModuleLoadData(void **m, const void *image) {
  const char *bad = getenv("FAKE_CUDA_REJECT");  /* "cubin": refuse ELF images, to test the PTX fallback */
  if (bad && memcmp(image, "\x7f" "ELF", 4) == 0) return 209;
  *m = (void *)2; return 0; }
int cuModuleUnload(void *m) { (void)m; return 0; }
int cuModuleGetFunction(void **f, void *m, const char *name) { (void)m;
  strncpy(names[n_names], name, 127); *f = (void *)(intptr_t)(n_names + 1); n_names++; return 0; }
int cuMemAlloc_v2(CUdeviceptr *p, size_t n) { *p = (CUdeviceptr)(uintptr_t)calloc(1, n); return 0; }
int cuMemFree_v2(CUdeviceptr p) { free((void *)(uintptr_t)p); return 0; }
int cuMemcpyHtoD_v2(CUdeviceptr d, const void *h, size_t n) { memcpy((void *)(uintptr_t)d, h, n); return 0; }
int cuMemcpyDtoH_v2(void *h, CUdeviceptr d, size_t n) { memcpy(h, (void *)(uintptr_t)d, n); return 0; }
int cuCtxSynchronize(void) { return 0; }
int cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                   unsigned smem, void *stream, void **params, void **extra) {
  (void)stream; (void)extra;
  int i = (int)(intptr_t)f - 1;
  log_len += snprintf(log_buf + log_len, sizeof log_buf - log_len, "%s %u,%u,%u %u,%u,%u %u", names[i], gx, gy, gz,
                      bx, by, bz, smem);
  int n;
  const char *na = getenv("FAKE_CUDA_NARGS");  /* how many pointer arguments to log per launch (default 0) */
  int nargs = na ? atoi(na) : 0;
  for (n = 0; n < nargs; n++) log_len += snprintf(log_buf + log_len, sizeof log_buf - log_len, " %llu",
                                                  (unsigned long long)*(CUdeviceptr *)params[n]);
  log_len += snprintf(log_buf + log_len, sizeof log_buf - log_len, "\n");
  const char *cp = getenv("FAKE_CUDA_COPY");  /* copy this many bytes from argument 0 to argument 1 */
  if (cp && nargs >= 2) memcpy((void *)(uintptr_t)*(CUdeviceptr *)params[1],
                               (void *)(uintptr_t)*(CUdeviceptr *)params[0], (size_t)atoi(cp));
  return 0;
}
const char *fake_log(void) { return log_buf; }
