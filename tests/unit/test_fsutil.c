/* test_fsutil.c - the whole-file readers of src/core/fsutil.h: ft_read_file (regular files
 * only, never blocking in open()) and ft_read_input (a user's data: regular files, "-",
 * pipes, FIFOs with a writer, devices, gzip through zlib). Every test that touches a FIFO or
 * a pipe runs under alarm(), so a reader that blocks kills this binary (a failure) instead of
 * hanging the suite. The gzip inputs are made here with zlib's deflate (test side only). */
#include "tests/unit/harness.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "src/core/err.h"
#include "src/core/fsutil.h"
#include "src/data/records.h"

#define ALARM_S 20 /* far above what any test here takes (< 1 s) */

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* n bytes of JSONL-like text, deterministic. Caller frees. */
static char *make_text(size_t n)
{
    char *s = malloc(n + 1);
    assert_non_null(s);
    for (size_t i = 0; i < n; i++) s[i] = (i % 61 == 60) ? '\n' : (char)('a' + (i * 7 + i / 13) % 26);
    s[n] = 0;
    return s;
}

/* One gzip member (RFC 1952) of in[0..n) made by zlib's deflate. Caller frees. */
static unsigned char *gz(const void *in, size_t n, size_t *out_n)
{
    z_stream zs;
    memset(&zs, 0, sizeof zs);
    assert_int_equal(deflateInit2(&zs, 6, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY), Z_OK);
    size_t cap = deflateBound(&zs, (uLong)n) + 64;
    unsigned char *out = malloc(cap);
    assert_non_null(out);
    zs.next_in = (unsigned char *)in;
    zs.avail_in = (uInt)n;
    zs.next_out = out;
    zs.avail_out = (uInt)cap;
    assert_int_equal(deflate(&zs, Z_FINISH), Z_STREAM_END);
    *out_n = zs.total_out;
    deflateEnd(&zs);
    return out;
}

static char *write_tmp(const char *name, const void *data, size_t n)
{
    char *p = t_write_tmp(name, data, n);
    assert_non_null(p);
    return p;
}

static void expect_data(const char *path, unsigned flags, const char *want, size_t want_n)
{
    char *d = NULL;
    size_t n = 0;
    int rc = ft_read_input(path, "a data file", &d, &n, flags);
    if (rc) fail_msg("%s: %s", path, ft_errmsg());
    assert_int_equal(n, want_n);
    assert_memory_equal(d, want, want_n);
    assert_int_equal(d[n], 0);
    free(d);
}

/* ft_read_input fails with code and a message holding s1 (and s2 when given). */
static void expect_err(const char *path, unsigned flags, size_t max, int code, const char *s1,
                       const char *s2)
{
    char *d = (char *)"untouched";
    size_t n = 0;
    int rc = ft_read_input_max(path, "a data file", &d, &n, flags, max);
    printf("  %s\n", ft_errmsg());
    assert_int_equal(rc, code);
    if (s1 && !strstr(ft_errmsg(), s1)) fail_msg("'%s' not in '%s'", s1, ft_errmsg());
    if (s2 && !strstr(ft_errmsg(), s2)) fail_msg("'%s' not in '%s'", s2, ft_errmsg());
    assert_string_equal(d, "untouched");
}

/* ---- regular files ---------------------------------------------------------------------- */

static void test_regular(void **st)
{
    (void)st;
    char *text = make_text(100000);
    char *p = write_tmp("a.jsonl", text, 100000);
    expect_data(p, 0, text, 100000);
    expect_data(p, FT_INPUT_DATA, text, 100000);
    char *d;
    size_t n;
    assert_int_equal(ft_read_file(p, &d, &n), 0);
    assert_int_equal(n, 100000);
    assert_memory_equal(d, text, n);
    free(d);
    /* over the limit: -ENOMEM, nothing allocated for it */
    expect_err(p, FT_INPUT_DATA, 4096, -ENOMEM, "a.jsonl", "the limit");
    free(p);
    free(text);
}

