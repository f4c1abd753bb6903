/* tfevents.c - TensorBoard event file writer (see tfevents.h).
 *
 * CRC-32C is our own table-driven code: Debian's CRC-32C implementations are Intel's ISA-L
 * (libisal-dev ships only libisal.so, and the lent GPU machine, which runs the same binary,
 * has none) and python3-crc32c; no static C library serves, and the checksum is 20 lines. */
#include "src/formats/tfevents.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "src/core/err.h"
#include "src/core/fsutil.h"

#ifdef FT_HAVE_TFEVENTS
#include "src/formats/tb_event.pb-c.h"
#endif

/* RFC 3720 B.4: CRC-32C, the Castagnoli polynomial 0x1EDC6F41, bit-reflected 0x82F63B78. */
static uint32_t crc_table[256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

static void crc_table_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        crc_table[i] = c;
    }
}

uint32_t ft_crc32c(uint32_t crc, const void *p, size_t n)
{
    pthread_once(&crc_once, crc_table_init);
    const uint8_t *b = p;
    crc = ~crc;
    for (size_t i = 0; i < n; i++) crc = crc_table[(crc ^ b[i]) & 0xff] ^ (crc >> 8);
    return ~crc;
}

/* tensorflow/core/lib/hash/crc32c.h Mask(): a CRC stored next to the data it covers is
 * rotated and offset, so that the CRC of data holding CRCs stays well distributed. */
uint32_t ft_tfrecord_masked_crc(const void *p, size_t n)
{
    uint32_t c = ft_crc32c(0, p, n);
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

static void put_le(uint8_t *d, uint64_t v, int bytes)
{
    for (int i = 0; i < bytes; i++) d[i] = (uint8_t)(v >> (8 * i));
}

void ft_tfrecord_frame(uint8_t *rec, const void *data, size_t n)
{
    put_le(rec, (uint64_t)n, 8);
    put_le(rec + 8, ft_tfrecord_masked_crc(rec, 8), 4);
    if (n && (const uint8_t *)data != rec + 12) memcpy(rec + 12, data, n);
    put_le(rec + 12 + n, ft_tfrecord_masked_crc(data, n), 4);
}

struct ft_tfevents {
    int fd;
    char path[4200];
};

const char *ft_tfevents_path(const ft_tfevents *w)
{
    return w ? w->path : "";
}

void ft_tfevents_close(ft_tfevents *w)
{
    if (!w) return;
    if (w->fd >= 0) close(w->fd);
    free(w);
}

#ifndef FT_HAVE_TFEVENTS

int ft_tfevents_available(void)
{
    return 0;
}

int ft_tfevents_open(ft_tfevents **out, const char *dir, double wall_time)
{
    (void)wall_time;
    *out = NULL;
    return ft_err(FT_E_UNSUPPORTED, "%s: TensorBoard event files: this ftune was built without protobuf-c (Debian: libprotobuf-c-dev protobuf-c-compiler; install them and rebuild)", dir);
}

int ft_tfevents_scalars(ft_tfevents *w, int64_t step, double wall_time, const char *const *tags,
                        const float *values, int n)
{
    return ft_err(FT_E_UNSUPPORTED, "TensorBoard event files: built without protobuf-c");
}

int ft_tfevents_text(ft_tfevents *w, int64_t step, double wall_time, const char *tag,
                     const char *const *cells, int64_t rows, int64_t cols)
{
    return ft_err(FT_E_UNSUPPORTED, "TensorBoard event files: built without protobuf-c");
}

#else

int ft_tfevents_available(void)
{
    return 1;
}

/* Packs ev and writes it as one record in one write(2) (retried on a short write). */
static int write_event(ft_tfevents *w, const Tensorboard__Event *ev)
{
    size_t n = tensorboard__event__get_packed_size(ev);
    uint8_t *rec = malloc(n + 16);
    if (!rec) return ft_err(-ENOMEM, "%s: out of memory", w->path);
    tensorboard__event__pack(ev, rec + 12);
    ft_tfrecord_frame(rec, rec + 12, n); /* the data are packed in place */
    size_t done = 0, len = n + 16;
    int rc = 0;
    while (done < len) {
        ssize_t k = write(w->fd, rec + done, len - done);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) {
            rc = ft_err(k < 0 ? -errno : -EIO, "%s: write failed: %s", w->path,
                        strerror(k < 0 ? errno : EIO));
            break;
        }
        done += (size_t)k;
    }
    free(rec);
    return rc;
}

/* One Event at (wall_time, step) holding a Summary of values[0, n), written as a record. */
static int write_summary(ft_tfevents *w, double wall_time, int64_t step,
                         Tensorboard__Summary__Value **values, size_t n)
{
    Tensorboard__Summary sum = TENSORBOARD__SUMMARY__INIT;
    sum.n_value = n;
    sum.value = values;
    Tensorboard__Event ev = TENSORBOARD__EVENT__INIT;
    ev.wall_time = wall_time;
    ev.step = step;
    ev.what_case = TENSORBOARD__EVENT__WHAT_SUMMARY;
    ev.summary = &sum;
    return write_event(w, &ev);
}

