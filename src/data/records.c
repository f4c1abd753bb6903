/* records.c - JSONL / JSON-array record reader (see records.h). */
#include "src/data/records.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/core/err.h"
#include "src/core/fsutil.h"
#include "src/core/json.h"

static int is_blank(char c)
{
    return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\f' || c == '\v';
}

/* Up to 24 bytes of s[0..n) as printable ASCII (others as '?'), for error messages. */
static void snippet(char *out, size_t out_n, const char *s, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n && i < 24 && k + 1 < out_n; i++) {
        unsigned char c = (unsigned char)s[i];
        out[k++] = (c >= 0x20 && c < 0x7f) ? (char)c : '?';
    }
    out[k] = 0;
}

/* 1-based line and column of byte offset `off` in data. */
static void line_col(const char *data, size_t off, int64_t *line, int64_t *col)
{
    int64_t l = 1;
    size_t start = 0;
    for (size_t i = 0; i < off; i++)
        if (data[i] == '\n') { l++; start = i + 1; }
    *line = l;
    *col = (int64_t)(off - start) + 1;
}

/* The elements of a JSON array (its text data[p, q)) whose strings hold a NUL (json.h):
 * r->nul_at[i] is the file offset of element i's first one, or SIZE_MAX; NULL when none
 * has one (the common case: two fast scans). */
static int array_nuls(ft_records *r, size_t p, size_t q)
{
    ft_json_nul_scan st = {0};
    while (ft_json_next_nul(&st, r->data + p, q - p)) {
        if (st.elem < 0) continue; /* outside the elements: the parse refused that already */
        if (!r->nul_at) {
            int64_t n = cJSON_GetArraySize(r->root);
            r->n_nul_at = n;
            r->nul_at = malloc((size_t)(n ? n : 1) * sizeof *r->nul_at);
            if (!r->nul_at) {
                int rc = ft_err(-ENOMEM, "%s: out of memory", r->path);
                ft_records_close(r);
                return rc;
            }
            for (int64_t i = 0; i < n; i++) r->nul_at[i] = SIZE_MAX;
        }
        if (st.elem < r->n_nul_at && r->nul_at[st.elem] == SIZE_MAX) r->nul_at[st.elem] = p + st.off;
    }
    return 0;
}

int ft_records_open(ft_records *r, const char *path)
{
    memset(r, 0, sizeof *r);
    r->path = strdup(ft_input_name(path)); /* "<stdin>" for "-" */
    if (!r->path) return ft_err(-ENOMEM, "%s: out of memory", path);
    int rc = ft_read_input(path, "a data file", &r->data, &r->len, FT_INPUT_DATA);
    if (rc < 0) {
        ft_records_close(r);
        return rc;
    }
    size_t off = 0;
    if (r->len >= 3 && !memcmp(r->data, "\xEF\xBB\xBF", 3)) off = 3; /* UTF-8 BOM */
    r->off = off;
    size_t p = off;
    while (p < r->len && is_blank(r->data[p])) p++;
    if (p >= r->len || r->data[p] != '[') return 0; /* JSONL (or empty) */

    r->is_array = 1;
    const char *end = NULL;
    unsigned long oom = ft_json_oom_mark();
    r->root = cJSON_ParseWithLengthOpts(r->data + p, r->len - p, &end, 0);
    if (!r->root && ft_json_oom_since(oom)) {
        rc = ft_err(-ENOMEM, "%s: out of memory while parsing its JSON array (%zu bytes)", r->path,
                    r->len - p);
        ft_records_close(r);
        return rc;
    }
    if (!r->root) {
        size_t eo = end ? (size_t)(end - r->data) : p;
        int64_t line, col;
        line_col(r->data, eo, &line, &col);
        char near[32];
        snippet(near, sizeof near, r->data + eo, r->len - eo);
        rc = ft_err(FT_E_INVALID, "%s: line %lld, column %lld: malformed JSON array (near '%s')",
                    r->path, (long long)line, (long long)col, near);
        ft_records_close(r);
        return rc;
    }
    size_t q = (size_t)(end - r->data);
    while (q < r->len && is_blank(r->data[q])) q++;
    if (q < r->len) {
        int64_t line, col;
        line_col(r->data, q, &line, &col);
        rc = ft_err(FT_E_INVALID, "%s: line %lld, column %lld: unexpected text after the JSON array",
                    r->path, (long long)line, (long long)col);
        ft_records_close(r);
        return rc;
    }
    r->next = r->root->child;
    r->index = -1;
    return array_nuls(r, p, q);
}

