/* tfevents.h - TensorBoard event files (what tf.summary and torch's SummaryWriter write, and
 * TensorBoard, W&B's --sync-tensorboard and others read).
 *
 * Format: TensorFlow's TFRecord framing (tensorflow/core/lib/io/record_writer.cc) of
 * serialized `Event` protobufs (tensorflow/core/util/event.proto; our subset in
 * src/formats/tb_event.proto, packed by protobuf-c). Each record is
 *     uint64 length (little-endian)
 *     uint32 masked_crc32c(the 8 length bytes)
 *     length bytes of data (one Event)
 *     uint32 masked_crc32c(data)
 * with masked_crc32c(x) = ((c >> 15) | (c << 17)) + 0xa282ead8, c = CRC-32C(x) (the
 * Castagnoli polynomial, RFC 3720 B.4). The file is named events.out.tfevents.<time>.<host>
 * (<time> = the creation time in seconds, 10 digits, as TensorFlow's EventsWriter names it);
 * its first record is the file_version event "brain.Event:2". Scalars are Summary values
 * with simple_value (float32), which TensorBoard's scalar dashboard reads.
 *
 * Each record goes out in one write(2) as it is added, so a process killed at any point
 * leaves a file whose records up to the last completed call are whole.
 */
#ifndef FT_TFEVENTS_H
#define FT_TFEVENTS_H

#include <stddef.h>
#include <stdint.h>

typedef struct ft_tfevents ft_tfevents;

/* 1 if this build writes event files (protobuf-c found at build time), else 0: then
 * ft_tfevents_open returns FT_E_UNSUPPORTED naming the Debian packages to install. */
int ft_tfevents_available(void);

/* Creates dir (and its parents) and a new event file in it, named as above for wall_time
 * (seconds since the epoch) and this host's name; a file of that name already there (a run
 * started in the same second) gets ".1", ".2", ... appended rather than being overwritten.
 * Writes the file_version record, then a SessionLog START at step 0, which tells
 * TensorBoard's reader (event_accumulator, purge_orphaned_data) to drop whatever older
 * event files in dir hold: the file's events then stand for the whole run. Returns 0 with
 * *out set, or -errno / FT_E_UNSUPPORTED (message names the path). */
int ft_tfevents_open(ft_tfevents **out, const char *dir, double wall_time);

/* Appends one Event at `step` holding n scalar Summary values tags[i] = values[i] (NaN and
 * Inf are written as they are). Returns 0, or -errno naming the file. */
int ft_tfevents_scalars(ft_tfevents *w, int64_t step, double wall_time, const char *const *tags,
                        const float *values, int n);

/* Appends one Event at `step` holding one text Summary value under tag, as TensorBoard's text
 * plugin reads it (tensorboard/plugins/text/summary_v2.py): metadata plugin_name "text"
 * (content: an empty TextPluginData, version 0), data_class DATA_CLASS_TENSOR, and a DT_STRING
 * tensor of shape (rows, cols) holding cells[0 .. rows * cols) row by row, each a UTF-8
 * string (the plugin renders each cell as Markdown; a rank-2 tensor as a table). rows, cols
 * >= 1. Returns 0, FT_E_INVALID (rows or cols < 1), or -errno naming the file. */
int ft_tfevents_text(ft_tfevents *w, int64_t step, double wall_time, const char *tag,
                     const char *const *cells, int64_t rows, int64_t cols);

/* The file's path ("" for NULL). */
const char *ft_tfevents_path(const ft_tfevents *w);

/* Closes the file (NULL-safe). */
void ft_tfevents_close(ft_tfevents *w);

/* CRC-32C (Castagnoli, reflected polynomial 0x82F63B78, initial value and final XOR
 * 0xFFFFFFFF) of n bytes, continuing from crc (0 to start): RFC 3720 appendix B.4. */
uint32_t ft_crc32c(uint32_t crc, const void *p, size_t n);

/* TFRecord's masked CRC of n bytes (see above). */
uint32_t ft_tfrecord_masked_crc(const void *p, size_t n);

/* Frames data (n bytes) as one TFRecord into rec (n + 16 bytes); data may already lie at
 * rec + 12. */
void ft_tfrecord_frame(uint8_t *rec, const void *data, size_t n);

#endif