static void test_empty_and_kinds(void **st)
{
    (void)st;
    char *p = write_tmp("empty.jsonl", "", 0);
    expect_data(p, 0, "", 0);
    expect_data(p, FT_INPUT_DATA, "", 0);
    char *dir = t_tmpdir();
    expect_err(dir, FT_INPUT_DATA, FT_INPUT_MAX_BYTES, -EISDIR, dir, "is a directory");
    char *d;
    size_t n;
    assert_int_equal(ft_read_file(dir, &d, &n), -EISDIR);
    /* a character device: a stream for data, refused as a model/config file */
    expect_data("/dev/null", FT_INPUT_DATA, "", 0);
    assert_int_equal(ft_read_file("/dev/null", &d, &n), FT_E_INVALID);
    assert_non_null(strstr(ft_errmsg(), "not a regular file"));
    expect_err("/dev/null", 0, FT_INPUT_MAX_BYTES, FT_E_INVALID, "/dev/null", "not a regular file");
    /* "-" is standard input only with FT_INPUT_STREAM: for ft_read_file a file named "-" */
    char cwd[4096];
    assert_non_null(getcwd(cwd, sizeof cwd));
    assert_int_equal(chdir(dir), 0);
    assert_int_equal(ft_read_file("-", &d, &n), -ENOENT);
    assert_int_equal(chdir(cwd), 0);
    assert_string_equal(ft_input_name("-"), "<stdin>");
    assert_string_equal(ft_input_name("a.jsonl"), "a.jsonl");
    free(dir);
    free(p);
}

/* ---- gzip ------------------------------------------------------------------------------- */

static void test_gzip(void **st)
{
    (void)st;
    char *text = make_text(300000);
    size_t zn;
    unsigned char *z = gz(text, 300000, &zn);
    /* the name does not matter: the magic does */
    char *p = write_tmp("train.jsonl.gz", z, zn), *q = write_tmp("train.jsonl", z, zn);
    expect_data(p, FT_INPUT_DATA, text, 300000);
    expect_data(q, FT_INPUT_DATA, text, 300000);
    expect_data(p, FT_INPUT_GZIP, text, 300000);
    /* without FT_INPUT_GZIP (ft_read_file: model files) the bytes as they are */
    expect_data(p, FT_INPUT_STREAM, (const char *)z, zn);
    char *d;
    size_t n;
    assert_int_equal(ft_read_file(p, &d, &n), 0);
    assert_int_equal(n, zn);
    free(d);
    /* an empty file, compressed */
    size_t en;
    unsigned char *e = gz("", 0, &en);
    char *pe = write_tmp("empty.gz", e, en);
    expect_data(pe, FT_INPUT_DATA, "", 0);

    /* two members (cat a.gz b.gz), then tar's zero padding after the last: as gzip -d */
    size_t z2n;
    unsigned char *z2 = gz("second member\n", 14, &z2n);
    size_t catn = zn + z2n + en + 512;
    unsigned char *cat = calloc(1, catn);
    memcpy(cat, z, zn);
    memcpy(cat + zn, z2, z2n);
    memcpy(cat + zn + z2n, e, en);
    char *pc = write_tmp("two.jsonl.gz", cat, catn);
    char *want = malloc(300000 + 14);
    memcpy(want, text, 300000);
    memcpy(want + 300000, "second member\n", 14);
    expect_data(pc, FT_INPUT_DATA, want, 300000 + 14);
    char *pc2 = write_tmp("two.jsonl.gz", cat, zn + z2n);
    expect_data(pc2, FT_INPUT_DATA, want, 300000 + 14);

    /* bytes after a member that are not a member: corrupt, at the member's end */
    memcpy(cat + zn, "{\"x\"", 4);
    char *pg = write_tmp("garbage.gz", cat, zn + 4);
    char at[64];
    snprintf(at, sizeof at, "gzip data corrupt at byte %zu", zn);
    expect_err(pg, FT_INPUT_DATA, FT_INPUT_MAX_BYTES, FT_E_CORRUPT, "garbage.gz", at);

    /* truncated: inside the deflate data, inside the trailer, inside the header */
    size_t cuts[] = {zn / 2, zn - 3, 2, 9};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        char *pt = write_tmp("cut.jsonl.gz", z, cuts[i]);
        snprintf(at, sizeof at, "gzip data truncated at byte %zu", cuts[i]);
        expect_err(pt, FT_INPUT_DATA, FT_INPUT_MAX_BYTES, FT_E_CORRUPT, "cut.jsonl.gz", at);
        free(pt);
    }

    /* corrupt: the CRC-32 of the trailer (zlib: "incorrect data check", seen once the 4 CRC
     * bytes are read), and the header's method byte (offset 2; CM must be 8) */
    unsigned char *bad = malloc(zn);
    memcpy(bad, z, zn);
    bad[zn - 8] ^= 0x55;
    char *pb = write_tmp("crc.gz", bad, zn);
    snprintf(at, sizeof at, "gzip data corrupt at byte %zu", zn - 4);
    expect_err(pb, FT_INPUT_DATA, FT_INPUT_MAX_BYTES, FT_E_CORRUPT, at, "incorrect data check");
    memcpy(bad, z, zn);
    bad[2] = 7;
    char *pm = write_tmp("method.gz", bad, zn);
    expect_err(pm, FT_INPUT_DATA, FT_INPUT_MAX_BYTES, FT_E_CORRUPT, "method.gz: gzip data corrupt at byte",
               "unknown compression method");
    /* deflate body garbage: corrupt somewhere inside, never a crash */
    memcpy(bad, z, zn);
    for (size_t i = 10; i < 60; i++) bad[i] = 0xff;
    char *pd = write_tmp("body.gz", bad, zn);
    expect_err(pd, FT_INPUT_DATA, FT_INPUT_MAX_BYTES, FT_E_CORRUPT, "body.gz: gzip data corrupt at byte", NULL);

    free(pd);
    free(pm);
    free(pb);
    free(bad);
    free(pg);
    free(pc2);
    free(pc);
    free(want);
    free(cat);
    free(z2);
    free(pe);
    free(e);
    free(q);
    free(p);
    free(z);
    free(text);
}