static int next_line(ft_records *r, ft_record *rec)
{
    cJSON_Delete(r->cur);
    r->cur = NULL;
    while (r->off < r->len) {
        const char *s = r->data + r->off;
        const char *nl = memchr(s, '\n', r->len - r->off);
        size_t n = nl ? (size_t)(nl - s) : r->len - r->off;
        r->off += n + (nl ? 1 : 0);
        r->line++;
        size_t a = 0;
        while (a < n && is_blank(s[a])) a++;
        if (a == n) continue; /* blank line: not a record */
        rec->loc = r->line;
        rec->err[0] = 0;
        const char *end = NULL;
        unsigned long oom = ft_json_oom_mark();
        cJSON *j = cJSON_ParseWithLengthOpts(s, n, &end, 0);
        if (!j && ft_json_oom_since(oom))
            return ft_err(-ENOMEM, "%s: line %lld: out of memory while parsing the record", r->path,
                          (long long)r->line);
        if (!j) {
            size_t eo = end ? (size_t)(end - s) : 0;
            if (eo > n) eo = n;
            char near[32];
            snippet(near, sizeof near, s + eo, n - eo);
            snprintf(rec->err, sizeof rec->err, "malformed JSON at column %lld (near '%s')",
                     (long long)eo + 1, near);
            rec->json = NULL;
            return 1;
        }
        size_t q = (size_t)(end - s);
        while (q < n && is_blank(s[q])) q++;
        if (q < n) {
            cJSON_Delete(j);
            snprintf(rec->err, sizeof rec->err,
                     "malformed JSON at column %lld: unexpected text after the record "
                     "(JSONL holds one record per line)", (long long)q + 1);
            rec->json = NULL;
            return 1;
        }
        size_t z = ft_json_find_nul(s, n);
        if (z < n) { /* the record is refused, never cut (json.h) */
            cJSON_Delete(j);
            snprintf(rec->err, sizeof rec->err, "column %lld: %s", (long long)z + 1, FT_JSON_NUL_WHY);
            rec->json = NULL;
            return 1;
        }
        r->cur = j;
        rec->json = j;
        return 1;
    }
    return 0;
}

int ft_records_next(ft_records *r, ft_record *rec)
{
    if (!r->data) return 0;
    if (!r->is_array) return next_line(r, rec);
    if (!r->next) return 0;
    rec->json = r->next;
    rec->loc = ++r->index;
    rec->err[0] = 0;
    r->next = r->next->next;
    if (r->nul_at && rec->loc < r->n_nul_at && r->nul_at[rec->loc] != SIZE_MAX) {
        int64_t line, col; /* refused, never cut (json.h) */
        line_col(r->data, r->nul_at[rec->loc], &line, &col);
        snprintf(rec->err, sizeof rec->err, "line %lld, column %lld: %s", (long long)line,
                 (long long)col, FT_JSON_NUL_WHY);
        rec->json = NULL;
    }
    return 1;
}

cJSON *ft_records_take(ft_records *r)
{
    cJSON *j = r->cur;
    r->cur = NULL;
    return j;
}

void ft_records_where(const ft_records *r, int64_t loc, char *buf, size_t n)
{
    /* lines and array records are both counted from 1 for people */
    snprintf(buf, n, "%s: %s %lld", r->path ? r->path : "?", r->is_array ? "record" : "line",
             (long long)(r->is_array ? loc + 1 : loc));
}

void ft_records_close(ft_records *r)
{
    if (!r) return;
    cJSON_Delete(r->cur);
    cJSON_Delete(r->root);
    free(r->nul_at);
    free(r->data);
    free(r->path);
    memset(r, 0, sizeof *r);
}
