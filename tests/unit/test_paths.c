/* test_paths.c - src/core/paths.h: canonical paths (symlinks resolved in the part that
 * exists, the rest as written), ft_path_within (is, or is inside; symlinks, hard links, "..",
 * paths that do not exist yet) and the message of ft_path_check_output. */
#include "tests/unit/harness.h"

#include <fcntl.h>
#include <sys/stat.h>

#include "src/core/err.h"
#include "src/core/paths.h"

static char g_dir[64];

static void mk(const char *rel, int dir)
{
    char p[256];
    snprintf(p, sizeof p, "%s/%s", g_dir, rel);
    if (dir) assert_int_equal(mkdir(p, 0755), 0);
    else {
        FILE *f = fopen(p, "w");
        assert_non_null(f);
        fputs("x", f);
        fclose(f);
    }
}

static void ln(const char *target, const char *rel)
{
    char p[256];
    snprintf(p, sizeof p, "%s/%s", g_dir, rel);
    assert_int_equal(symlink(target, p), 0);
}

static const char *at(const char *rel)
{
    static char buf[4][256];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", g_dir, rel);
    return buf[k];
}

static int setup(void **state)
{
    (void)state;
    char d[32];
    if (t_mkdtemp(d)) return -1;
    char real[64];
    if (!realpath(d, real)) return -1; /* /tmp may itself be a link */
    snprintf(g_dir, sizeof g_dir, "%s", real);
    mk("model", 1);
    mk("model/config.json", 0);
    mk("model/sub", 1);
    mk("other", 1);
    mk("data.jsonl", 0);
    ln("model", "link-model");               /* a link to the folder */
    ln("model/config.json", "link-config");  /* a link to a file inside it */
    char a[256], b[256];
    snprintf(a, sizeof a, "%s", at("data.jsonl"));
    snprintf(b, sizeof b, "%s", at("hard.jsonl"));
    assert_int_equal(link(a, b), 0);         /* a hard link */
    return 0;
}

static void test_resolve(void **state)
{
    (void)state;
    char out[4096];
    assert_int_equal(ft_path_resolve(at("link-model/sub"), out, sizeof out), 0);
    assert_string_equal(out, at("model/sub"));
    /* not there yet: taken as written, "." and ".." applied, '//' dropped */
    assert_int_equal(ft_path_resolve(at("new//a/./b/../c"), out, sizeof out), 0);
    assert_string_equal(out, at("new/a/c"));
    assert_int_equal(ft_path_resolve(at("link-model/new/../config.json"), out, sizeof out), 0);
    assert_string_equal(out, at("model/config.json"));
    assert_int_equal(ft_path_resolve("/", out, sizeof out), 0);
    assert_string_equal(out, "/");
    assert_int_equal(ft_path_resolve("/..", out, sizeof out), 0);
    assert_string_equal(out, "/");
    /* relative: against the working directory */
    char cwd[4096];
    assert_non_null(getcwd(cwd, sizeof cwd));
    assert_int_equal(chdir(g_dir), 0);
    assert_int_equal(ft_path_resolve("link-model", out, sizeof out), 0);
    assert_string_equal(out, at("model"));
    assert_int_equal(ft_path_resolve("x/..", out, sizeof out), 0);
    assert_string_equal(out, g_dir);
    assert_int_equal(chdir(cwd), 0);
    /* too small an output */
    assert_int_equal(ft_path_resolve(at("model"), out, 4), FT_E_RANGE);
}

