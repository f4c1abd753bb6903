/* test_comm.c - src/comm/comm.h in one process and src/train/dist.h's share of a step: a NULL
 * communicator and the single-process backend are rank 0 of 1 and every collective is the
 * identity; the MPI backend is refused with the package's name where this build lacks it; the
 * NCCL backend without the CUDA build or libnccl is an error naming it; the share of a step of
 * size x grad_accum micro-batches is contiguous and covers a short last step. (The collectives
 * over several ranks are tests/ref/test_distributed.py's, under mpirun.) */
#include "tests/unit/harness.h"

#include <string.h>

#include "src/comm/comm.h"
#include "src/core/err.h"
#include "src/train/dist.h"

static void test_null_and_single(void **state)
{
    assert_int_equal(ft_comm_rank(NULL), 0);
    assert_int_equal(ft_comm_size(NULL), 1);
    assert_string_equal(ft_comm_name(NULL), "single");
    float v[3] = {1.5f, -2.0f, 3.25f};
    assert_int_equal(ft_comm_allreduce_f32(NULL, v, 3), 0);
    assert_true(v[0] == 1.5f && v[1] == -2.0f && v[2] == 3.25f);
    ft_comm *c;
    ft_comm_cfg cfg = {.kind = FT_COMM_SINGLE, .rank = -1, .size = -1, .local_rank = -1};
    assert_int_equal(ft_comm_init(&c, &cfg), 0);
    assert_int_equal(ft_comm_size(c), 1);
    assert_int_equal(ft_comm_rank(c), 0);
    double d[2] = {7, 8};
    assert_int_equal(ft_comm_allreduce_f64(c, d, 2), 0);
    assert_true(d[0] == 7 && d[1] == 8);
    int rec = 42, all = 0;
    assert_int_equal(ft_comm_gather(c, &rec, sizeof rec, &all, 0), 0);
    assert_int_equal(all, 42);
    all = 0;
    assert_int_equal(ft_comm_allgather(c, &rec, sizeof rec, &all), 0);
    assert_int_equal(all, 42);
    assert_int_equal(ft_comm_bcast(c, &rec, sizeof rec, 0), 0);
    assert_int_equal(ft_comm_barrier(c), 0);
    assert_int_equal(ft_comm_has_device_allreduce(c), 0);
    assert_int_equal(ft_comm_allreduce_f32_device(c, v, 3), FT_E_UNSUPPORTED);
    ft_comm_abort(c, 1); /* a single process: returns */
    ft_comm_free(c);
}

static void test_missing_backends(void **state)
{
    ft_comm *c = (ft_comm *)1;
    ft_comm_cfg bad = {.kind = 7};
    assert_int_equal(ft_comm_init(&c, &bad), FT_E_INVALID);
    assert_null(c);
    if (!ft_comm_have_mpi()) {
        ft_comm_cfg m = {.kind = FT_COMM_MPI, .rank = 0, .size = 2};
        assert_int_equal(ft_comm_init(&c, &m), FT_E_UNSUPPORTED);
        assert_non_null(strstr(ft_errmsg(), "libopenmpi-dev"));
    }
    /* NCCL through an id file, without MPI: this CPU build (or a machine without libnccl)
     * refuses it naming what is missing */
    ft_comm_cfg n = {.kind = FT_COMM_NCCL, .rank = 0, .size = 1, .nccl_id_file = "/nonexistent/id"};
    int rc = ft_comm_init(&c, &n);
    if (rc == 0) { /* a CUDA build on a machine with libnccl and a GPU */
        ft_comm_free(c);
        return;
    }
    assert_non_null(strstr(ft_errmsg(), "nccl"));
}

static void test_share(void **state)
{
    ft_batch mbs[7];
    memset(mbs, 0, sizeof mbs);
    ft_train_cfg c;
    memset(&c, 0, sizeof c);
    c.grad_accum = 3;
    const ft_batch *mine;
    int64_t n, first;
    ft_train_dist_share(&c, mbs, 3, &mine, &n, &first); /* one process: the whole step */
    assert_ptr_equal(mine, mbs);
    assert_int_equal(n, 3);
    assert_int_equal(first, 0);
    assert_int_equal(ft_train_dist_global_accum(&c), 3);
    assert_int_equal(ft_train_dist_writer(&c), 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_null_and_single),
        cmocka_unit_test(test_missing_backends),
        cmocka_unit_test(test_share),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
