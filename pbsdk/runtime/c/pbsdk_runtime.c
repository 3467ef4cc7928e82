/* pbsdk deploy runtime, C implementation. The file format is pbsdk/runtime/format.py's: a 128-byte
 * header, sections (code libraries, weights), a JSON manifest and a line-oriented index, which is what this
 * runtime reads. See pbsdk_runtime.h for the API. */
#define _GNU_SOURCE
#include "pbsdk_runtime.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/utsname.h>
#include <unistd.h>

#define MAGIC "PBSDKDPL"
#define FORMAT_VERSION 1u
#define HEADER_SIZE 128u
#define HEADER_FIELDS 64u /* bytes covered by the header's CRC */
#define MAX_FREE_WORKSPACES 8

typedef struct { uint64_t offset, size; uint32_t crc; } section;

typedef struct {
  char name[128];
  char symbol[128];
  int code;
  int n_in, n_const, n_out;
  uint64_t workspace;
  pbsdk_tensor *in, *out; /* shapes point into `dims` */
  const char **takes;     /* per input: the dtype the code takes when callers pass another (in[i].dtype), or NULL */
  int64_t *dims;
  int *consts;
  void *lib;
  int fd; /* the in-memory file the library was loaded from: open while it is loaded (see open_code) */
  void (*fn)(void **);
  pthread_mutex_t lock;
  void *free_ws[MAX_FREE_WORKSPACES];
  int n_free;
} entry;

struct pbsdk_model {
  const uint8_t *map;
  size_t size;
  char *index; /* a NUL-terminated copy of the index, tokenised in place */
  size_t index_len; /* its length before tokenising: an upper bound on any count it holds */
  int n_sections;
  section *sections;
  int n_entries;
  entry *entries;
};

static pbsdk_status fail(pbsdk_status s, char *err, size_t len, const char *fmt, ...) {
  if (err && len) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, len, fmt, ap);
    va_end(ap);
  }
  return s;
}

/* ------------------------------------------------------------------------------------------- CRC-32 */

