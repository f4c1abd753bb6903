/* replay.c - runs a libFuzzer target's LLVMFuzzerTestOneInput on every file of its corpus
 * without libFuzzer, so `make test` replays the seed corpora with the normal compiler (and,
 * in the SANITIZE=1 build, under ASan/UBSan).
 *
 * Usage: replay_<target> PATH...   (a PATH is a file or a folder; folders are read one
 * level deep, files sorted by name). Each input is copied into an exact-size malloc'ed
 * buffer, as libFuzzer does, so reads past the end are caught by ASan.
 * Exit status 0 when every input ran (a crash or an abort() in the target ends the process
 * with a non-zero status, naming the input on stderr first); 1 for an unreadable path.
 * Prints "replay: N inputs from PATH, ok" per PATH. */
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
__attribute__((weak)) int LLVMFuzzerInitialize(int *argc, char ***argv);

static int run_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "replay: %s: %s\n", path, strerror(errno));
        return -1;
    }
    size_t cap = 4096, n = 0;
    uint8_t *buf = malloc(cap);
    for (;;) {
        if (!buf) break;
        size_t r = fread(buf + n, 1, cap - n, f);
        n += r;
        if (n < cap) break;
        uint8_t *nb = realloc(buf, cap *= 2);
        if (!nb) { free(buf); buf = NULL; }
        buf = nb;
    }
    int err = ferror(f);
    fclose(f);
    if (!buf || err) {
        free(buf);
        fprintf(stderr, "replay: %s: cannot read\n", path);
        return -1;
    }
    uint8_t *exact = malloc(n ? n : 1); /* exact size: ASan sees one byte past the end */
    if (!exact) {
        free(buf);
        return -1;
    }
    memcpy(exact, buf, n);
    free(buf);
    fprintf(stderr, "replay: running %s (%zu bytes)\n", path, n);
    LLVMFuzzerTestOneInput(exact, n);
    free(exact);
    return 0;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int run_path(const char *path)
{
    struct stat st;
    if (stat(path, &st) < 0) {
        fprintf(stderr, "replay: %s: %s\n", path, strerror(errno));
        return -1;
    }
    if (!S_ISDIR(st.st_mode)) return run_file(path) < 0 ? -1 : 1;
    DIR *d = opendir(path);
    if (!d) {
        fprintf(stderr, "replay: %s: %s\n", path, strerror(errno));
        return -1;
    }
    char **names = NULL;
    size_t n = 0, cap = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.') continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 64;
            char **nn = realloc(names, cap * sizeof *nn);
            if (!nn) break;
            names = nn;
        }
        names[n++] = strdup(de->d_name);
    }
    closedir(d);
    qsort(names, n, sizeof *names, cmp_str);
    int count = 0, bad = 0;
    for (size_t i = 0; i < n; i++) {
        char p[4096];
        snprintf(p, sizeof p, "%s/%s", path, names[i]);
        struct stat fs;
        if (names[i] && stat(p, &fs) == 0 && S_ISREG(fs.st_mode)) {
            if (run_file(p) < 0) bad = 1;
            else count++;
        }
        free(names[i]);
    }
    free(names);
    return bad ? -1 : count;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s CORPUS_DIR_OR_FILE...\n", argv[0]);
        return 2;
    }
    if (LLVMFuzzerInitialize) LLVMFuzzerInitialize(&argc, &argv);
    int rc = 0;
    for (int i = 1; i < argc; i++) {
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        int n = run_path(argv[i]);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
        if (n < 0) {
            rc = 1;
            printf("replay: %s: FAILED (unreadable input)\n", argv[i]);
        } else if (n == 0) {
            rc = 1;
            printf("replay: %s: FAILED (no inputs)\n", argv[i]);
        } else {
            printf("replay: %d inputs from %s, ok (%.2f s)\n", n, argv[i], s);
        }
    }
    return rc;
}
