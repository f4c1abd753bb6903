/* test_tfevents.c - TensorBoard event files (src/formats/tfevents.h): CRC-32C against the
 * check values of RFC 3720 B.4 and the common "123456789" check, TFRecord framing (length,
 * masked CRCs), the records of a written file decoded back with protobuf-c (file_version,
 * the session-start marker, scalar summaries with their tags, steps and float32 values, NaN
 * kept), a second file in the same second not overwriting the first, and an uncreatable
 * folder as an error naming it; the metrics module's lines (src/train/metrics.h) as written
 * to metrics.jsonl and as events (tags, NaN for null, an eval loss whose perplexity is beyond
 * float32 as +Inf); a text-plugin table (ft_tfevents_text) decoded back. Without protobuf-c in
 * the build: the error naming the packages. */
#include "tests/unit/harness.h"

#include <errno.h>
#include <dirent.h>

#include "src/core/err.h"
#include "src/core/fsutil.h"
#include "src/formats/tfevents.h"
#include "src/train/metrics.h"
#ifdef FT_HAVE_TFEVENTS
#include "src/formats/tb_event.pb-c.h"
#endif

static void test_crc32c_vectors(void **state)
{
    (void)state;
    uint8_t b[32];
    memset(b, 0, sizeof b);
    assert_int_equal(ft_crc32c(0, b, 32), 0x8A9136AAu);    /* RFC 3720 B.4: 32 bytes of zeros */
    memset(b, 0xff, sizeof b);
    assert_int_equal(ft_crc32c(0, b, 32), 0x62A8AB43u);    /* 32 bytes of 0xff */
    for (int i = 0; i < 32; i++) b[i] = (uint8_t)i;
    assert_int_equal(ft_crc32c(0, b, 32), 0x46DD794Eu);    /* 32 bytes ascending 0..31 */
    for (int i = 0; i < 32; i++) b[i] = (uint8_t)(31 - i);
    assert_int_equal(ft_crc32c(0, b, 32), 0x113FDB5Cu);    /* 32 bytes descending */
    assert_int_equal(ft_crc32c(0, "123456789", 9), 0xE3069283u); /* CRC-32C check value */
    assert_int_equal(ft_crc32c(0, "", 0), 0);
    /* continuing a CRC over a split buffer gives the CRC of the whole */
    assert_int_equal(ft_crc32c(ft_crc32c(0, "1234", 4), "56789", 5), 0xE3069283u);
}

static uint32_t le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t le64(const uint8_t *p)
{
    return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32;
}

static void test_frame(void **state)
{
    (void)state;
    uint8_t rec[16 + 5];
    ft_tfrecord_frame(rec, "hello", 5);
    assert_int_equal(le64(rec), 5);
    uint32_t c = ft_crc32c(0, rec, 8);
    assert_int_equal(le32(rec + 8), ((c >> 15) | (c << 17)) + 0xa282ead8u);
    assert_memory_equal(rec + 12, "hello", 5);
    c = ft_crc32c(0, "hello", 5);
    assert_int_equal(le32(rec + 17), ((c >> 15) | (c << 17)) + 0xa282ead8u);
    assert_int_equal(ft_tfrecord_masked_crc("hello", 5), le32(rec + 17));
    /* framing in place (the data already at rec + 12) gives the same record */
    uint8_t rec2[16 + 5];
    memcpy(rec2 + 12, "hello", 5);
    ft_tfrecord_frame(rec2, rec2 + 12, 5);
    assert_memory_equal(rec, rec2, sizeof rec);
}

#ifdef FT_HAVE_TFEVENTS
/* The records of path, each checked (length and data CRCs) and decoded; returns how many
 * (at most max) were read; the file must end on a record boundary. */