static uint32_t crc_table[8][256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

static void crc_init(void) {
  for (uint32_t i = 0; i < 256; i++) {
    uint32_t c = i;
    for (int k = 0; k < 8; k++) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
    crc_table[0][i] = c;
  }
  for (uint32_t i = 0; i < 256; i++)
    for (int t = 1; t < 8; t++) crc_table[t][i] = (crc_table[t - 1][i] >> 8) ^ crc_table[0][crc_table[t - 1][i] & 0xFF];
}

uint32_t pbsdk_crc32(const void *data, size_t len, uint32_t crc) {
  /* zlib's CRC-32, slicing by 8 */
  pthread_once(&crc_once, crc_init);
  const uint8_t *p = data;
  crc = ~crc;
  while (len >= 8) {
    uint32_t lo, hi;
    memcpy(&lo, p, 4);
    memcpy(&hi, p + 4, 4);
    lo ^= crc;
    crc = crc_table[7][lo & 0xFF] ^ crc_table[6][(lo >> 8) & 0xFF] ^ crc_table[5][(lo >> 16) & 0xFF] ^
          crc_table[4][lo >> 24] ^ crc_table[3][hi & 0xFF] ^ crc_table[2][(hi >> 8) & 0xFF] ^
          crc_table[1][(hi >> 16) & 0xFF] ^ crc_table[0][hi >> 24];
    p += 8;
    len -= 8;
  }
  while (len--) crc = crc_table[0][(crc ^ *p++) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

/* ------------------------------------------------------------------------------------------- index */

static uint64_t rd64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }
static uint32_t rd32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }

typedef struct { char *save; int bad; } tokens;

static char *tok(tokens *t) {
  char *s = strtok_r(NULL, " \n", &t->save);
  if (!s) t->bad = 1;
  return s ? s : "";
}

static long long num(tokens *t) {
  char *s = tok(t), *end;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (*s == 0 || *end != 0 || errno || v < 0) t->bad = 1;
  return v;
}

static int expect(tokens *t, const char *word) {
  if (strcmp(tok(t), word) != 0) t->bad = 1;
  return !t->bad;
}

static int read_tensor(tokens *t, const char *kind, pbsdk_tensor *out, const char **given, int64_t **dims,
                       int64_t *end) {
  if (!expect(t, kind)) return 0;
  out->dtype = tok(t);
  *given = tok(t);
  if (strcmp(*given, "-") == 0) *given = NULL;
  long long nd = num(t);
  if (t->bad || nd > 16 || *dims + nd > end) return (t->bad = 1, 0);
  out->ndim = (int)nd;
  out->shape = *dims;
  for (int i = 0; i < nd; i++) (*dims)[i] = num(t);
  *dims += nd;
  out->data = NULL;
  return !t->bad;
}

static int parse_entries(pbsdk_model *m, tokens *t) {
  size_t limit = m->index_len;
  if (!expect(t, "entries")) return 0;
  long long n = num(t);
  if (t->bad || (size_t)n > limit) return 0;
  m->entries = calloc(n ? n : 1, sizeof(entry));
  if (!m->entries) return 0;
  m->n_entries = (int)n;
  for (int e = 0; e < n && !t->bad; e++) {
    entry *en = &m->entries[e];
    pthread_mutex_init(&en->lock, NULL);
    if (!expect(t, "e")) return 0;
    snprintf(en->name, sizeof en->name, "%s", tok(t));
    snprintf(en->symbol, sizeof en->symbol, "%s", tok(t));
    en->code = (int)num(t);
    long long ni = num(t), nc = num(t), no = num(t);
    en->workspace = (uint64_t)num(t);
    if (t->bad || (size_t)(ni + nc + no) > limit || en->code >= m->n_sections) return (t->bad = 1, 0);
    en->n_in = (int)ni, en->n_const = (int)nc, en->n_out = (int)no;
    en->in = calloc(ni + 1, sizeof(pbsdk_tensor));
    en->out = calloc(no + 1, sizeof(pbsdk_tensor));
    en->consts = calloc(nc + 1, sizeof(int));
    en->takes = calloc(ni + 1, sizeof(char *));
    en->dims = calloc(16 * (ni + no) + 1, sizeof(int64_t));
    if (!en->in || !en->out || !en->consts || !en->dims || !en->takes) return 0;
    int64_t *dims = en->dims, *end = en->dims + 16 * (ni + no);
    for (int i = 0; i < ni; i++) {
      if (!read_tensor(t, "i", &en->in[i], &en->takes[i], &dims, end)) return 0;
      if (en->takes[i]) { /* the index says (code's dtype, given dtype): callers see the given one */
        const char *code = en->in[i].dtype;
        en->in[i].dtype = en->takes[i];
        en->takes[i] = code;
      }
    }
    for (int i = 0; i < nc; i++) {
      if (!expect(t, "c")) return 0;
      en->consts[i] = (int)num(t);
      if (en->consts[i] >= m->n_sections) return (t->bad = 1, 0);
    }
    for (int i = 0; i < no; i++) {
      const char *ignored;
      if (!read_tensor(t, "o", &en->out[i], &ignored, &dims, end)) return 0;
    }
  }
  return !t->bad && expect(t, "end");
}

/* The CPU flags Linux lists in /proc/cpuinfo, space-separated and padded with spaces; NULL if unreadable. */
static char *cpu_flags(void) {
  FILE *f = fopen("/proc/cpuinfo", "r");
  if (!f) return NULL;
  char *line = NULL, *found = NULL;
  size_t cap = 0;
  while (getline(&line, &cap, f) > 0) {
    if (strncmp(line, "flags", 5) == 0) {
      char *colon = strchr(line, ':');
      if (colon && (found = malloc(strlen(colon) + 3))) {
        sprintf(found, " %s ", colon + 1);
        for (char *c = found; *c; c++) if (*c == '\n' || *c == '\t') *c = ' ';
      }
      break;
    }
  }
  free(line);
  fclose(f);
  return found;
}

static pbsdk_status check_host(tokens *t, char *err, size_t len) {
  if (!expect(t, "target")) return fail(PBSDK_ERR_FORMAT, err, len, "malformed index (target)");
  const char *target = tok(t);
  /* cpu code and the template's emulation (and targets derived from it) are host shared libraries alike */
  if (strcmp(target, "nvgpu") == 0)
    return fail(PBSDK_ERR_TARGET, err, len, "the file holds GPU code (target 'nvgpu'); this runtime runs host code "
                "('cpu', 'template'): load it with pbsdk.runtime (Python, CUDA driver) where a GPU is");
  if (strcmp(target, "cpu") != 0 && strcmp(target, "template") != 0)
    return fail(PBSDK_ERR_TARGET, err, len, "the file holds code for target '%s'; this runtime runs 'cpu' and "
                "'template'", target);
  if (!expect(t, "machine")) return fail(PBSDK_ERR_FORMAT, err, len, "malformed index (machine)");
  const char *machine = tok(t);
  struct utsname u;
  if (uname(&u) != 0 || strcmp(u.machine, machine) != 0)
    return fail(PBSDK_ERR_TARGET, err, len, "the code was compiled for %s; this host is %s", machine, u.machine);
  if (!expect(t, "amx")) return fail(PBSDK_ERR_FORMAT, err, len, "malformed index (amx)");
  long long amx = num(t);
  if (!expect(t, "features")) return fail(PBSDK_ERR_FORMAT, err, len, "malformed index (features)");
  long long n = num(t);
  if (t->bad) return fail(PBSDK_ERR_FORMAT, err, len, "malformed index (features)");
  char *flags = cpu_flags();
  char missing[512] = "";
  for (long long i = 0; i < n; i++) {
    const char *want = tok(t);
    char pattern[80];
    snprintf(pattern, sizeof pattern, " %s ", want);
    if (!flags || !strstr(flags, pattern)) {
      size_t used = strlen(missing);
      snprintf(missing + used, sizeof missing - used, "%s%s", used ? ", " : "", want);
    }
  }
  free(flags);
  if (t->bad) return fail(PBSDK_ERR_FORMAT, err, len, "malformed index (features)");
  if (missing[0])
    return fail(PBSDK_ERR_CPU_FEATURES, err, len, "the code was compiled for CPU features this host lacks: %s", missing);
  if (amx && syscall(SYS_arch_prctl, 0x1023, 18) != 0)
    return fail(PBSDK_ERR_LIBRARY, err, len, "the code uses AMX tiles and Linux did not grant their state");
  return PBSDK_OK;
}

/* ------------------------------------------------------------------------------------------- loading */

static pbsdk_status check_header(pbsdk_model *m, uint64_t *idx_off, uint64_t *idx_len, char *err, size_t len) {
  const uint8_t *h = m->map;
  if (m->size < 12) return fail(PBSDK_ERR_TRUNCATED, err, len, "the file is %zu bytes: too short", m->size);
  if (memcmp(h, MAGIC, 8) != 0) return fail(PBSDK_ERR_FORMAT, err, len, "not a pbsdk deploy artifact (magic)");
  if (rd32(h + 8) != FORMAT_VERSION)
    return fail(PBSDK_ERR_VERSION, err, len, "format version %u; this runtime reads version %u", rd32(h + 8),
                FORMAT_VERSION);
  if (m->size < HEADER_SIZE) return fail(PBSDK_ERR_TRUNCATED, err, len, "the file is shorter than its header");
  if (pbsdk_crc32(h, HEADER_FIELDS, 0) != rd32(h + HEADER_FIELDS))
    return fail(PBSDK_ERR_CHECKSUM, err, len, "the header's checksum does not match: the file is damaged");
  uint64_t size = rd64(h + 16);
  if (m->size < size) return fail(PBSDK_ERR_TRUNCATED, err, len, "the file is %zu bytes; its header says %llu",
                                  m->size, (unsigned long long)size);
  if (m->size > size) return fail(PBSDK_ERR_FORMAT, err, len, "the file is longer than its header says");
  uint64_t moff = rd64(h + 24), mlen = rd64(h + 32);
  *idx_off = rd64(h + 44), *idx_len = rd64(h + 52);
  if (moff < HEADER_SIZE || moff > size || mlen > size - moff || *idx_off < HEADER_SIZE || *idx_off > size ||
      *idx_len > size - *idx_off)
    return fail(PBSDK_ERR_FORMAT, err, len, "the manifest or index lies outside the file");
  if (pbsdk_crc32(h + moff, mlen, 0) != rd32(h + 40))
    return fail(PBSDK_ERR_CHECKSUM, err, len, "the manifest's checksum does not match: the file is damaged");
  if (pbsdk_crc32(h + *idx_off, *idx_len, 0) != rd32(h + 60))
    return fail(PBSDK_ERR_CHECKSUM, err, len, "the index's checksum does not match: the file is damaged");
  return PBSDK_OK;
}

static pbsdk_status parse_index(pbsdk_model *m, tokens *t, char *err, size_t len) {
  strtok_r(m->index, " \n", &t->save); /* "pbsdk-index" */
  if (num(t) != FORMAT_VERSION || t->bad) return fail(PBSDK_ERR_FORMAT, err, len, "malformed index (version)");
  pbsdk_status s = check_host(t, err, len);
  if (s != PBSDK_OK) return s;
  if (!expect(t, "sections")) return fail(PBSDK_ERR_FORMAT, err, len, "malformed index (sections)");
  long long n = num(t);
  if (t->bad || (size_t)n > m->size) return fail(PBSDK_ERR_FORMAT, err, len, "malformed index (sections)");
  m->sections = calloc(n ? n : 1, sizeof(section));
  if (!m->sections) return fail(PBSDK_ERR_MEMORY, err, len, "out of memory");
  m->n_sections = (int)n;
  for (int i = 0; i < n && !t->bad; i++) {
    expect(t, "s");
    m->sections[i].offset = num(t), m->sections[i].size = num(t), m->sections[i].crc = (uint32_t)num(t);
    if (m->sections[i].offset > m->size || m->sections[i].size > m->size - m->sections[i].offset)
      return fail(PBSDK_ERR_FORMAT, err, len, "section %d lies outside the file", i);
  }
  if (t->bad || !parse_entries(m, t)) return fail(PBSDK_ERR_FORMAT, err, len, "malformed index (entries)");
  return PBSDK_OK;
}

static pbsdk_status open_code(pbsdk_model *m, entry *en, char *err, size_t len) {
  section *s = &m->sections[en->code];
  int fd = (int)syscall(SYS_memfd_create, "pbsdk-entry", 0);
  if (fd < 0) return fail(PBSDK_ERR_IO, err, len, "memfd_create failed: %s", strerror(errno));
  size_t done = 0;
  while (done < s->size) {
    ssize_t w = write(fd, m->map + s->offset + done, s->size - done);
    if (w <= 0) { close(fd); return fail(PBSDK_ERR_IO, err, len, "writing the code failed"); }
    done += (size_t)w;
  }
  char path[64];
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  /* The loader knows a library by its path: the file stays open (its number taken) until pbsdk_unload has
   * closed the library, so a later load never gets this path while this library is loaded. */
  en->lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  en->fd = fd;
  if (!en->lib) return fail(PBSDK_ERR_LIBRARY, err, len, "the dynamic loader refused entry %s: %s", en->name, dlerror());
  *(void **)&en->fn = dlsym(en->lib, en->symbol);
  if (!en->fn) return fail(PBSDK_ERR_LIBRARY, err, len, "entry %s's code has no symbol %s", en->name, en->symbol);
  return PBSDK_OK;
}

static pbsdk_status load(pbsdk_model *m, const char *path, int verify, char *err, size_t len) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return fail(PBSDK_ERR_IO, err, len, "cannot open %s: %s", path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0) { close(fd); return fail(PBSDK_ERR_IO, err, len, "cannot stat %s", path); }
  m->size = (size_t)st.st_size;
  if (m->size == 0) { close(fd); return fail(PBSDK_ERR_TRUNCATED, err, len, "the file is empty"); }
  void *map = mmap(NULL, m->size, PROT_READ, MAP_PRIVATE, fd, 0);
  close(fd);
  if (map == MAP_FAILED) return fail(PBSDK_ERR_IO, err, len, "cannot map %s: %s", path, strerror(errno));
  m->map = map;
  uint64_t ioff = 0, ilen = 0;
  pbsdk_status s = check_header(m, &ioff, &ilen, err, len);
  if (s != PBSDK_OK) return s;
  if (!(m->index = malloc(ilen + 1))) return fail(PBSDK_ERR_MEMORY, err, len, "out of memory");
  memcpy(m->index, m->map + ioff, ilen);
  m->index[ilen] = 0;
  m->index_len = ilen;
  tokens t = {m->index, 0};
  if ((s = parse_index(m, &t, err, len)) != PBSDK_OK) return s;
  for (int i = 0; i < m->n_sections; i++) {
    int is_code = 0;
    for (int e = 0; e < m->n_entries; e++) is_code |= m->entries[e].code == i;
    if ((verify || is_code) && pbsdk_crc32(m->map + m->sections[i].offset, m->sections[i].size, 0) != m->sections[i].crc)
      return fail(PBSDK_ERR_CHECKSUM, err, len, "section %d's checksum does not match: the file is damaged", i);
  }
  for (int e = 0; e < m->n_entries; e++)
    if ((s = open_code(m, &m->entries[e], err, len)) != PBSDK_OK) return s;
  return PBSDK_OK;
}

