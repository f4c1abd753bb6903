/* test_session.c - offload/session.h, the runtime session and its one placement decision
 * (ft_session_place), on tests/fixtures/tiny-llama on the CPU and cpu-device backends:
 *   - training on the CPU: auto is bf16 ("the cpu backend holds the base"), the weights are
 *     read, the executor is made for the micro-batches asked, no pack, no tiers;
 *   - the spare rule on a device, at its boundary: a deferred bf16 base whose executor with
 *     every layer resident plus FT_EXEC_SPARE_BYTES fits what --gpu-mem leaves beyond the memory
 *     in use is read (resident); one byte less and it is streamed from its bf16 pack (the note
 *     says so; the model becomes the pack's); training's auto chooses nf4 there instead;
 *   - the hook's stages: QUANT_CHOSEN before any pack exists, BASE_READY with the pack open,
 *     and a hook's error stops the placement;
 *   - training's plan of a pack not built: previewed (a plan note), nothing written to the
 *     cache, no executor; then the real placement builds it and places it by the planner;
 *   - the forward commands' NF4 open: the model is the pack's before any placement; the
 *     executor's adapter swaps and comes back. */
#include "tests/unit/harness.h"

#include <dirent.h>
#include <sys/stat.h>

#include "offload/exec_impl.h" /* the executor's state: tests read it */
#include "offload/session.h"
#include "src/core/err.h"

#define TINY "tests/fixtures/tiny-llama"

typedef struct notes {
    char text[16384];
    int n[3];                   /* by enum ft_session_note_kind */
} notes;

static void on_note(void *user, int kind, const char *line)
{
    notes *ns = user;
    size_t k = strlen(ns->text);
    snprintf(ns->text + k, sizeof ns->text - k, "%d %s\n", kind, line);
    if (kind >= 0 && kind < 3) ns->n[kind]++;
}