/* A gzip bomb: 16 MiB of zeros in ~16 KiB stops at the limit with -ENOMEM. */
static void test_gzip_limit(void **st)
{
    (void)st;
    size_t big = (size_t)16 << 20, zn;
    char *zeros = calloc(1, big);
    unsigned char *z = gz(zeros, big, &zn);
    free(zeros);
    printf("  %zu bytes of zeros -> %zu compressed\n", big, zn);
    char *p = write_tmp("bomb.jsonl.gz", z, zn);
    expect_err(p, FT_INPUT_DATA, (size_t)1 << 20, -ENOMEM, "bomb.jsonl.gz: decompresses to more than 1048576 bytes", NULL);
    /* exactly at the limit is fine */
    char *d;
    size_t n;
    assert_int_equal(ft_read_input_max(p, "a data file", &d, &n, FT_INPUT_DATA, big), 0);
    assert_int_equal(n, big);
    free(d);
    expect_err(p, FT_INPUT_DATA, big - 1, -ENOMEM, "the limit", NULL);
    free(p);
    free(z);
}

/* ---- pipes and FIFOs -------------------------------------------------------------------- */

static void write_all(int fd, const void *buf, size_t n)
{
    const char *p = buf;
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) _exit(3);
        p += w;
        n -= (size_t)w;
    }
}

/* A pipe(2) whose writer, a child, writes n bytes (more than the pipe's buffer) slowly in
 * pieces; read through its /dev/fd/N name, as bash's <(cmd) passes it. Then the same with
 * the bytes gzip-compressed. */
static void test_pipe(void **st)
{
    (void)st;
    alarm(ALARM_S);
    size_t n = 1000000;
    char *text = make_text(n);
    for (int compressed = 0; compressed < 2; compressed++) {
        size_t zn = n;
        unsigned char *z = compressed ? gz(text, n, &zn) : (unsigned char *)text;
        int fds[2];
        assert_int_equal(pipe(fds), 0);
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
            close(fds[0]);
            for (size_t o = 0; o < zn; o += 100000) {
                write_all(fds[1], z + o, zn - o < 100000 ? zn - o : 100000);
                usleep(2000);
            }
            _exit(0);
        }
        close(fds[1]);
        char path[64];
        snprintf(path, sizeof path, "/dev/fd/%d", fds[0]);
        expect_data(path, FT_INPUT_DATA, text, n);
        /* a pipe is no file for ft_read_file, and is refused at once */
        int status;
        assert_int_equal(waitpid(pid, &status, 0), pid);
        assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
        char *d;
        size_t dn;
        assert_int_equal(ft_read_file(path, &d, &dn), FT_E_INVALID);
        close(fds[0]);
        if (compressed) free(z);
    }
    /* an empty pipe whose writer has gone: empty input */
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    close(fds[1]);
    char path[64];
    snprintf(path, sizeof path, "/dev/fd/%d", fds[0]);
    expect_data(path, FT_INPUT_DATA, "", 0);
    close(fds[0]);
    free(text);
    alarm(0);
}