pbsdk_status pbsdk_load(const char *path, int verify, pbsdk_model **out, char *err, size_t err_len) {
  *out = NULL;
  if (err && err_len) err[0] = 0;
  pbsdk_model *m = calloc(1, sizeof *m);
  if (!m) return fail(PBSDK_ERR_MEMORY, err, err_len, "out of memory");
  pbsdk_status s = load(m, path, verify, err, err_len);
  if (s != PBSDK_OK) {
    pbsdk_unload(m);
    return s;
  }
  *out = m;
  return PBSDK_OK;
}

void pbsdk_unload(pbsdk_model *m) {
  if (!m) return;
  for (int e = 0; e < m->n_entries; e++) {
    entry *en = &m->entries[e];
    if (en->lib) dlclose(en->lib);
    if (en->fd > 0) close(en->fd);
    for (int i = 0; i < en->n_free; i++) free(en->free_ws[i]);
    pthread_mutex_destroy(&en->lock);
    free(en->in), free(en->out), free(en->consts), free(en->dims), free(en->takes);
  }
  free(m->entries);
  free(m->sections);
  free(m->index);
  if (m->map) munmap((void *)m->map, m->size);
  free(m);
}

/* ------------------------------------------------------------------------------------------- calls */

static const entry *get(const pbsdk_model *m, int e) { return m && e >= 0 && e < m->n_entries ? &m->entries[e] : NULL; }
int pbsdk_num_entries(const pbsdk_model *m) { return m ? m->n_entries : 0; }
const char *pbsdk_entry_name(const pbsdk_model *m, int e) { return get(m, e) ? get(m, e)->name : NULL; }
int pbsdk_num_inputs(const pbsdk_model *m, int e) { return get(m, e) ? get(m, e)->n_in : -1; }
int pbsdk_num_outputs(const pbsdk_model *m, int e) { return get(m, e) ? get(m, e)->n_out : -1; }