static int read_events(const char *path, Tensorboard__Event **ev, int max)
{
    char *txt;
    size_t len;
    assert_int_equal(ft_read_file(path, &txt, &len), 0);
    const uint8_t *p = (const uint8_t *)txt;
    int n = 0;
    size_t off = 0;
    while (off < len) {
        assert_true(off + 12 <= len);
        uint64_t dl = le64(p + off);
        assert_int_equal(le32(p + off + 8), ft_tfrecord_masked_crc(p + off, 8));
        assert_true(off + 16 + dl <= len);
        assert_int_equal(le32(p + off + 12 + dl), ft_tfrecord_masked_crc(p + off + 12, dl));
        assert_true(n < max);
        ev[n] = tensorboard__event__unpack(NULL, dl, p + off + 12);
        assert_non_null(ev[n]);
        n++;
        off += 16 + dl;
    }
    assert_int_equal(off, len);
    free(txt);
    return n;
}

static void test_file(void **state)
{
    (void)state;
    assert_int_equal(ft_tfevents_available(), 1);
    char *dir = t_tmpdir();
    char sub[4200];
    snprintf(sub, sizeof sub, "%s/a/tb", dir); /* parents are created */
    ft_tfevents *w;
    assert_int_equal(ft_tfevents_open(&w, sub, 1700000000.25), 0);
    const char *p = ft_tfevents_path(w);
    assert_non_null(strstr(p, "/a/tb/events.out.tfevents.1700000000."));
    const char *tags[3] = {"train/loss", "train/lr", "eval/loss"};
    float v1[2] = {2.5f, 1e-4f};
    assert_int_equal(ft_tfevents_scalars(w, 1, 1700000001.0, tags, v1, 2), 0);
    float v2[3] = {NAN, 2e-4f, 3.25f};
    assert_int_equal(ft_tfevents_scalars(w, 2, 1700000002.0, tags, v2, 3), 0);
    assert_int_equal(ft_tfevents_scalars(w, 3, 1700000003.0, tags, v2, 0), 0); /* nothing */
    /* a second writer in the same second: a new name, the first file is kept */
    ft_tfevents *w2;
    assert_int_equal(ft_tfevents_open(&w2, sub, 1700000000.5), 0);
    assert_string_not_equal(ft_tfevents_path(w2), p);
    assert_int_equal(strncmp(ft_tfevents_path(w2), p, strlen(p)), 0);
    assert_string_equal(ft_tfevents_path(w2) + strlen(p), ".1");
    ft_tfevents_close(w2);

    Tensorboard__Event *ev[8];
    int n = read_events(p, ev, 8);
    assert_int_equal(n, 4);
    assert_int_equal(ev[0]->what_case, TENSORBOARD__EVENT__WHAT_FILE_VERSION);
    assert_string_equal(ev[0]->file_version, "brain.Event:2");
    assert_true(ev[0]->wall_time == 1700000000.25);
    assert_non_null(ev[0]->source_metadata);
    assert_string_equal(ev[0]->source_metadata->writer, "ftune");
    assert_int_equal(ev[1]->what_case, TENSORBOARD__EVENT__WHAT_SESSION_LOG);
    assert_int_equal(ev[1]->session_log->status, TENSORBOARD__SESSION_LOG__SESSION_STATUS__START);
    assert_int_equal(ev[1]->step, 0);
    assert_int_equal(ev[2]->what_case, TENSORBOARD__EVENT__WHAT_SUMMARY);
    assert_int_equal(ev[2]->step, 1);
    assert_true(ev[2]->wall_time == 1700000001.0);
    assert_int_equal(ev[2]->summary->n_value, 2);
    assert_string_equal(ev[2]->summary->value[0]->tag, "train/loss");
    assert_int_equal(ev[2]->summary->value[0]->value_case, TENSORBOARD__SUMMARY__VALUE__VALUE_SIMPLE_VALUE);
    assert_true(ev[2]->summary->value[0]->simple_value == 2.5f);
    assert_string_equal(ev[2]->summary->value[1]->tag, "train/lr");
    assert_true(ev[2]->summary->value[1]->simple_value == 1e-4f);
    assert_int_equal(ev[3]->step, 2);
    assert_int_equal(ev[3]->summary->n_value, 3);
    assert_true(isnan(ev[3]->summary->value[0]->simple_value));
    assert_string_equal(ev[3]->summary->value[2]->tag, "eval/loss");
    assert_true(ev[3]->summary->value[2]->simple_value == 3.25f);
    for (int i = 0; i < n; i++) tensorboard__event__free_unpacked(ev[i], NULL);
    ft_tfevents_close(w);
    ft_tfevents_close(NULL);
    assert_string_equal(ft_tfevents_path(NULL), "");
    free(dir);
}