int ft_tfevents_open(ft_tfevents **out, const char *dir, double wall_time)
{
    *out = NULL;
    FT_TRY(ft_mkdir_p(dir));
    ft_tfevents *w = calloc(1, sizeof *w);
    if (!w) return ft_err(-ENOMEM, "%s: out of memory", dir);
    w->fd = -1;
    char host[256] = "localhost";
    if (gethostname(host, sizeof host - 1) != 0 || !host[0]) snprintf(host, sizeof host, "localhost");
    host[sizeof host - 1] = 0;
    for (int k = 0; w->fd < 0; k++) {
        char name[400];
        int nl = snprintf(name, sizeof name, "events.out.tfevents.%010lld.%s", (long long)wall_time, host);
        if (k) snprintf(name + nl, sizeof name - (size_t)nl, ".%d", k);
        int rc = ft_path_join(w->path, sizeof w->path, dir, name);
        if (rc < 0) {
            free(w);
            return rc;
        }
        w->fd = open(w->path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (w->fd < 0 && (errno != EEXIST || k >= 1000)) {
            int e = errno;
            ft_tfevents_close(w);
            return ft_err(-e, "%s: cannot create: %s", w->path, strerror(e));
        }
    }
    Tensorboard__Event ev = TENSORBOARD__EVENT__INIT;
    Tensorboard__SourceMetadata src = TENSORBOARD__SOURCE_METADATA__INIT;
    src.writer = "ftune";
    ev.wall_time = wall_time;
    ev.what_case = TENSORBOARD__EVENT__WHAT_FILE_VERSION;
    ev.file_version = "brain.Event:2";
    ev.source_metadata = &src;
    int rc = write_event(w, &ev);
    if (!rc) {
        Tensorboard__Event st = TENSORBOARD__EVENT__INIT;
        Tensorboard__SessionLog sl = TENSORBOARD__SESSION_LOG__INIT;
        sl.status = TENSORBOARD__SESSION_LOG__SESSION_STATUS__START;
        st.wall_time = wall_time;
        st.step = 0;
        st.what_case = TENSORBOARD__EVENT__WHAT_SESSION_LOG;
        st.session_log = &sl;
        rc = write_event(w, &st);
    }
    if (rc) {
        ft_tfevents_close(w);
        return rc;
    }
    *out = w;
    return 0;
}

int ft_tfevents_scalars(ft_tfevents *w, int64_t step, double wall_time, const char *const *tags,
                        const float *values, int n)
{
    if (n <= 0) return 0;
    Tensorboard__Summary__Value *vals = calloc((size_t)n, sizeof *vals);
    Tensorboard__Summary__Value **ptrs = calloc((size_t)n, sizeof *ptrs);
    if (!vals || !ptrs) {
        free(vals);
        free(ptrs);
        return ft_err(-ENOMEM, "%s: out of memory", w->path);
    }
    for (int i = 0; i < n; i++) {
        Tensorboard__Summary__Value v = TENSORBOARD__SUMMARY__VALUE__INIT;
        v.tag = (char *)tags[i];
        v.value_case = TENSORBOARD__SUMMARY__VALUE__VALUE_SIMPLE_VALUE;
        v.simple_value = values[i];
        vals[i] = v;
        ptrs[i] = &vals[i];
    }
    int rc = write_summary(w, wall_time, step, ptrs, (size_t)n);
    free(vals);
    free(ptrs);
    return rc;
}

/* tensorflow/core/framework/types.proto DT_STRING; summary.proto DATA_CLASS_TENSOR */
#define TB_DT_STRING 7
#define TB_DATA_CLASS_TENSOR 2

int ft_tfevents_text(ft_tfevents *w, int64_t step, double wall_time, const char *tag,
                     const char *const *cells, int64_t rows, int64_t cols)
{
    if (rows < 1 || cols < 1)
        return ft_err(FT_E_INVALID, "%s: a text summary of %lld x %lld cells", w->path,
                      (long long)rows, (long long)cols);
    const size_t n = (size_t)(rows * cols);
    ProtobufCBinaryData *sv = calloc(n, sizeof *sv);
    if (!sv) return ft_err(-ENOMEM, "%s: out of memory", w->path);
    for (size_t i = 0; i < n; i++) sv[i] = (ProtobufCBinaryData){strlen(cells[i]), (uint8_t *)cells[i]};
    Tensorboard__TensorShapeProto__Dim dims[2] = {TENSORBOARD__TENSOR_SHAPE_PROTO__DIM__INIT,
                                                  TENSORBOARD__TENSOR_SHAPE_PROTO__DIM__INIT};
    Tensorboard__TensorShapeProto__Dim *dp[2] = {&dims[0], &dims[1]};
    dims[0].size = rows;
    dims[1].size = cols;
    Tensorboard__TensorShapeProto shape = TENSORBOARD__TENSOR_SHAPE_PROTO__INIT;
    shape.n_dim = 2;
    shape.dim = dp;
    Tensorboard__TensorProto t = TENSORBOARD__TENSOR_PROTO__INIT;
    t.dtype = TB_DT_STRING;
    t.tensor_shape = &shape;
    t.n_string_val = n;
    t.string_val = sv;
    Tensorboard__SummaryMetadata__PluginData pd = TENSORBOARD__SUMMARY_METADATA__PLUGIN_DATA__INIT;
    pd.plugin_name = "text";
    Tensorboard__SummaryMetadata md = TENSORBOARD__SUMMARY_METADATA__INIT;
    md.plugin_data = &pd;
    md.data_class = TB_DATA_CLASS_TENSOR;
    Tensorboard__Summary__Value v = TENSORBOARD__SUMMARY__VALUE__INIT;
    Tensorboard__Summary__Value *vp = &v;
    v.tag = (char *)tag;
    v.metadata = &md;
    v.value_case = TENSORBOARD__SUMMARY__VALUE__VALUE_TENSOR;
    v.tensor = &t;
    int rc = write_summary(w, wall_time, step, &vp, 1);
    free(sv);
    return rc;
}

#endif