/* A FIFO with no writer: ft_read_file and ft_read_input return at once (they used to wait in
 * open() for a writer: then the alarm ends this binary). */
static void test_fifo_no_writer(void **st)
{
    (void)st;
    alarm(ALARM_S);
    char *dir = t_tmpdir(), fifo[256];
    snprintf(fifo, sizeof fifo, "%s/refs-main", dir);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    double t0 = now_s();
    char *d;
    size_t n;
    assert_int_equal(ft_read_file(fifo, &d, &n), FT_E_INVALID);
    assert_non_null(strstr(ft_errmsg(), "not a regular file"));
    expect_err(fifo, FT_INPUT_DATA, FT_INPUT_MAX_BYTES, FT_E_INVALID, fifo, "a FIFO with no writer");
    expect_err(fifo, 0, FT_INPUT_MAX_BYTES, FT_E_INVALID, fifo, "not a regular file");
    /* records (--data, --eval-data, --prompts) say the same */
    ft_records r;
    assert_int_equal(ft_records_open(&r, fifo), FT_E_INVALID);
    assert_non_null(strstr(ft_errmsg(), "no writer"));
    double dt = now_s() - t0;
    printf("  four reads of a FIFO without a writer: %.3f s\n", dt);
    assert_true(dt < 2.0);
    free(dir);
    alarm(0);
}

/* A FIFO with a writer (a child holding it open read-write, so that it is there before we
 * open): its bytes, more than a pipe buffer holds, then EOF when the writer closes. */
static void test_fifo_writer(void **st)
{
    (void)st;
    alarm(ALARM_S);
    char *dir = t_tmpdir(), fifo[256];
    snprintf(fifo, sizeof fifo, "%s/data.fifo", dir);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    size_t n = 300000;
    char *text = make_text(n);
    int ready[2];
    assert_int_equal(pipe(ready), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(ready[0]);
        int fd = open(fifo, O_RDWR); /* Linux: opens at once, as reader and writer */
        if (fd < 0) _exit(2);
        write_all(fd, text, 1000); /* buffered before the reader comes */
        write_all(ready[1], "r", 1);
        write_all(fd, text + 1000, n - 1000); /* blocks until the reader drains it */
        for (int q = 1; q;) { /* close once the reader has taken every byte */
            if (ioctl(fd, FIONREAD, &q) < 0) _exit(4);
            if (q) usleep(1000);
        }
        close(fd);
        _exit(0);
    }
    close(ready[1]);
    char c;
    assert_int_equal(read(ready[0], &c, 1), 1);
    close(ready[0]);
    expect_data(fifo, FT_INPUT_DATA, text, n);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    free(text);
    free(dir);
    alarm(0);
}

/* "-": standard input, read once per process. In a child (the once-flag is process-wide),
 * with a pipe on fd 0 holding gzip data; exit status: the first failing check. */
static void test_stdin(void **st)
{
    (void)st;
    alarm(ALARM_S);
    const char *text = "{\"text\": \"from stdin\"}\n";
    size_t zn;
    unsigned char *z = gz(text, strlen(text), &zn);
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(fds[1]);
        if (dup2(fds[0], 0) < 0) _exit(10);
        ft_records r;
        ft_record rec;
        if (ft_records_open(&r, "-")) _exit(11);
        if (ft_records_next(&r, &rec) != 1 || !rec.json) _exit(12);
        char where[64];
        ft_records_where(&r, rec.loc, where, sizeof where);
        if (strcmp(where, "<stdin>: line 1")) _exit(13);
        ft_records_close(&r);
        char *d;
        size_t n;
        if (ft_read_input("-", "a data file", &d, &n, FT_INPUT_DATA) != FT_E_INVALID) _exit(14);
        if (!strstr(ft_errmsg(), "<stdin>: standard input was already read")) _exit(15);
        /* the same pipe named /dev/stdin: refused too, not read as empty */
        if (ft_read_input("/dev/stdin", "a data file", &d, &n, FT_INPUT_DATA) != FT_E_INVALID) _exit(16);
        if (!strstr(ft_errmsg(), "this is standard input, already read")) _exit(17);
        _exit(0);
    }
    close(fds[0]);
    write_all(fds[1], z, zn);
    close(fds[1]);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    if (!WIFEXITED(status) || WEXITSTATUS(status)) fail_msg("child status %d", status);
    free(z);
    alarm(0);
}