static void test_metrics_events(void **state)
{
    (void)state;
    char *dir = t_tmpdir();
    char path[4200], tb[4200];
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    snprintf(tb, sizeof tb, "%s/tb", dir);
    ft_metrics m;
    assert_int_equal(ft_metrics_open(&m, path), 0);
    assert_int_equal(ft_metrics_tensorboard(&m, tb), 0);
    assert_int_equal(ft_metrics_step(&m, 1, 2.5, 1e-4, 0.5, 10, 100.0, 0.25, 0, 0, NULL), 0);
    assert_int_equal(ft_metrics_step(&m, 2, NAN, 2e-4, NAN, 10, 90.0, 0.5, 1, 1, NULL), 0);
    assert_int_equal(ft_metrics_eval(&m, 2, 200.0, 7, 0.75, NULL), 0);
    char evpath[4300];
    snprintf(evpath, sizeof evpath, "%s", ft_tfevents_path(m.tb));
    ft_metrics_close(&m);
    char *txt;
    size_t len;
    assert_int_equal(ft_read_file(path, &txt, &len), 0);
    const char *want =
        "{\"step\": 1, \"loss\": 2.5, \"lr\": 0.0001, \"grad_norm\": 0.5, \"tokens\": 10, \"tokens_per_s\": 100, \"elapsed_s\": 0.25, \"bad_steps\": 0}\n"
        "{\"step\": 2, \"loss\": null, \"lr\": 0.0002, \"grad_norm\": null, \"tokens\": 10, \"tokens_per_s\": 90, \"elapsed_s\": 0.5, \"skipped\": true, \"bad_steps\": 1}\n"
        "{\"step\": 2, \"eval_loss\": 200, \"eval_tokens\": 7, \"elapsed_s\": 0.75}\n";
    assert_int_equal(len, strlen(want));
    assert_memory_equal(txt, want, len);
    free(txt);
    Tensorboard__Event *ev[8];
    int n = read_events(evpath, ev, 8);
    assert_int_equal(n, 5);
    const Tensorboard__Summary *s1 = ev[2]->summary, *s2 = ev[3]->summary, *s3 = ev[4]->summary;
    assert_int_equal(ev[2]->step, 1);
    assert_int_equal(s1->n_value, 7); /* loss lr grad_norm tokens tokens_per_s elapsed_s bad_steps */
    assert_string_equal(s1->value[0]->tag, "train/loss");
    assert_true(s1->value[0]->simple_value == 2.5f);
    assert_string_equal(s1->value[1]->tag, "train/lr");
    assert_true(s1->value[1]->simple_value == 1e-4f);
    assert_string_equal(s1->value[6]->tag, "train/bad_steps");
    assert_true(isnan(s2->value[0]->simple_value) && isnan(s2->value[2]->simple_value));
    assert_true(s2->value[6]->simple_value == 1.0f);
    assert_int_equal(ev[4]->step, 2);
    assert_int_equal(s3->n_value, 4);
    assert_string_equal(s3->value[0]->tag, "eval/loss");
    assert_true(s3->value[0]->simple_value == 200.0f);
    assert_string_equal(s3->value[1]->tag, "eval/perplexity");
    assert_true(isinf(s3->value[1]->simple_value) && s3->value[1]->simple_value > 0); /* e^200 */
    assert_string_equal(s3->value[2]->tag, "eval/tokens");
    assert_string_equal(s3->value[3]->tag, "eval/elapsed_s");
    for (int i = 0; i < n; i++) tensorboard__event__free_unpacked(ev[i], NULL);
    t_rmtree(dir);
}

