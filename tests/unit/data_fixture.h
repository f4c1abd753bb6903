/* data_fixture.h - shared by the data-set tests (test_dataset.c, test_pref_data.c): what an
 * encoded example trains. Include after harness.h. */
#ifndef FT_TEST_DATA_FIXTURE_H
#define FT_TEST_DATA_FIXTURE_H

#include <stdlib.h>

#include "src/data/dataset.h"
#include "src/tokenizer/tokenizer.h"

/* The decoded text of the trained tokens of ex (labels != -100, each equal to its id), a new
 * string. */
static inline char *trained_text(const ft_tokenizer *t, const ft_example *ex)
{
    int32_t *ids = malloc((size_t)(ex->n + 1) * sizeof *ids);
    int64_t k = 0;
    for (int64_t i = 0; i < ex->n; i++)
        if (ex->labels[i] != FT_IGNORE_INDEX) {
            assert_int_equal(ex->labels[i], ex->ids[i]);
            ids[k++] = ex->ids[i];
        }
    char *s = NULL;
    assert_int_equal(ft_tok_decode(t, ids, k, 0, &s), 0);
    free(ids);
    return s;
}

#endif