int pbsdk_find_entry(const pbsdk_model *m, const char *name) {
  for (int e = 0; m && e < m->n_entries; e++)
    if (strcmp(m->entries[e].name, name) == 0) return e;
  return -1;
}

const pbsdk_tensor *pbsdk_input(const pbsdk_model *m, int e, int i) {
  const entry *en = get(m, e);
  return en && i >= 0 && i < en->n_in ? &en->in[i] : NULL;
}

const pbsdk_tensor *pbsdk_output(const pbsdk_model *m, int e, int i) {
  const entry *en = get(m, e);
  return en && i >= 0 && i < en->n_out ? &en->out[i] : NULL;
}

static size_t dtype_size(const char *d) {
  if (!strcmp(d, "float64") || !strcmp(d, "int64") || !strcmp(d, "uint64")) return 8;
  if (!strcmp(d, "float32") || !strcmp(d, "int32")) return 4;
  if (!strcmp(d, "float16") || !strcmp(d, "bfloat16") || !strcmp(d, "int16") || !strcmp(d, "uint16")) return 2;
  if (!strcmp(d, "int8") || !strcmp(d, "uint8") || !strcmp(d, "bool")) return 1;
  return 0;
}

size_t pbsdk_tensor_bytes(const pbsdk_tensor *t) {
  size_t n = dtype_size(t->dtype);
  for (int i = 0; i < t->ndim; i++) n *= (size_t)t->shape[i];
  return n;
}