/* Records read from a .gz keep naming the user's path and line. */
static void test_records_gz(void **st)
{
    (void)st;
    const char *text = "{\"text\": \"a\"}\n\n{\"text\": \"b\"\n";
    size_t zn;
    unsigned char *z = gz(text, strlen(text), &zn);
    char *p = write_tmp("r.jsonl.gz", z, zn);
    ft_records r;
    ft_record rec;
    assert_int_equal(ft_records_open(&r, p), 0);
    assert_int_equal(ft_records_next(&r, &rec), 1);
    assert_non_null(rec.json);
    assert_int_equal(ft_records_next(&r, &rec), 1);
    assert_null(rec.json); /* line 3: malformed */
    char where[512], want[512];
    ft_records_where(&r, rec.loc, where, sizeof where);
    snprintf(want, sizeof want, "%s: line 3", p);
    assert_string_equal(where, want);
    ft_records_close(&r);
    /* a corrupt .gz through records: the gzip message, naming the file */
    z[zn - 6] ^= 1;
    char *q = write_tmp("r.jsonl.gz", z, zn);
    assert_int_equal(ft_records_open(&r, q), FT_E_CORRUPT);
    assert_non_null(strstr(ft_errmsg(), "r.jsonl.gz: gzip data corrupt at byte"));
    free(q);
    free(p);
    free(z);
}

/* Edge cases: sizes exactly at the limit (a regular file, a pipe, gzip output), a gzip whose
 * first member is empty, a member followed by a bare magic, symbolic links (the hub cache's
 * snapshot files are links into blobs/), and "-" when standard input is a regular file read
 * from its current offset, /dev/null, or a pipe left non-blocking by someone else. */