/* A text summary (ft_tfevents_text): the text plugin's metadata and a (rows, cols) DT_STRING
 * tensor, cells row by row, bytes as given (UTF-8, a newline); an empty table refused. */
static void test_text(void **state)
{
    (void)state;
    char *dir = t_tmpdir();
    ft_tfevents *w;
    assert_int_equal(ft_tfevents_open(&w, dir, 1700000000.0), 0);
    const char *cells[4] = {"What is 2+2?", "4", "Name a color.", "Bleu\n\xc3\xa9t\xc3\xa9"};
    assert_int_equal(ft_tfevents_text(w, 7, 1700000001.0, "samples", cells, 2, 2), 0);
    assert_int_equal(ft_tfevents_text(w, 8, 1700000002.0, "samples", cells, 0, 2), FT_E_INVALID);
    Tensorboard__Event *ev[4];
    int n = read_events(ft_tfevents_path(w), ev, 4);
    assert_int_equal(n, 3);
    assert_int_equal(ev[2]->step, 7);
    assert_int_equal(ev[2]->summary->n_value, 1);
    const Tensorboard__Summary__Value *v = ev[2]->summary->value[0];
    assert_string_equal(v->tag, "samples");
    assert_non_null(v->metadata);
    assert_string_equal(v->metadata->plugin_data->plugin_name, "text");
    assert_int_equal(v->metadata->plugin_data->content.len, 0);
    assert_int_equal(v->metadata->data_class, 2);
    assert_int_equal(v->value_case, TENSORBOARD__SUMMARY__VALUE__VALUE_TENSOR);
    assert_int_equal(v->tensor->dtype, 7);
    assert_int_equal(v->tensor->tensor_shape->n_dim, 2);
    assert_int_equal(v->tensor->tensor_shape->dim[0]->size, 2);
    assert_int_equal(v->tensor->tensor_shape->dim[1]->size, 2);
    assert_int_equal(v->tensor->n_string_val, 4);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(v->tensor->string_val[i].len, strlen(cells[i]));
        assert_memory_equal(v->tensor->string_val[i].data, cells[i], strlen(cells[i]));
    }
    for (int i = 0; i < n; i++) tensorboard__event__free_unpacked(ev[i], NULL);
    ft_tfevents_close(w);
    free(dir);
}

static void test_bad_dir(void **state)
{
    (void)state;
    char *f = t_write_tmp("plain-file", "x", 1);
    char sub[4200];
    snprintf(sub, sizeof sub, "%s/tb", f); /* under a regular file */
    ft_tfevents *w = (ft_tfevents *)1;
    int rc = ft_tfevents_open(&w, sub, 1.0);
    assert_true(rc < 0);
    assert_null(w);
    assert_non_null(strstr(ft_errmsg(), f));
    free(f);
}
#else
static void test_unavailable(void **state)
{
    (void)state;
    ft_tfevents *w;
    assert_int_equal(ft_tfevents_available(), 0);
    assert_int_equal(ft_tfevents_open(&w, "somewhere", 1.0), FT_E_UNSUPPORTED);
    assert_non_null(strstr(ft_errmsg(), "libprotobuf-c-dev"));
}
#endif

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_crc32c_vectors),
        cmocka_unit_test(test_frame),
#ifdef FT_HAVE_TFEVENTS
        cmocka_unit_test(test_file),
        cmocka_unit_test(test_metrics_events),
        cmocka_unit_test(test_text),
        cmocka_unit_test(test_bad_dir),
#else
        cmocka_unit_test(test_unavailable),
#endif
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