/* A copy of integer input `t` as the floats the code takes (`takes`); NULL if unsupported. */
static void *convert(const pbsdk_tensor *t, const char *takes) {
  size_t n = 1;
  for (int d = 0; d < t->ndim; d++) n *= (size_t)t->shape[d];
  int wide = !strcmp(takes, "float64");
  if (!wide && strcmp(takes, "float32") != 0) return NULL;
  void *out = malloc(n * (wide ? 8 : 4) + 1);
  if (!out) return NULL;
  for (size_t i = 0; i < n; i++) {
    double v;
    if (!strcmp(t->dtype, "int64")) v = (double)((const int64_t *)t->data)[i];
    else if (!strcmp(t->dtype, "int32")) v = (double)((const int32_t *)t->data)[i];
    else { free(out); return NULL; }
    if (wide) ((double *)out)[i] = v; else ((float *)out)[i] = (float)v;
  }
  return out;
}

static pbsdk_status check_args(const pbsdk_tensor *want, const pbsdk_tensor *got, int n, const char *what,
                               char *err, size_t len) {
  for (int i = 0; i < n; i++) {
    const char *expected = want[i].dtype;
    if (!got[i].data) return fail(PBSDK_ERR_INPUT, err, len, "%s %d has no data", what, i);
    if (!got[i].dtype || strcmp(got[i].dtype, expected) != 0)
      return fail(PBSDK_ERR_INPUT, err, len, "%s %d has dtype %s, expected %s", what, i,
                  got[i].dtype ? got[i].dtype : "(null)", expected);
    if (got[i].ndim != want[i].ndim || (want[i].ndim && !got[i].shape))
      return fail(PBSDK_ERR_INPUT, err, len, "%s %d has rank %d, expected %d", what, i, got[i].ndim, want[i].ndim);
    for (int d = 0; d < want[i].ndim; d++)
      if (got[i].shape[d] != want[i].shape[d])
        return fail(PBSDK_ERR_INPUT, err, len, "%s %d has size %lld in dimension %d, expected %lld", what, i,
                    (long long)got[i].shape[d], d, (long long)want[i].shape[d]);
  }
  return PBSDK_OK;
}

