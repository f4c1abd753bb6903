/* json.c - cJSON helpers (see json.h). */
#include "src/core/json.h"

#include <stdlib.h>
#include <string.h>

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
