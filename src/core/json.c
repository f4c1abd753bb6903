/* json.c - cJSON helpers (see json.h). */
#include "src/core/json.h"

#include <stdlib.h>
#include <string.h>

static _Thread_local unsigned long g_oom; /* failed cJSON allocations of this thread */

static void *json_malloc(size_t n)
{
    void *p = malloc(n);
    if (!p) g_oom++;
    return p;
}

void ft_json_init(void)
{
    static int done;
    if (done) return;
    cJSON_Hooks h = {json_malloc, free};
    cJSON_InitHooks(&h);
    done = 1;
}

unsigned long ft_json_oom_mark(void) { return g_oom; }

int ft_json_oom_since(unsigned long mark) { return g_oom != mark; }

const char *ft_json_type(const cJSON *v)
{
    if (!v) return "nothing";
    if (cJSON_IsNull(v)) return "null";
    if (cJSON_IsBool(v)) return "a boolean";
    if (cJSON_IsNumber(v)) return "a number";
    if (cJSON_IsString(v)) return "a string";
    if (cJSON_IsArray(v)) return "a list";
    if (cJSON_IsObject(v)) return "an object";
    return "an invalid value";
}

static int cmp_key(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

const char *ft_json_dup_key(const cJSON *o, int recursive, int *oom)
{
    if (!o) return NULL;
    size_t n = 0;
    const cJSON *it;
    for (it = o->child; it; it = it->next) {
        n++;
        if (recursive && (cJSON_IsObject(it) || cJSON_IsArray(it))) {
            const char *d = ft_json_dup_key(it, 1, oom);
            if (d || *oom) return d;
        }
    }
    if (!cJSON_IsObject(o) || n < 2) return NULL;
    const char **keys = malloc(n * sizeof *keys);
    if (!keys) {
        *oom = 1;
        return NULL;
    }
    n = 0;
    for (it = o->child; it; it = it->next) keys[n++] = it->string ? it->string : "";
    qsort(keys, n, sizeof *keys, cmp_key);
    const char *d = NULL;
    for (size_t i = 1; i < n && !d; i++)
        if (!strcmp(keys[i - 1], keys[i])) d = keys[i];
    free(keys);
    return d;
}

int ft_json_next_nul(ft_json_nul_scan *st, const char *s, size_t n)
{
    size_t i = st->off;
    if (!st->started) {
        st->started = 1;
        st->cur = -1;
        /* most texts hold neither: two fast scans decide it */
        if (!memchr(s + i, 0, n - i) && !memmem(s + i, n - i, "\\u0000", 6)) {
            st->off = n;
            return 0;
        }
    } else if (i < n) {
        i += s[i] == '\\' ? 6 : 1; /* past the last hit */
    }
    for (; i < n; i++) {
        const char c = s[i];
        if (c == 0) break;
        if (st->in_str) {
            if (c == '\\') {
                if (i + 5 < n && s[i + 1] == 'u' && !memcmp(s + i + 2, "0000", 4)) break;
                i++; /* the escaped character */
            } else if (c == '"') {
                st->in_str = 0;
            }
            continue;
        }
        if (c == '"') st->in_str = 1;
        else if (c == '[' || c == '{') {
            if (st->depth++ == 0 && c == '[') st->cur = 0;
        } else if (c == ']' || c == '}') {
            if (st->depth > 0) st->depth--;
        } else if (c == ',' && st->depth == 1 && st->cur >= 0) {
            st->cur++;
        }
    }
    st->off = i < n ? i : n;
    if (i >= n) return 0;
    st->elem = st->depth >= 1 ? st->cur : -1;
    return 1;
}

size_t ft_json_find_nul(const char *s, size_t n)
{
    ft_json_nul_scan st = {0};
    return ft_json_next_nul(&st, s, n) ? st.off : n;
}