/* Files in dir (0 when it does not exist). */
static int n_files(const char *dir)
{
    DIR *d = opendir(dir);
    int n = 0;
    if (!d) return 0;
    for (struct dirent *e; (e = readdir(d));) n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

static void open_ok(ft_session *s, const char *device, int train, int quant, const char *cache,
                    int64_t gpu_mem, notes *ns)
{
    ft_session_cfg c = {TINY, device, 2, train, quant, cache, gpu_mem, 0, NULL, 0, on_note, ns};
    if (ft_session_open(s, &c) < 0) fail_msg("open: %s", ft_errmsg());
}

static void test_cpu_train(void **state)
{
    (void)state;
    notes ns = {0};
    ft_session s;
    open_ok(&s, "cpu", 1, FT_SESSION_QUANT_AUTO, NULL, 0, &ns);
    assert_true(ft_model_deferred(s.model));
    ft_lora l;
    ft_lora_cfg lc = {2, 4.0f, 0.0f, 0, FT_LORA_ALL_TARGETS, 1};
    assert_int_equal(ft_lora_init(&l, s.model, &lc, s.be), 0);
    ft_session_place_cfg pc = {32, 3, 32, &l, NULL, 0, 0, NULL, NULL};
    if (ft_session_place(&s, &pc) < 0) fail_msg("place: %s", ft_errmsg());
    assert_int_equal(s.quant, FT_PACK_QUANT_BF16);
    assert_string_equal(s.quant_why, "auto: the cpu backend holds the base in host memory");
    assert_false(ft_model_deferred(s.model));
    assert_true(s.has_ex && s.ex->lora == &l && s.ex->n_micro_max == 3 && s.ex->T_max == 32);
    assert_int_equal(s.n_micro, 3);
    assert_null(s.pack);
    assert_true(s.base_layers[0] == -1 && s.base_layers[1] == -1 && s.base_layers[2] == -1);
    assert_non_null(strstr(ns.text, "model weights read in"));
    assert_int_equal(ns.n[FT_SESSION_PLAN], 0);
    /* the adapter swaps out (the base alone) and back */
    assert_ptr_equal(ft_session_swap_adapter(&s, NULL), &l);
    assert_null(s.ex->lora);
    assert_null(ft_session_swap_adapter(&s, &l));
    ft_lora_free(&l); /* on the session's backend: before it closes (the executor keeps no hold) */
    ft_session_close(&s);
    assert_null(s.model);
}

/* The resident need of a forward session's executor for T tokens, with every layer resident,
 * as ft_session_place counts it, and what the device has in use. */
static void resident_need(ft_session *s, int64_t T, size_t *need, size_t *used)
{
    ft_mem_budget mb;
    assert_int_equal(ft_backend_mem_budget(s->be, 0, 0, &mb), 0);
    *need = ft_exec_bytes(s->be, s->model, NULL, T, 1) + FT_EXEC_SPARE_BYTES;
    *used = mb.used;
}

static void test_spare_rule(void **state)
{
    (void)state;
    char *cache = t_tmpdir();
    notes ns = {0};
    ft_session s;
    /* at the boundary: resident */
    open_ok(&s, "cpu-device", 0, FT_SESSION_QUANT_AUTO, cache, 0, &ns);
    size_t need, used;
    resident_need(&s, 16, &need, &used);
    s.gpu_mem = (int64_t)(used + need);
    if (ft_session_plan(&s, 16) < 0) fail_msg("plan: %s", ft_errmsg());
    assert_false(ft_model_deferred(s.model));
    assert_false(s.model->pack_only[0]);
    assert_null(s.pack);
    assert_true(s.has_ex);
    assert_null(strstr(ns.text, "streamed"));
    ft_session_close(&s);
    assert_int_equal(n_files(cache), 0);
    /* one byte less: streamed from its bf16 pack, built in the cache (the planner then needs
     * more than the tiny model's resident run: FT_E_RANGE naming the smallest budget) */
    memset(&ns, 0, sizeof ns);
    open_ok(&s, "cpu-device", 0, FT_SESSION_QUANT_AUTO, cache, 0, &ns);
    resident_need(&s, 16, &need, &used);
    s.gpu_mem = (int64_t)(used + need - 1);
    int rc = ft_session_plan(&s, 16);
    fprintf(stderr, "%s  -> %d: %s\n", ns.text, rc, rc ? ft_errmsg() : "");
    assert_non_null(strstr(ns.text, "it is streamed from its bf16 pack"));
    assert_non_null(strstr(ns.text, "pack: built"));
    assert_true(s.model->pack_only[0] && strstr(s.model->pack_only, "bf16"));
    assert_non_null(s.pack);
    assert_true(rc == 0 || rc == FT_E_RANGE);
    assert_int_equal(s.quant, FT_PACK_QUANT_BF16);
    ft_session_close(&s);
    assert_true(n_files(cache) > 0);
    /* training's auto at the same budget takes nf4 instead, saying why */
    memset(&ns, 0, sizeof ns);
    open_ok(&s, "cpu-device", 1, FT_SESSION_QUANT_AUTO, cache, 0, &ns);
    resident_need(&s, 16, &need, &used);
    s.gpu_mem = (int64_t)(used + need - 1);
    ft_session_place_cfg pc = {16, 1, 16, NULL, NULL, 1, 0, NULL, NULL};
    rc = ft_session_place(&s, &pc);
    assert_int_equal(s.quant, FT_PACK_QUANT_NF4);
    assert_non_null(strstr(s.quant_why, "auto: the bf16 base run needs"));
    assert_false(s.has_ex); /* a plan */
    ft_session_close(&s);
    t_rmtree(cache);
}

typedef struct hook_log {
    int stages[4], n;
    int files_at_quant;         /* files in the cache when the quantization was chosen */
    int pack_at_ready;          /* s->pack set at BASE_READY */
    const char *cache;
    int fail_at;                /* a stage whose call fails (0: none) */
} hook_log;

static int hook(void *user, ft_session *s, int stage)
{
    hook_log *h = user;
    h->stages[h->n++] = stage;
    if (stage == FT_SESSION_QUANT_CHOSEN) h->files_at_quant = n_files(h->cache);
    if (stage == FT_SESSION_BASE_READY) h->pack_at_ready = s->pack != NULL;
    return stage == h->fail_at ? ft_err(FT_E_INVALID, "hook refused stage %d", stage) : 0;
}

static void test_hook_and_preview(void **state)
{
    (void)state;
    char *cache = t_tmpdir();
    notes ns = {0};
    ft_session s;
    /* a plan of an NF4 base whose pack is not built: previewed, the cache left empty */
    open_ok(&s, "cpu-device", 1, FT_PACK_QUANT_NF4, cache, 0, &ns);
    ft_lora l;
    ft_lora_cfg lc = {2, 4.0f, 0.0f, 0, FT_LORA_ALL_TARGETS, 1};
    assert_int_equal(ft_lora_init(&l, s.model, &lc, s.be), 0);
    hook_log h = {.cache = cache};
    ft_session_place_cfg pc = {16, 0, 16, &l, NULL, 1, 0, hook, &h};
    if (ft_session_place(&s, &pc) < 0) fail_msg("plan: %s", ft_errmsg());
    assert_int_equal(h.n, 2);
    assert_true(h.stages[0] == FT_SESSION_QUANT_CHOSEN && h.stages[1] == FT_SESSION_BASE_READY);
    assert_non_null(s.preview);
    assert_null(s.pack);
    assert_false(s.has_ex);
    assert_non_null(strstr(ns.text, "the nf4 pack is not built yet"));
    assert_true(ns.n[FT_SESSION_PLAN] >= 2);
    assert_int_equal(n_files(cache), 0);
    assert_true(s.n_micro >= 1 && s.base_layers[0] == 2);
    /* the run itself: the pack built (after QUANT_CHOSEN), open at BASE_READY, placed */
    pc.plan_only = 0;
    ft_pack_preview_free(s.preview);
    free(s.preview);
    s.preview = NULL;
    h = (hook_log){.cache = cache};
    memset(&ns, 0, sizeof ns);
    if (ft_session_place(&s, &pc) < 0) fail_msg("place: %s", ft_errmsg());
    assert_int_equal(h.files_at_quant, 0);
    assert_true(h.pack_at_ready);
    assert_true(s.has_ex && s.model->pack_only[0]);
    assert_int_equal(s.base_layers[0], 2);
    assert_non_null(strstr(ns.text, "pack: built"));
    assert_non_null(strstr(ns.text, "placed: device memory in use"));
    /* a hook's error stops the placement with it, no executor left */
    h = (hook_log){.cache = cache, .fail_at = FT_SESSION_BASE_READY};
    assert_int_equal(ft_session_place(&s, &pc), FT_E_INVALID);
    assert_non_null(strstr(ft_errmsg(), "hook refused stage 2"));
    assert_false(s.has_ex);
    ft_lora_free(&l);
    ft_session_close(&s);
    t_rmtree(cache);
}

static void test_forward_nf4_open(void **state)
{
    (void)state;
    char *cache = t_tmpdir();
    notes ns = {0};
    ft_session s;
    open_ok(&s, "cpu", 0, FT_PACK_QUANT_NF4, cache, 0, &ns);
    assert_true(s.model->pack_only[0] && strstr(s.model->pack_only, "nf4"));
    assert_non_null(s.pack);
    assert_non_null(strstr(ns.text, "pack: built"));
    s.pack_in_memory = 1;
    if (ft_session_plan(&s, 8) < 0) fail_msg("plan: %s", ft_errmsg());
    assert_int_equal(s.quant, FT_PACK_QUANT_NF4);
    assert_true(s.has_ex && s.ex->pack == s.pack && s.ex->pack_host != NULL);
    ft_session_close(&s);
    /* reopened: the pack is reused, no build noted */
    memset(&ns, 0, sizeof ns);
    open_ok(&s, "cpu", 0, FT_PACK_QUANT_NF4, cache, 0, &ns);
    assert_null(strstr(ns.text, "pack: built"));
    ft_session_close(&s);
    t_rmtree(cache);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cpu_train),
        cmocka_unit_test(test_spare_rule),
        cmocka_unit_test(test_hook_and_preview),
        cmocka_unit_test(test_forward_nf4_open),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
