/* records.h - reads a data file as a sequence of JSON records (cJSON), one at a time, each
 * with its location: JSONL (one JSON value per line; blank lines are not records) or one
 * JSON array of records (formats.md 8.1). Internal to src/data (used by dataset.c).
 *
 * The format is chosen by the first non-blank byte of the file (after an optional UTF-8
 * BOM): '[' -> JSON array, anything else -> JSONL. A malformed JSONL line is returned as a
 * record with json == NULL and the parse error text, so the caller can skip it
 * (skip_bad_records) or fail; a malformed JSON array fails the whole file.
 */
#ifndef FT_RECORDS_H
#define FT_RECORDS_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

typedef struct ft_records {
    char *path;          /* copy of the file name (for messages; "<stdin>" for "-") */
    char *data;          /* whole file, NUL-terminated */
    size_t len;
    int is_array;        /* 1: JSON array; 0: JSONL */
    /* JSONL cursor */
    size_t off;          /* byte offset of the next line */
    int64_t line;        /* 1-based number of the last line read */
    /* JSON array cursor */
    cJSON *root;
    cJSON *next;         /* next array element */
    int64_t index;       /* 0-based index of the last element returned */
    cJSON *cur;          /* JSONL: the record last returned (owned, freed on next/close) */
    size_t *nul_at;      /* JSON array: element i's first NUL in a string (file offset), or
                          * SIZE_MAX; NULL when no element has one */
    int64_t n_nul_at;
} ft_records;

typedef struct ft_record {
    const cJSON *json;   /* the record; NULL when its line is not valid JSON */
    int64_t loc;         /* JSONL: 1-based line number; array: 0-based index */
    char err[160];       /* json == NULL: why ("malformed JSON at column C: ...") */
} ft_record;

/* Opens path and, for a JSON array, parses it. path is read by ft_read_input with
 * FT_INPUT_DATA: a regular file, "-" (standard input; FILE in messages is then "<stdin>"),
 * a pipe (/dev/fd/N), a FIFO with a writer or a device, gzip content decompressed. Returns
 * 0, -errno (message names the path), -ENOMEM, FT_E_CORRUPT (gzip data corrupt or
 * truncated), FT_E_INVALID ("FILE: line L, column C: malformed JSON array ..." or
 * "FILE: expected a JSON array of records, found ..."; a FIFO with no writer). An empty or
 * blank file is not an error here: the first ft_records_next returns 0. */
int ft_records_open(ft_records *r, const char *path);

/* The next record: returns 1 with *rec filled (rec->json valid until the next call or
 * ft_records_close; json == NULL for a malformed JSONL line, and for a record any of whose
 * strings holds U+0000, as \u0000 or a raw NUL byte: cJSON's C strings would end there and
 * the record be read cut, so it is refused with the column (JSONL) or line and column
 * (array) in rec->err, json.h FT_JSON_NUL_WHY), 0 at the end, -ENOMEM. */
int ft_records_next(ft_records *r, ft_record *rec);

/* Ownership of the record last returned by ft_records_next, for a caller that keeps several
 * records at once: a JSONL line's tree, which the caller then frees (cJSON_Delete), or NULL
 * for a JSON array's element (it lives until ft_records_close) or a malformed line. */
cJSON *ft_records_take(ft_records *r);

/* Writes "FILE: line N" (JSONL) or "FILE: record N" (1-based array position) for loc. */
void ft_records_where(const ft_records *r, int64_t loc, char *buf, size_t n);

void ft_records_close(ft_records *r); /* NULL-safe; idempotent */

#endif
