/* The C API's test program (tests/deploy/test_c_api.py builds and runs it).
 *
 *   run_model MODEL                       load only; print "status <name>" and the message, exit with the status
 *   run_model MODEL IN.bin... OUT.bin...  run the only entry on raw C-order inputs, write raw outputs; the
 *                                         entry is also run on two threads at once, and with a wrong shape
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pbsdk_runtime.h"

typedef struct {
  pbsdk_model *m;
  pbsdk_tensor *in, *out;
  int n_in, n_out;
  pbsdk_status status;
} job;

static void *run_job(void *p) {
  job *j = p;
  char err[512];
  j->status = pbsdk_run(j->m, 0, j->in, j->n_in, j->out, j->n_out, err, sizeof err);
  return NULL;
}

static pbsdk_tensor *fresh(const pbsdk_model *m, int n, int output) {
  pbsdk_tensor *t = calloc(n, sizeof *t);
  for (int i = 0; i < n; i++) {
    t[i] = *(output ? pbsdk_output(m, 0, i) : pbsdk_input(m, 0, i));
    t[i].data = calloc(1, pbsdk_tensor_bytes(&t[i]) + 1);
  }
  return t;
}

int main(int argc, char **argv) {
  char err[512];
  pbsdk_model *m;
  if (argc < 2) return 64;
  pbsdk_status s = pbsdk_load(argv[1], 1, &m, err, sizeof err);
  printf("status %s\n%s\n", pbsdk_status_name(s), err);
  if (s != PBSDK_OK || argc == 2) {
    pbsdk_unload(m);
    return (int)s;
  }
  int n_in = pbsdk_num_inputs(m, 0), n_out = pbsdk_num_outputs(m, 0);
  if (argc != 2 + n_in + n_out) {
    fprintf(stderr, "entry %s takes %d inputs and %d outputs\n", pbsdk_entry_name(m, 0), n_in, n_out);
    return 64;
  }
  pbsdk_tensor *in = fresh(m, n_in, 0), *out = fresh(m, n_out, 1), *out2 = fresh(m, n_out, 1);
  for (int i = 0; i < n_in; i++) {
    FILE *f = fopen(argv[2 + i], "rb");
    size_t want = pbsdk_tensor_bytes(&in[i]);
    if (!f || fread(in[i].data, 1, want, f) != want) { fprintf(stderr, "cannot read %s\n", argv[2 + i]); return 65; }
    fclose(f);
  }
  /* Two calls in flight at once, then their outputs must agree. */
  job a = {m, in, out, n_in, n_out, PBSDK_OK}, b = {m, in, out2, n_in, n_out, PBSDK_OK};
  pthread_t ta, tb;
  pthread_create(&ta, NULL, run_job, &a);
  pthread_create(&tb, NULL, run_job, &b);
  pthread_join(ta, NULL);
  pthread_join(tb, NULL);
  if (a.status != PBSDK_OK || b.status != PBSDK_OK) { fprintf(stderr, "run failed\n"); return 66; }
  for (int i = 0; i < n_out; i++)
    if (memcmp(out[i].data, out2[i].data, pbsdk_tensor_bytes(&out[i])) != 0) { fprintf(stderr, "threads differ\n"); return 67; }
  /* A wrong shape is an input error. */
  int64_t bad_shape[16] = {0};
  pbsdk_tensor bad = in[0];
  bad.shape = bad_shape;
  s = pbsdk_run(m, 0, &bad, 1, out, n_out, err, sizeof err);
  printf("wrong-shape %s: %s\n", pbsdk_status_name(s), err);
  if (s != PBSDK_ERR_INPUT) return 68;
  for (int i = 0; i < n_out; i++) {
    FILE *f = fopen(argv[2 + n_in + i], "wb");
    fwrite(out[i].data, 1, pbsdk_tensor_bytes(&out[i]), f);
    fclose(f);
  }
  printf("ran %s\n", pbsdk_entry_name(m, 0));
  pbsdk_unload(m);
  return 0;
}