pbsdk_status pbsdk_run(pbsdk_model *m, int e, const pbsdk_tensor *inputs, int n_inputs, const pbsdk_tensor *outputs,
                       int n_outputs, char *err, size_t len) {
  entry *en = (entry *)get(m, e);
  if (!en) return fail(PBSDK_ERR_INPUT, err, len, "no entry %d", e);
  if (n_inputs != en->n_in || n_outputs != en->n_out)
    return fail(PBSDK_ERR_INPUT, err, len, "entry %s takes %d inputs and %d outputs, got %d and %d", en->name,
                en->n_in, en->n_out, n_inputs, n_outputs);
  pbsdk_status s = check_args(en->in, inputs, n_inputs, "input", err, len);
  if (s == PBSDK_OK) s = check_args(en->out, outputs, n_outputs, "output", err, len);
  if (s != PBSDK_OK) return s;
  void *converted[64] = {0}; /* inputs converted to the dtype the code takes (`given`) */
  if (en->n_in > 64) return fail(PBSDK_ERR_INPUT, err, len, "more than 64 inputs");
  for (int i = 0; i < en->n_in; i++) {
    if (!en->takes[i]) continue;
    if (!(converted[i] = convert(&inputs[i], en->takes[i]))) {
      for (int j = 0; j < i; j++) free(converted[j]);
      return fail(PBSDK_ERR_INPUT, err, len, "cannot convert input %d from %s to %s", i, en->in[i].dtype, en->takes[i]);
    }
  }
  int n = en->n_in + en->n_const + en->n_out + (en->workspace ? 1 : 0);
  void **args = malloc(sizeof(void *) * (n ? n : 1));
  if (!args) {
    for (int i = 0; i < en->n_in; i++) free(converted[i]);
    return fail(PBSDK_ERR_MEMORY, err, len, "out of memory");
  }
  int k = 0;
  for (int i = 0; i < en->n_in; i++) args[k++] = converted[i] ? converted[i] : inputs[i].data;
  for (int i = 0; i < en->n_const; i++) args[k++] = (void *)(m->map + m->sections[en->consts[i]].offset);
  for (int i = 0; i < en->n_out; i++) args[k++] = outputs[i].data;
  void *ws = NULL;
  if (en->workspace) {
    pthread_mutex_lock(&en->lock);
    if (en->n_free) ws = en->free_ws[--en->n_free];
    pthread_mutex_unlock(&en->lock);
    if (!ws && !(ws = aligned_alloc(64, (en->workspace + 63) / 64 * 64))) {
      free(args);
      for (int i = 0; i < en->n_in; i++) free(converted[i]);
      return fail(PBSDK_ERR_MEMORY, err, len, "out of memory (workspace of %llu bytes)",
                  (unsigned long long)en->workspace);
    }
    args[k++] = ws;
  }
  en->fn(args);
  free(args);
  for (int i = 0; i < en->n_in; i++) free(converted[i]);
  if (ws) {
    pthread_mutex_lock(&en->lock);
    if (en->n_free < MAX_FREE_WORKSPACES) en->free_ws[en->n_free++] = ws, ws = NULL;
    pthread_mutex_unlock(&en->lock);
    free(ws);
  }
  return PBSDK_OK;
}

const char *pbsdk_status_name(pbsdk_status s) {
  static const char *names[] = {"ok", "io", "format", "truncated", "checksum", "version", "target",
                                "cpu-features", "library", "input", "memory"};
  return (unsigned)s < sizeof names / sizeof *names ? names[s] : "unknown";
}
