/* test_hub_cache.c - Hugging Face ids resolved in a local hub cache (src/formats/hub_cache.h):
 * the cache folder's environment variables, refs, commits, files, GGUF repositories, and the
 * errors of a model that is not there. The cache is a fake one in a temp folder, laid out as
 * huggingface.co/docs/hub/local-cache describes. */
#include "tests/unit/harness.h"

#include <errno.h>
#include <sys/stat.h>
#include <unistd.h>

#include "src/core/err.h"
#include "src/formats/hub_cache.h"

#define H1 "0123456789abcdef0123456789abcdef01234567"
#define H2 "89abcdef0123456789abcdef0123456789abcdef"

/* The cache's variables as the program would pass them (cli/env.c ft_env_hub). */
static ft_hub_env g_env;

static void put(const char *root, const char *rel, const char *text)
{
    char p[1024], cmd[1200];
    snprintf(p, sizeof p, "%s/%s", root, rel);
    snprintf(cmd, sizeof cmd, "mkdir -p \"$(dirname '%s')\"", p);
    assert_int_equal(system(cmd), 0);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void expect_fail(const char *arg, int code, const char *n1, const char *n2)
{
    char out[4096];
    int rc = ft_hub_resolve(arg, &g_env, out, sizeof out);
    printf("  %s: %s\n", arg, ft_errmsg());
    assert_int_equal(rc, code);
    if (n1) assert_non_null(strstr(ft_errmsg(), n1));
    if (n2) assert_non_null(strstr(ft_errmsg(), n2));
}

static void expect_path(const char *arg, int want_rc, const char *want)
{
    char out[4096];
    int rc = ft_hub_resolve(arg, &g_env, out, sizeof out);
    if (rc < 0) fail_msg("%s: %s", arg, ft_errmsg());
    assert_int_equal(rc, want_rc);
    assert_string_equal(out, want);
}

static void test_cache_dir(void **st)
{
    (void)st;
    char d[4096];
    ft_hub_env e = {"/a/hub", "/b/hub", "/c", "/d", "/e"};
    const char **v[] = {&e.hf_hub_cache, &e.huggingface_hub_cache, &e.hf_home, &e.xdg_cache_home, &e.home};
    const char *want[] = {"/a/hub", "/b/hub", "/c/hub", "/d/huggingface/hub", "/e/.cache/huggingface/hub"};
    for (int i = 0; i < 5; i++) { /* each in turn is the first one set; "" is unset */
        assert_int_equal(ft_hub_cache_dir(&e, d, sizeof d), 0);
        assert_string_equal(d, want[i]);
        *v[i] = i % 2 ? "" : NULL;
    }
    assert_int_equal(ft_hub_cache_dir(&e, d, sizeof d), FT_E_NOTFOUND);
    assert_int_equal(ft_hub_cache_dir(NULL, d, sizeof d), FT_E_NOTFOUND);
    e.hf_hub_cache = "/a/very/long/path";
    assert_int_equal(ft_hub_cache_dir(&e, d, 8), FT_E_RANGE);
}

static void test_resolve(void **st)
{
    (void)st;
    char *c = t_tmpdir(), want[2048], arg[256];
    g_env.hf_hub_cache = c;
    /* acme/tiny: main -> H1 (with a newline), v1 -> H2 (without) */
    put(c, "models--acme--tiny/refs/main", H1 "\n");
    put(c, "models--acme--tiny/refs/v1", H2);
    put(c, "models--acme--tiny/snapshots/" H1 "/config.json", "{}");
    put(c, "models--acme--tiny/snapshots/" H2 "/config.json", "{}");
    snprintf(want, sizeof want, "%s/models--acme--tiny/snapshots/" H1, c);
    expect_path("acme/tiny", 1, want);
    expect_path("acme/tiny@main", 1, want);
    snprintf(want, sizeof want, "%s/models--acme--tiny/snapshots/" H2, c);
    expect_path("acme/tiny@v1", 1, want);
    expect_path("acme/tiny@" H2, 1, want); /* a commit with a snapshot, no ref needed */
    snprintf(want, sizeof want, "%s/models--acme--tiny/snapshots/" H2 "/tokenizer.json", c);
    expect_path("acme/tiny@v1/tokenizer.json", 1, want); /* a file: the loader checks it */

    /* not an id, or an existing path: as given */
    expect_path("no-such-model", 0, "no-such-model");
    expect_path("/abs/no/such", 0, "/abs/no/such");
    expect_path("./acme/tiny", 0, "./acme/tiny");
    expect_path("acme/tiny/../../etc", 0, "acme/tiny/../../etc");
    expect_path("acme/.hidden", 0, "acme/.hidden");
    expect_path("ac me/tiny", 0, "ac me/tiny");
    expect_path("acme/tiny/", 0, "acme/tiny/");
    expect_path(c, 0, c);
    char here[2048], cwd[4096];
    snprintf(here, sizeof here, "%s/local", c); /* a local folder named like an id wins */
    put(here, "acme/tiny/config.json", "{}");
    assert_non_null(getcwd(cwd, sizeof cwd));
    assert_int_equal(chdir(here), 0);
    expect_path("acme/tiny", 0, "acme/tiny");
    assert_int_equal(chdir(cwd), 0);

    /* not cached, an unknown revision, a missing snapshot, a broken ref */
    expect_fail("acme/none", FT_E_NOTFOUND, "models--acme--none does not exist", "hf download acme/none");
    expect_fail("acme/tiny@v9", FT_E_NOTFOUND, "no revision 'v9'", "main");
    expect_fail("acme/tiny@v9", FT_E_NOTFOUND, "v1", "ORG/NAME@REV");
    put(c, "models--acme--gone/refs/main", H1);
    expect_fail("acme/gone", FT_E_NOTFOUND, "snapshot", "interrupted download");
    put(c, "models--acme--bad/refs/main", "../../etc");
    expect_fail("acme/bad", FT_E_INVALID, "does not hold a commit hash", NULL);
    put(c, "models--acme--empty/refs/main", " \n");
    expect_fail("acme/empty", FT_E_INVALID, "refs/main", NULL);
    /* a ref of ".." named snapshots/.., the repository folder itself, taken as a snapshot */
    put(c, "models--acme--up/refs/main", "..\n");
    put(c, "models--acme--up/snapshots/" H1 "/config.json", "{}");
    expect_fail("acme/up", FT_E_INVALID, "does not hold a commit hash", "refs/main");
    put(c, "models--acme--up/refs/v1", ".");
    expect_fail("acme/up@v1", FT_E_INVALID, "does not hold a commit hash", "refs/v1");
    /* a refs file that is there but cannot be read: its error, not "no revision" (root reads
     * it anyway) */
    put(c, "models--acme--locked/refs/main", H1);
    put(c, "models--acme--locked/snapshots/" H1 "/config.json", "{}");
    if (geteuid() != 0) {
        char lk[2048];
        snprintf(lk, sizeof lk, "%s/models--acme--locked/refs/main", c);
        assert_int_equal(chmod(lk, 0), 0);
        expect_fail("acme/locked", -EACCES, "revision 'main'", "Permission denied");
        assert_int_equal(chmod(lk, 0644), 0);
    }

    /* GGUF repositories: one file is the model; several must be named */
    put(c, "models--acme--one-GGUF/refs/main", H1);
    put(c, "models--acme--one-GGUF/snapshots/" H1 "/m-Q4_K_M.gguf", "x");
    put(c, "models--acme--one-GGUF/snapshots/" H1 "/README.md", "x");
    snprintf(want, sizeof want, "%s/models--acme--one-GGUF/snapshots/" H1 "/m-Q4_K_M.gguf", c);
    expect_path("acme/one-GGUF", 1, want);
    put(c, "models--acme--two-GGUF/refs/main", H1);
    put(c, "models--acme--two-GGUF/snapshots/" H1 "/m-Q4_K_M.gguf", "x");
    put(c, "models--acme--two-GGUF/snapshots/" H1 "/m-Q8_0.gguf", "x");
    expect_fail("acme/two-GGUF", FT_E_INVALID, "2 GGUF files", "acme/two-GGUF/FILE.gguf");
    expect_fail("acme/two-GGUF", FT_E_INVALID, "m-Q8_0.gguf", "m-Q4_K_M.gguf");
    snprintf(want, sizeof want, "%s/models--acme--two-GGUF/snapshots/" H1 "/m-Q8_0.gguf", c);
    expect_path("acme/two-GGUF/m-Q8_0.gguf", 1, want);

    /* an output buffer too small */
    char small[16];
    assert_int_equal(ft_hub_resolve("acme/tiny", &g_env, small, sizeof small), FT_E_RANGE);
    snprintf(arg, sizeof arg, "x");
    assert_int_equal(ft_hub_resolve(arg, &g_env, small, sizeof small), 0);

    g_env.hf_hub_cache = NULL;
    t_rmtree(c);
}

static void test_repo_id(void **st)
{
    (void)st;
    char id[64];
    assert_int_equal(ft_hub_repo_id("/h/hub/models--meta-llama--Llama-3.1-8B/snapshots/" H1, id, sizeof id), 1);
    assert_string_equal(id, "meta-llama/Llama-3.1-8B");
    assert_int_equal(ft_hub_repo_id("rel/models--acme--m-GGUF/snapshots/" H1 "/m.gguf", id, sizeof id), 1);
    assert_string_equal(id, "acme/m-GGUF");
    assert_int_equal(ft_hub_repo_id("/h/models--gpt2/snapshots/" H1 "/", id, sizeof id), 1);
    assert_string_equal(id, "gpt2");
    /* a cache folder under a folder named snapshots: the snapshots/ after models--ORG--NAME */
    assert_int_equal(ft_hub_repo_id("/data/snapshots/hub/models--acme--m/snapshots/" H1 "/m.gguf",
                                    id, sizeof id), 1);
    assert_string_equal(id, "acme/m");
    strcpy(id, "unchanged");
    const char *no[] = {"/models/llama", "/h/models--acme--m/snapshots/", "/h/models--acme--m/blobs/x",
                        "/h/datasets--acme--m/snapshots/" H1, "/h/models--ac me--m/snapshots/" H1,
                        "/h/models--acme--m/snapshots/../../x", "/snapshots/x",
                        "tests/fixtures/tiny-llama", NULL};
    for (int i = 0; no[i]; i++) assert_int_equal(ft_hub_repo_id(no[i], id, sizeof id), 0);
    assert_int_equal(ft_hub_repo_id(NULL, id, sizeof id), 0);
    assert_int_equal(ft_hub_repo_id("/h/models--acme--m/snapshots/" H1, id, 6), 0); /* "acme/m" */
    assert_string_equal(id, "unchanged");
    assert_int_equal(ft_hub_repo_id("/h/models--acme--m/snapshots/" H1, id, 7), 1);
    assert_string_equal(id, "acme/m");
}

/* PEFT's revision of a base found in the cache: the snapshot's commit unless refs/main
 * names it; and "org/name@REV" split back for writing. */
static void test_pinned_commit(void **st)
{
    (void)st;
    char *c = t_tmpdir();
    char snap1[1024], snap2[1024], out[64];
    put(c, "models--acme--m/refs/main", H1 "\n");
    put(c, "models--acme--m/refs/v2", H2);
    put(c, "models--acme--m/snapshots/" H1 "/config.json", "{}");
    put(c, "models--acme--m/snapshots/" H2 "/config.json", "{}");
    snprintf(snap1, sizeof snap1, "%s/models--acme--m/snapshots/" H1, c);
    snprintf(snap2, sizeof snap2, "%s/models--acme--m/snapshots/" H2 "/config.json", c);
    assert_int_equal(ft_hub_pinned_commit(snap1, out, sizeof out), 0); /* main's */
    assert_int_equal(ft_hub_pinned_commit(snap2, out, sizeof out), 1);
    assert_string_equal(out, H2);
    assert_int_equal(ft_hub_pinned_commit(snap2, out, 40), 0); /* no room for the NUL */
    assert_int_equal(ft_hub_pinned_commit("/models/llama", out, sizeof out), 0);
    /* a repository without a main branch: the commit is the only name */
    put(c, "models--acme--nomain/snapshots/" H1 "/config.json", "{}");
    snprintf(snap1, sizeof snap1, "%s/models--acme--nomain/snapshots/" H1, c);
    assert_int_equal(ft_hub_pinned_commit(snap1, out, sizeof out), 1);
    assert_string_equal(out, H1);

    char id[64], rev[64];
    assert_int_equal(ft_hub_split_rev("acme/m@" H2, id, sizeof id, rev, sizeof rev), 1);
    assert_string_equal(id, "acme/m");
    assert_string_equal(rev, H2);
    assert_int_equal(ft_hub_split_rev("acme/m@v2", id, sizeof id, rev, sizeof rev), 1);
    assert_string_equal(rev, "v2");
    const char *no[] = {"acme/m", "/abs/acme@v2", "acme/m@v2/x.gguf", "acme/m@", "acme@v2",
                        "./a/b@v2", "acme/m@../x", NULL};
    for (int i = 0; no[i]; i++) assert_int_equal(ft_hub_split_rev(no[i], id, sizeof id, rev, sizeof rev), 0);
    assert_int_equal(ft_hub_split_rev(NULL, id, sizeof id, rev, sizeof rev), 0);
    assert_int_equal(ft_hub_split_rev("acme/m@v2", id, 6, rev, sizeof rev), 0);
    /* a local folder or file named like an id with a revision is a path, never split (the
     * adapter would have named "acme/m" at revision "v2" instead of the folder trained on) */
    char cwd[4096];
    assert_non_null(getcwd(cwd, sizeof cwd));
    assert_int_equal(chdir(c), 0);
    put(c, "acme/m@v2/config.json", "{}");
    put(c, "acme/tiny@q4.gguf", "GGUF");
    assert_int_equal(ft_hub_split_rev("acme/m@v2", id, sizeof id, rev, sizeof rev), 0);
    assert_int_equal(ft_hub_split_rev("acme/tiny@q4.gguf", id, sizeof id, rev, sizeof rev), 0);
    assert_int_equal(ft_hub_split_rev("acme/m@v3", id, sizeof id, rev, sizeof rev), 1);
    assert_int_equal(chdir(cwd), 0);
    t_rmtree(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cache_dir),
        cmocka_unit_test(test_resolve),
        cmocka_unit_test(test_repo_id),
        cmocka_unit_test(test_pinned_commit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
