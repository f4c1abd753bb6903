/* test_peft_hints.c - serving hints for vLLM's LoRA rank limit (adapters/peft.h). */
#include "tests/unit/harness.h"

#include "adapters/peft.h"

static int hint(int64_t r, char *buf, size_t n)
{
    ft_lora_cfg c = {r, 2.0f * (float)r, 0.0f, 0, 0x7f, 1};
    return ft_peft_serving_hints(&c, buf, n);
}

static void test_rank_hints(void **state)
{
    (void)state;
    char buf[512];
    assert_int_equal(hint(8, buf, sizeof buf), 0);
    assert_string_equal(buf, "");
    assert_int_equal(hint(16, buf, sizeof buf), 0);
    assert_int_equal(hint(17, buf, sizeof buf), 1);
    assert_non_null(strstr(buf, "--max-lora-rank 32"));
    assert_int_equal(hint(300, buf, sizeof buf), 1);
    assert_non_null(strstr(buf, "--max-lora-rank 320"));
    assert_int_equal(hint(512, buf, sizeof buf), 1);
    assert_non_null(strstr(buf, "--max-lora-rank 512"));
    assert_int_equal(hint(1024, buf, sizeof buf), 1);
    assert_non_null(strstr(buf, "cannot load"));
    printf("rank 1024: %s\n", buf);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_rank_hints)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