static void test_within(void **state)
{
    (void)state;
    assert_int_equal(ft_path_within(at("model"), at("model")), 1);
    assert_int_equal(ft_path_within(at("model/config.json"), at("model")), 1);
    assert_int_equal(ft_path_within(at("model/new/file"), at("model")), 1);
    assert_int_equal(ft_path_within(at("link-model"), at("model")), 1);
    assert_int_equal(ft_path_within(at("link-model/x"), at("model")), 1);
    assert_int_equal(ft_path_within(at("model"), at("link-model")), 1);
    assert_int_equal(ft_path_within(at("link-config"), at("model/config.json")), 1);
    assert_int_equal(ft_path_within(at("other/../model/sub"), at("model")), 1);
    assert_int_equal(ft_path_within(at("hard.jsonl"), at("data.jsonl")), 1); /* same inode */
    /* not inside: a sibling whose name starts the same, the parent, another folder */
    mk("model2", 1);
    assert_int_equal(ft_path_within(at("model2"), at("model")), 0);
    assert_int_equal(ft_path_within(at("model2/x"), at("model")), 0);
    assert_int_equal(ft_path_within(g_dir, at("model")), 0);
    assert_int_equal(ft_path_within(at("other"), at("model")), 0);
    assert_int_equal(ft_path_within(at("model/../other"), at("model")), 0);
    /* no file to replace: "-", NULL, empty, a parent that does not exist */
    assert_int_equal(ft_path_within("-", at("model")), 0);
    assert_int_equal(ft_path_within(at("model"), "-"), 0);
    assert_int_equal(ft_path_within(NULL, at("model")), 0);
    assert_int_equal(ft_path_within(at("model"), ""), 0);
    assert_int_equal(ft_path_within(at("nothing/x"), at("nothing")), 0);
    /* everything is inside "/" */
    assert_int_equal(ft_path_within(at("model"), "/"), 1);
}

static void test_check_output(void **state)
{
    (void)state;
    assert_int_equal(ft_path_check_output("--out", at("other"), NULL, "--model", at("model")), 0);
    assert_int_equal(ft_path_check_output("--out", at("model"), NULL, "--model", at("model")),
                     FT_E_INVALID);
    assert_non_null(strstr(ft_errmsg(), "is the --model folder"));
    assert_non_null(strstr(ft_errmsg(), "would replace its files"));
    assert_int_equal(ft_path_check_output("--out", at("model/sub/x"), NULL, "--model", at("model")),
                     FT_E_INVALID);
    assert_non_null(strstr(ft_errmsg(), "is inside the --model folder"));
    assert_int_equal(ft_path_check_output("--out", at("model/config.json"), NULL, "--adapter",
                                          at("link-model")), FT_E_INVALID);
    assert_non_null(strstr(ft_errmsg(), "/config.json would replace "));
    assert_non_null(strstr(ft_errmsg(), "inside the --adapter folder"));
    assert_int_equal(ft_path_check_output("--out", at("link-config"), NULL, "--data",
                                          at("model/config.json")), FT_E_INVALID);
    assert_non_null(strstr(ft_errmsg(), "is the --data file"));
    /* a file written inside the output folder */
    assert_int_equal(ft_path_check_output("--out", at("model"), "config.json", "--config",
                                          at("link-config")), FT_E_INVALID);
    assert_non_null(strstr(ft_errmsg(), "/config.json would replace the --config file"));
    assert_int_equal(ft_path_check_output("--out", at("other"), "config.json", "--config",
                                          at("model/config.json")), 0);
    assert_int_equal(ft_path_check_output("--out", at("model"), NULL, "--data", "-"), 0);
}

static void test_fd_is_path(void **state)
{
    (void)state;
    int fd = open(at("data.jsonl"), O_RDONLY);
    assert_true(fd >= 0);
    assert_int_equal(ft_fd_is_path(fd, at("data.jsonl")), 1);
    assert_int_equal(ft_fd_is_path(fd, at("hard.jsonl")), 1);
    assert_int_equal(ft_fd_is_path(fd, at("model/config.json")), 0);
    assert_int_equal(ft_fd_is_path(fd, "-"), 0);
    close(fd);
    int p[2];
    assert_int_equal(pipe(p), 0);
    assert_int_equal(ft_fd_is_path(p[1], at("data.jsonl")), 0); /* not a regular file */
    close(p[0]);
    close(p[1]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_resolve),
        cmocka_unit_test(test_within),
        cmocka_unit_test(test_check_output),
        cmocka_unit_test(test_fd_is_path),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