static void test_edges(void **st)
{
    (void)st;
    alarm(ALARM_S);
    char *text = make_text(5000);
    char *p = write_tmp("cap.jsonl", text, 5000);
    char *d;
    size_t n;
    assert_int_equal(ft_read_input_max(p, "a data file", &d, &n, FT_INPUT_DATA, 5000), 0);
    assert_int_equal(n, 5000);
    free(d);
    expect_err(p, FT_INPUT_DATA, 4999, -ENOMEM, "cap.jsonl", "the limit");
    /* a pipe of exactly the limit, and one byte over */
    for (size_t lim = 5000; lim >= 4999; lim--) {
        int fds[2];
        assert_int_equal(pipe(fds), 0);
        write_all(fds[1], text, 5000); /* fits in the pipe's buffer */
        close(fds[1]);
        char path[64];
        snprintf(path, sizeof path, "/dev/fd/%d", fds[0]);
        if (lim == 5000) {
            assert_int_equal(ft_read_input_max(path, "a data file", &d, &n, FT_INPUT_DATA, lim), 0);
            assert_int_equal(n, 5000);
            assert_memory_equal(d, text, n);
            free(d);
        } else {
            expect_err(path, FT_INPUT_DATA, lim, -ENOMEM, path, "the limit");
        }
        close(fds[0]);
    }
    /* an empty first member, then the data: the data */
    size_t en, zn;
    unsigned char *e = gz("", 0, &en), *z = gz(text, 5000, &zn);
    unsigned char *cat = malloc(en + zn + 2);
    memcpy(cat, e, en);
    memcpy(cat + en, z, zn);
    char *pc = write_tmp("empty-first.gz", cat, en + zn);
    expect_data(pc, FT_INPUT_DATA, text, 5000);
    assert_int_equal(ft_read_input_max(pc, "a data file", &d, &n, FT_INPUT_DATA, 5000), 0);
    free(d);
    expect_err(pc, FT_INPUT_DATA, 4999, -ENOMEM, "empty-first.gz", "the limit");
    /* a member followed by a bare magic: truncated (a member that never came), no crash */
    memcpy(cat + en + zn, "\x1f\x8b", 2);
    char *pm = write_tmp("magic-tail.gz", cat, en + zn + 2);
    expect_err(pm, FT_INPUT_DATA, FT_INPUT_MAX_BYTES, FT_E_CORRUPT, "magic-tail.gz", "truncated");
    /* symbolic links: to a file (read), to a FIFO without a writer (refused at once) */
    char *dir = t_tmpdir(), lnk[300], fifo[300];
    snprintf(lnk, sizeof lnk, "%s/link.json", dir);
    assert_int_equal(symlink(p, lnk), 0);
    assert_int_equal(ft_read_file(lnk, &d, &n), 0);
    assert_int_equal(n, 5000);
    free(d);
    expect_data(lnk, FT_INPUT_DATA, text, 5000);
    snprintf(fifo, sizeof fifo, "%s/f", dir);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    snprintf(lnk, sizeof lnk, "%s/link-fifo.json", dir);
    assert_int_equal(symlink(fifo, lnk), 0);
    assert_int_equal(ft_read_file(lnk, &d, &n), FT_E_INVALID);
    expect_err(lnk, FT_INPUT_DATA, FT_INPUT_MAX_BYTES, FT_E_INVALID, lnk, "no writer");

    /* "-": each case in a child (standard input is read once per process) */
    for (int k = 0; k < 3; k++) {
        int fds[2] = {-1, -1};
        if (k == 2) assert_int_equal(pipe(fds), 0);
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
            int fd = k == 0 ? open(pc, O_RDONLY) : k == 1 ? open("/dev/null", O_RDONLY) : fds[0];
            if (fd < 0 || dup2(fd, 0) < 0) _exit(10);
            if (k == 2) {
                close(fds[1]);
                if (fcntl(0, F_SETFL, fcntl(0, F_GETFL) | O_NONBLOCK) < 0) _exit(11);
            }
            char skip[8];
            if (k == 0 && read(0, skip, 1) != 1) _exit(12); /* the offset is 1: no magic there */
            if (ft_read_input("-", "a data file", &d, &n, FT_INPUT_DATA)) _exit(13);
            if (k == 0 && (n != en + zn - 1 || memcmp(d, cat + 1, n))) _exit(14);
            if (k == 1 && n != 0) _exit(15);
            if (k == 2 && (n != 5000 || memcmp(d, text, n))) _exit(16);
            _exit(0);
        }
        if (k == 2) { /* the writer comes late: the reader polls */
            close(fds[0]);
            usleep(50000);
            write_all(fds[1], z, zn);
            close(fds[1]);
        }
        int status;
        assert_int_equal(waitpid(pid, &status, 0), pid);
        if (!WIFEXITED(status) || WEXITSTATUS(status)) fail_msg("case %d: child status %d", k, status);
    }
    t_rmtree(dir);
    free(pm);
    free(pc);
    free(cat);
    free(z);
    free(e);
    free(p);
    free(text);
    alarm(0);
}

/* "-" when standard input is a terminal: refused, every time. The refusal reads nothing, so
 * it does not use up standard input's one read (a second try said "already read"). */
static void test_stdin_tty(void **st)
{
    (void)st;
    alarm(ALARM_S);
    int m = posix_openpt(O_RDWR | O_NOCTTY);
    if (m < 0 || grantpt(m) || unlockpt(m) || !ptsname(m)) {
        printf("  no pseudo-terminal here: skipped\n");
        if (m >= 0) close(m);
        alarm(0);
        return;
    }
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int t = open(ptsname(m), O_RDONLY | O_NOCTTY);
        if (t < 0 || dup2(t, 0) < 0 || !isatty(0)) _exit(10);
        char *d;
        size_t n;
        for (int k = 0; k < 2; k++) {
            if (ft_read_input("-", "a data file", &d, &n, FT_INPUT_DATA) != FT_E_INVALID) _exit(11);
            if (!strstr(ft_errmsg(), "<stdin>: standard input is a terminal")) _exit(12 + k);
        }
        _exit(0);
    }
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    close(m);
    if (!WIFEXITED(status) || WEXITSTATUS(status)) fail_msg("child status %d", WEXITSTATUS(status));
    alarm(0);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_regular),
        cmocka_unit_test(test_empty_and_kinds),
        cmocka_unit_test(test_gzip),
        cmocka_unit_test(test_gzip_limit),
        cmocka_unit_test(test_pipe),
        cmocka_unit_test(test_fifo_no_writer),
        cmocka_unit_test(test_fifo_writer),
        cmocka_unit_test(test_stdin),
        cmocka_unit_test(test_records_gz),
        cmocka_unit_test(test_edges),
        cmocka_unit_test(test_stdin_tty),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
