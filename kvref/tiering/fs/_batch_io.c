/* kvref.tiering.fs._batch_io: the block files of one I/O task, written or read in one call that
 * releases the GIL.
 *
 * Why C: a task moves several blocks, and each block is four to six system calls plus a
 * checksum. Done from Python, every call hands the GIL back and takes it again, so with a dozen
 * I/O threads most of a small block's CPU goes to GIL hand-overs and the context switches they
 * cause, not to the disk (tools/bench_vllm_tiers.py: about 3x vLLM's CPU per GiB at 256 KiB).
 * Here the whole task runs without the GIL: one hand-over per task.
 *
 * What: the same file work as kvref/tiering/fs/block_io.py's Python path, which stays the
 * reference (and the fallback where this module was not built): the same format (format.py),
 * the same outcomes, the same files. tests/tiering/test_fs_batch_io.py holds the two to each
 * other. Hashing is XXH3-64 from the xxHash library (vendor/xxhash.h, BSD-2), the same
 * algorithm the `xxhash` package computes on the Python path.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

/* x86-64: XXH3 in AVX2 where the CPU has it, chosen at run time (the build targets any x86-64,
 * whose baseline is SSE2). On the project's machine AVX2 hashed a cold 2 MiB payload in 0.064 s
 * per GiB, SSE2 in 0.17 s: a load's largest CPU cost after the copy. Both give the same hash. */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define KVREF_X86_64 1
#define XXH_DISPATCH_AVX2 1
#define XXH_TARGET_AVX2 __attribute__((__target__("avx2")))
#include <immintrin.h>
#endif
#define XXH_INLINE_ALL
#include "vendor/xxhash.h"

#include "copy_payload.h" /* shared with tools/_plain_block_files.c */

/* The block file format (format.py). */
#define ALIGN 4096
#define FORMAT_VERSION 4
#define CHECKSUM_XXH3_64 1
#define FIELDS_BYTES 24 /* "<8sHHHHQ": magic, format, algorithm, key length, reserved, payload */
#define RECORD_HEADER_BYTES (FIELDS_BYTES + 16) /* then two XXH3-64 checksums */
#define MAX_REQUEST (1 << 20) /* bytes per preadv/pwritev: posix_io.py's MAX_REQUEST_BYTES */
#define MAX_LAST_REQUEST (MAX_REQUEST + MAX_REQUEST / 4) /* posix_io.py's MAX_LAST_REQUEST_BYTES */
#define MAX_IOV 4             /* entries of the longest vector read_block or write_block makes */
#define MAX_HEADER_BYTES (4 * ALIGN)            /* header_bytes(MAX_KEY_BYTES) */
static const char MAGIC[8] = {'K', 'V', 'R', 'E', 'F', 'B', 'L', 'K'};

/* read_blocks' outcomes (ReadProblem in block_io.py). */
enum { READ_OK = 0, READ_MISSING = 1, READ_DAMAGED = 2, READ_UNREADABLE = 3 };
/* write_blocks' and rename_files' outcomes; a negative one is -errno. */
enum { WRITE_DONE = 0, WRITE_EXISTED = 1 };
/* write_blocks' `sync` flags. */
enum { SYNC_FSYNC = 1, SYNC_WRITE_BACK = 2, SYNC_DROP_PAGES = 4 };

static const unsigned char ZERO_PAGE[ALIGN];

static size_t align_up(size_t size) { return (size + ALIGN - 1) / ALIGN * ALIGN; }

static size_t header_bytes(size_t key_len) { return align_up(RECORD_HEADER_BYTES + key_len); }

static void put_le(unsigned char *out, uint64_t value, int bytes) {
    for (int i = 0; i < bytes; i++) out[i] = (unsigned char)(value >> (8 * i));
}

static uint64_t get_le64(const unsigned char *in) {
    uint64_t value = 0;
    for (int i = 7; i >= 0; i--) value = (value << 8) | in[i];
    return value;
}

static void pack_fields(unsigned char *out, size_t key_len, size_t block_bytes) {
    memcpy(out, MAGIC, sizeof MAGIC);
    put_le(out + 8, FORMAT_VERSION, 2);
    put_le(out + 10, CHECKSUM_XXH3_64, 2);
    put_le(out + 12, key_len, 2);
    put_le(out + 14, 0, 2);
    put_le(out + 16, block_bytes, 8);
}

/* One task's shared facts; every pointer stays valid while the GIL is released. */
typedef struct {
    unsigned char *scratch; /* page-aligned: header(s), a bounced payload, a last page */
    size_t scratch_len;
    size_t block_bytes;
    size_t padded; /* align_up(block_bytes): the payload's bytes in the file */
    int open_flags;
    int zero_copy;  /* rows go to and from the device as they are */
    int drop_pages; /* buffered reads: drop the clean pages a read brought in */
} task_t;

typedef struct {
    PyObject *path;     /* bytes (file system encoding) */
    PyObject *tmp_path; /* bytes, writes only */
    PyObject *key_object; /* holds `key` */
    const char *key;
    size_t key_len;
    Py_buffer row;
    int has_row;
    long result;
} block_t;

/* Moves the vector past `done` bytes: drops the entries done, shortens a partly done one. */
static void advance(struct iovec **iov, int *count, size_t done) {
    while (*count > 0 && done >= (*iov)->iov_len) {
        done -= (*iov)->iov_len;
        (*iov)++;
        (*count)--;
    }
    if (*count > 0 && done > 0) {
        (*iov)->iov_base = (char *)(*iov)->iov_base + done;
        (*iov)->iov_len -= done;
    }
}

/* One system call's share of a vector, into `out` (as many entries): all of it, up to
 * MAX_LAST_REQUEST bytes, else its first MAX_REQUEST. Devices take requests of up to 1 MiB best,
 * and a small last request costs a round trip of its own (posix_io.py's MAX_REQUEST_BYTES and
 * MAX_LAST_REQUEST_BYTES say why). */
static int clip(const struct iovec *iov, int count, struct iovec *out) {
    size_t total = 0;
    for (int i = 0; i < count; i++) total += iov[i].iov_len;
    size_t room = total <= MAX_LAST_REQUEST ? total : MAX_REQUEST;
    int taken = 0;
    while (taken < count && room > 0) {
        out[taken] = iov[taken];
        if (out[taken].iov_len > room) out[taken].iov_len = room;
        room -= out[taken].iov_len;
        taken++;
    }
    return taken;
}

/* Reads until the vector is full or the file ends: the bytes read, or -errno. */
static ssize_t read_all(int fd, struct iovec *iov, int count) {
    ssize_t total = 0;
    struct iovec part[MAX_IOV];
    while (count > 0) {
        ssize_t got = preadv(fd, part, clip(iov, count, part), total);
        if (got < 0) {
            if (errno == EINTR) continue;
            return -errno;
        }
        if (got == 0) break;
        total += got;
        advance(&iov, &count, (size_t)got);
    }
    return total;
}

/* Writes the whole vector: 0, or an errno. */
static int write_all(int fd, struct iovec *iov, int count) {
    off_t offset = 0;
    struct iovec part[MAX_IOV];
    while (count > 0) {
        ssize_t done = pwritev(fd, part, clip(iov, count, part), offset);
        if (done < 0) {
            if (errno == EINTR) continue;
            return errno;
        }
        if (done == 0) return EIO; /* no progress */
        offset += done;
        advance(&iov, &count, (size_t)done);
    }
    return 0;
}

#ifdef KVREF_X86_64
static int use_avx2; /* set when the module is loaded (exec_module), and by set_avx2 */

static XXH_TARGET_AVX2 __attribute__((noinline)) void update_avx2(XXH3_state_t *state,
                                                                  const void *input, size_t len) {
    XXH3_update(state, (const xxh_u8 *)input, len, XXH3_accumulate_avx2, XXH3_scrambleAcc_avx2);
}
#endif

static void hash_update(XXH3_state_t *state, const void *input, size_t len) {
#ifdef KVREF_X86_64
    if (use_avx2) {
        update_avx2(state, input, len);
        return;
    }
#endif
    XXH3_64bits_update(state, input, len);
}

/* The record checksum over fields, key and payload, and the header checksum over the first
 * two (format.py's pack_header and check_header). */
static void checksums(const unsigned char *fields, const char *key, size_t key_len,
                      const void *payload, size_t block_bytes, uint64_t *header_sum,
                      uint64_t *record_sum) {
    XXH3_state_t state;
    XXH3_64bits_reset(&state);
    hash_update(&state, fields, FIELDS_BYTES);
    hash_update(&state, key, key_len);
    *header_sum = XXH3_64bits_digest(&state);
    if (record_sum != NULL) {
        hash_update(&state, payload, block_bytes);
        *record_sum = XXH3_64bits_digest(&state);
    }
}

/* The file read back holds this block: fields, key and both checksums agree. */
static int verified(const unsigned char *header, const block_t *block, const void *payload,
                    size_t block_bytes) {
    unsigned char fields[FIELDS_BYTES];
    uint64_t header_sum, record_sum;
    pack_fields(fields, block->key_len, block_bytes);
    if (memcmp(header, fields, FIELDS_BYTES) != 0 ||
        memcmp(header + RECORD_HEADER_BYTES, block->key, block->key_len) != 0)
        return 0;
    checksums(fields, block->key, block->key_len, NULL, 0, &header_sum, NULL);
    if (header_sum != get_le64(header + FIELDS_BYTES)) return 0;
    checksums(fields, block->key, block->key_len, payload, block_bytes, &header_sum, &record_sum);
    return record_sum == get_le64(header + FIELDS_BYTES + 8);
}

/* A damaged file is deleted, unless a writer has replaced it since it was opened. */
static void delete_if_same(int fd, const char *path) {
    struct stat opened, now;
    if (fstat(fd, &opened) == 0 && stat(path, &now) == 0 && opened.st_ino == now.st_ino &&
        opened.st_dev == now.st_dev)
        unlink(path);
}

/* An error that says the file is gone (block_io.py's _GONE): deleted, or on a shared
 * filesystem deleted by another host while this one opened or read it. */
static int gone(int err) { return err == ENOENT || err == ESTALE; }

static int read_block(const task_t *task, const block_t *block) {
    const char *path = PyBytes_AS_STRING(block->path);
    int fd = open(path, O_RDONLY | O_CLOEXEC | task->open_flags);
    if (fd < 0) return gone(errno) ? READ_MISSING : READ_UNREADABLE;
    size_t head = header_bytes(block->key_len);
    unsigned char *header = task->scratch;
    /* One page more than the file should hold: a longer file fills some of it (no fstat). */
    unsigned char *tail = task->scratch + task->scratch_len - ALIGN;
    struct iovec iov[4];
    int count = 0;
    const void *payload;
    if (task->zero_copy) {
        iov[count++] = (struct iovec){header, head};
        iov[count++] = (struct iovec){block->row.buf, task->block_bytes};
        if (task->padded > task->block_bytes)
            iov[count++] = (struct iovec){tail, task->padded - task->block_bytes};
        payload = block->row.buf;
    } else {
        iov[count++] = (struct iovec){header, head + task->padded};
        payload = header + head;
    }
    iov[count++] = (struct iovec){tail, ALIGN};
    ssize_t got = read_all(fd, iov, count);
    int outcome;
    if (got < 0)
        outcome = gone((int)-got) ? READ_MISSING : READ_UNREADABLE;
    else if ((size_t)got != head + task->padded ||
             !verified(header, block, payload, task->block_bytes))
        outcome = READ_DAMAGED;
    else
        outcome = READ_OK;
    if (outcome == READ_DAMAGED) {
        delete_if_same(fd, path);
    } else if (outcome == READ_OK) {
        if (!task->zero_copy) copy_payload(block->row.buf, payload, task->block_bytes);
        if (task->drop_pages) posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    }
    close(fd);
    return outcome;
}

/* Makes the directories of `path` that are missing (at most its two innermost: the fan-out
 * directory and the root, as os.makedirs would on the Python path). */
static int make_parents(const char *path) {
    char directory[PATH_MAX];
    size_t length = strlen(path);
    if (length >= sizeof directory) return ENAMETOOLONG;
    memcpy(directory, path, length + 1);
    char *slash = strrchr(directory, '/');
    if (slash == NULL || slash == directory) return ENOENT;
    *slash = '\0';
    if (mkdir(directory, 0777) == 0 || errno == EEXIST) return 0;
    if (errno != ENOENT) return errno;
    char *outer = strrchr(directory, '/');
    if (outer == NULL || outer == directory) return ENOENT;
    *outer = '\0';
    if (mkdir(directory, 0777) != 0 && errno != EEXIST) return errno;
    *outer = '/';
    if (mkdir(directory, 0777) != 0 && errno != EEXIST) return errno;
    return 0;
}

static int create_temporary(const char *tmp_path, int open_flags) {
    int flags = O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | open_flags;
    int fd = open(tmp_path, flags, 0644);
    if (fd >= 0) return fd;
    if (errno == ENOENT) {
        /* The fan-out directory is new (or was deleted by hand): make it, once. */
        int err = make_parents(tmp_path);
        if (err != 0) {
            errno = err;
            return -1;
        }
    } else if (errno == EEXIST) {
        /* Left by a writer of this token that died between create and rename: stale. */
        unlink(tmp_path);
    } else {
        return -1;
    }
    return open(tmp_path, flags, 0644);
}

/* Writes back the file's dirty pages and waits (sync_file_range, not the journal commit that
 * fdatasync waits for), so that they can be dropped; fdatasync where it is not supported. */
static int write_back(int fd) {
    unsigned int flags = SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE |
                         SYNC_FILE_RANGE_WAIT_AFTER;
    if (sync_file_range(fd, 0, 0, flags) == 0) return 0;
    if (errno == ENOSYS || errno == EINVAL || errno == ESPIPE)
        return fdatasync(fd) == 0 ? 0 : errno;
    return errno;
}

/* A block's bytes as its file holds them, made in `buffer` (a scratch of the task's size):
 * the header and, unless zero-copy, the payload; the vector to write them, into `iov`, and its
 * entries returned. -1, with nothing made, when a file is already at the block's path (another
 * writer, any engine, stored it). CPU work (checksums, copies) and a stat, so another thread
 * may prepare one block while this one writes the last (write_blocks' pipeline). */
static int prepare_block(const task_t *task, const block_t *block, unsigned char *buffer,
                         struct iovec *iov) {
    struct stat found;
    if (stat(PyBytes_AS_STRING(block->path), &found) == 0) return -1;
    size_t head = header_bytes(block->key_len);
    unsigned char fields[FIELDS_BYTES];
    uint64_t header_sum, record_sum;
    pack_fields(fields, block->key_len, task->block_bytes);
    checksums(fields, block->key, block->key_len, block->row.buf, task->block_bytes, &header_sum,
              &record_sum);
    memcpy(buffer, fields, FIELDS_BYTES);
    put_le(buffer + FIELDS_BYTES, header_sum, 8);
    put_le(buffer + FIELDS_BYTES + 8, record_sum, 8);
    memcpy(buffer + RECORD_HEADER_BYTES, block->key, block->key_len);
    memset(buffer + RECORD_HEADER_BYTES + block->key_len, 0,
           head - RECORD_HEADER_BYTES - block->key_len);
    int count = 0;
    size_t padding = task->padded - task->block_bytes;
    if (task->zero_copy) {
        iov[count++] = (struct iovec){buffer, head};
        iov[count++] = (struct iovec){block->row.buf, task->block_bytes};
        if (padding) iov[count++] = (struct iovec){(void *)ZERO_PAGE, padding};
    } else {
        copy_payload(buffer + head, block->row.buf, task->block_bytes);
        memset(buffer + head + task->block_bytes, 0, padding);
        iov[count++] = (struct iovec){buffer, head + task->padded};
    }
    return count;
}

/* Writes a block prepared into `count` entries of `iov` (-1: its file exists) into its
 * temporary file: WRITE_DONE, WRITE_EXISTED, or -errno with nothing left behind. */
static long emit_block(const task_t *task, const block_t *block, struct iovec *iov, int count,
                       int sync) {
    if (count < 0) return WRITE_EXISTED;
    const char *tmp_path = PyBytes_AS_STRING(block->tmp_path);
    int fd = create_temporary(tmp_path, task->open_flags);
    if (fd < 0) return -errno;
    int err = write_all(fd, iov, count);
    if (err == 0 && (sync & SYNC_FSYNC))
        err = fsync(fd) == 0 ? 0 : errno;
    else if (err == 0 && (sync & SYNC_WRITE_BACK))
        err = write_back(fd);
    if (err == 0 && (sync & SYNC_DROP_PAGES)) err = posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    if (close(fd) != 0 && err == 0) err = errno;
    if (err != 0) {
        unlink(tmp_path);
        return -err;
    }
    return WRITE_DONE;
}

/* A task's writes as a two-stage pipeline over two scratch buffers: a helper thread prepares
 * block i + 1 (checksums and the copy, about 0.15 s of CPU per GiB) while the caller's thread
 * writes block i. Done in line, that CPU work is time without a request in flight: on the disk
 * of BENCHMARKS.md eight plain writers of 1 MiB block files reached 0.85x the device's
 * bandwidth with it and 1.01x with the same work on other threads. */
typedef struct {
    const task_t *task;
    block_t *blocks;
    Py_ssize_t count;
    unsigned char *buffers[2];
    struct iovec iov[2][MAX_IOV];
    int iov_count[2];
    pthread_mutex_t lock;
    pthread_cond_t changed;
    Py_ssize_t prepared; /* blocks prepared so far (the helper's progress) */
    Py_ssize_t written;  /* blocks written so far: block i's buffer is free once i - 2 is */
} pipeline_t;

static void *prepare_ahead(void *arg) {
    pipeline_t *pipe = arg;
    for (Py_ssize_t i = 0; i < pipe->count; i++) {
        pthread_mutex_lock(&pipe->lock);
        while (pipe->written + 2 <= i) pthread_cond_wait(&pipe->changed, &pipe->lock);
        pthread_mutex_unlock(&pipe->lock);
        int slot = (int)(i % 2);
        pipe->iov_count[slot] =
            prepare_block(pipe->task, &pipe->blocks[i], pipe->buffers[slot], pipe->iov[slot]);
        pthread_mutex_lock(&pipe->lock);
        pipe->prepared = i + 1;
        pthread_cond_signal(&pipe->changed);
        pthread_mutex_unlock(&pipe->lock);
    }
    return NULL;
}

/* Writes every block: pipelined when there are two or more and a second scratch, else (or
 * when no thread can be started) one after the other. */
static void write_all_blocks(const task_t *task, block_t *blocks, Py_ssize_t count,
                             unsigned char *second, int sync) {
    struct iovec iov[MAX_IOV];
    pipeline_t pipe;
    pthread_t helper;
    int piped = second != NULL && count >= 2;
    if (piped) {
        pipe = (pipeline_t){.task = task, .blocks = blocks, .count = count,
                            .buffers = {task->scratch, second}};
        piped = pthread_mutex_init(&pipe.lock, NULL) == 0;
        if (piped && pthread_cond_init(&pipe.changed, NULL) != 0) {
            pthread_mutex_destroy(&pipe.lock);
            piped = 0;
        }
        if (piped && pthread_create(&helper, NULL, prepare_ahead, &pipe) != 0) {
            pthread_cond_destroy(&pipe.changed);
            pthread_mutex_destroy(&pipe.lock);
            piped = 0;
        }
    }
    if (!piped) {
        for (Py_ssize_t i = 0; i < count; i++) {
            int n = prepare_block(task, &blocks[i], task->scratch, iov);
            blocks[i].result = emit_block(task, &blocks[i], iov, n, sync);
        }
        return;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        pthread_mutex_lock(&pipe.lock);
        while (pipe.prepared <= i) pthread_cond_wait(&pipe.changed, &pipe.lock);
        pthread_mutex_unlock(&pipe.lock);
        int slot = (int)(i % 2);
        blocks[i].result = emit_block(task, &blocks[i], pipe.iov[slot], pipe.iov_count[slot], sync);
        pthread_mutex_lock(&pipe.lock);
        pipe.written = i + 1;
        pthread_cond_signal(&pipe.changed);
        pthread_mutex_unlock(&pipe.lock);
    }
    pthread_join(helper, NULL);
    pthread_cond_destroy(&pipe.changed);
    pthread_mutex_destroy(&pipe.lock);
}

/* --- argument handling (with the GIL) --- */

static void release_blocks(block_t *blocks, Py_ssize_t count) {
    for (Py_ssize_t i = 0; i < count; i++) {
        Py_XDECREF(blocks[i].path);
        Py_XDECREF(blocks[i].tmp_path);
        Py_XDECREF(blocks[i].key_object);
        if (blocks[i].has_row) PyBuffer_Release(&blocks[i].row);
    }
    PyMem_Free(blocks);
}

static PyObject *fs_path(PyObject *item) {
    PyObject *encoded = NULL;
    if (!PyUnicode_FSConverter(item, &encoded)) return NULL;
    return encoded;
}

/* The blocks of a call, their paths encoded and their rows' buffers held: NULL on an error
 * (raised). `keys` and `rows` may be NULL (rename_files, touch_files). */
static block_t *take_blocks(PyObject *paths, PyObject *tmp_paths, PyObject *keys, PyObject *rows,
                            size_t block_bytes, int writable, Py_ssize_t *count_out) {
    PyObject *path_seq = PySequence_Fast(paths, "paths must be a sequence");
    if (path_seq == NULL) return NULL;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(path_seq);
    PyObject *tmp_seq = NULL, *key_seq = NULL, *row_seq = NULL;
    block_t *blocks = PyMem_Calloc(count ? (size_t)count : 1, sizeof(block_t));
    Py_ssize_t taken = 0;
    if (blocks == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    if (tmp_paths != NULL && (tmp_seq = PySequence_Fast(tmp_paths, "tmp_paths must be a sequence")) == NULL)
        goto fail;
    if (keys != NULL && (key_seq = PySequence_Fast(keys, "keys must be a sequence")) == NULL)
        goto fail;
    if (rows != NULL && (row_seq = PySequence_Fast(rows, "rows must be a sequence")) == NULL)
        goto fail;
    if ((tmp_seq && PySequence_Fast_GET_SIZE(tmp_seq) != count) ||
        (key_seq && PySequence_Fast_GET_SIZE(key_seq) != count) ||
        (row_seq && PySequence_Fast_GET_SIZE(row_seq) != count)) {
        PyErr_SetString(PyExc_ValueError, "paths, tmp_paths, keys and rows differ in length");
        goto fail;
    }
    for (; taken < count; taken++) {
        block_t *block = &blocks[taken];
        if ((block->path = fs_path(PySequence_Fast_GET_ITEM(path_seq, taken))) == NULL) goto fail;
        if (tmp_seq && (block->tmp_path = fs_path(PySequence_Fast_GET_ITEM(tmp_seq, taken))) == NULL)
            goto fail;
        if (key_seq) {
            PyObject *key = PySequence_Fast_GET_ITEM(key_seq, taken);
            Py_ssize_t key_len;
            char *key_bytes;
            if (!PyBytes_Check(key)) {
                PyErr_SetString(PyExc_TypeError, "keys must be bytes");
                goto fail;
            }
            PyBytes_AsStringAndSize(key, &key_bytes, &key_len);
            if (header_bytes((size_t)key_len) > MAX_HEADER_BYTES) {
                PyErr_SetString(PyExc_ValueError, "a key is longer than a block file holds");
                goto fail;
            }
            Py_INCREF(key);
            block->key_object = key;
            block->key = key_bytes;
            block->key_len = (size_t)key_len;
        }
        if (row_seq) {
            int flags = writable ? PyBUF_WRITABLE : PyBUF_SIMPLE;
            if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(row_seq, taken), &block->row, flags) != 0)
                goto fail;
            block->has_row = 1;
            if (!PyBuffer_IsContiguous(&block->row, 'C') || (size_t)block->row.len != block_bytes) {
                PyErr_SetString(PyExc_ValueError, "a row is not block_bytes contiguous bytes");
                goto fail;
            }
        }
    }
    Py_XDECREF(tmp_seq);
    Py_XDECREF(row_seq);
    Py_XDECREF(key_seq);
    Py_DECREF(path_seq);
    *count_out = count;
    return blocks;
fail:
    if (blocks != NULL) release_blocks(blocks, taken + 1 <= count ? taken + 1 : count);
    Py_XDECREF(tmp_seq);
    Py_XDECREF(key_seq);
    Py_XDECREF(row_seq);
    Py_DECREF(path_seq);
    return NULL;
}

static int take_task(task_t *task, Py_buffer *scratch, Py_ssize_t block_bytes, int direct,
                     int zero_copy) {
    if (block_bytes <= 0) {
        PyErr_SetString(PyExc_ValueError, "block_bytes must be positive");
        return -1;
    }
    task->block_bytes = (size_t)block_bytes;
    task->padded = align_up((size_t)block_bytes);
    task->open_flags = direct ? O_DIRECT : 0;
    task->zero_copy = zero_copy;
    task->drop_pages = 0;
    task->scratch = scratch->buf;
    task->scratch_len = (size_t)scratch->len;
    size_t needed = MAX_HEADER_BYTES + (zero_copy ? 0 : task->padded) + ALIGN;
    if (task->scratch_len < needed || ((uintptr_t)task->scratch % ALIGN) != 0) {
        PyErr_SetString(PyExc_ValueError, "scratch must be page-aligned and large enough");
        return -1;
    }
    return 0;
}

static PyObject *results_list(const block_t *blocks, Py_ssize_t count) {
    PyObject *list = PyList_New(count);
    if (list == NULL) return NULL;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *value = PyLong_FromLong(blocks[i].result);
        if (value == NULL) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, i, value);
    }
    return list;
}

PyDoc_STRVAR(read_blocks_doc,
             "read_blocks(paths, keys, rows, scratch, block_bytes, direct, zero_copy, drop_pages)"
             " -> list[int]\n\nRead and verify each block file into its row: 0 read, 1 missing,"
             " 2 damaged (deleted), 3 unreadable.");

static PyObject *read_blocks(PyObject *self, PyObject *args) {
    PyObject *paths, *keys, *rows;
    Py_buffer scratch;
    Py_ssize_t block_bytes, count;
    int direct, zero_copy, drop_pages;
    task_t task;
    (void)self;
    if (!PyArg_ParseTuple(args, "OOOw*nppp", &paths, &keys, &rows, &scratch, &block_bytes, &direct,
                          &zero_copy, &drop_pages))
        return NULL;
    if (take_task(&task, &scratch, block_bytes, direct, zero_copy) != 0) {
        PyBuffer_Release(&scratch);
        return NULL;
    }
    block_t *blocks = take_blocks(paths, NULL, keys, rows, task.block_bytes, 1, &count);
    if (blocks == NULL) {
        PyBuffer_Release(&scratch);
        return NULL;
    }
    task.drop_pages = drop_pages;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < count; i++) blocks[i].result = read_block(&task, &blocks[i]);
    Py_END_ALLOW_THREADS
    PyObject *result = results_list(blocks, count);
    release_blocks(blocks, count);
    PyBuffer_Release(&scratch);
    return result;
}

PyDoc_STRVAR(write_blocks_doc,
             "write_blocks(paths, tmp_paths, keys, rows, scratch, block_bytes, direct, zero_copy,"
             " sync, second_scratch=None) -> list[int]\n\nWrite each row as its key's block file"
             " into its temporary file: 0 written, 1 a file is already at the path (nothing"
             " written), -errno failed (nothing left). With a second scratch of the first's size,"
             " a helper thread prepares each block while the one before is written.");

static PyObject *write_blocks(PyObject *self, PyObject *args) {
    PyObject *paths, *tmp_paths, *keys, *rows, *second_object = Py_None;
    Py_buffer scratch, second = {0};
    Py_ssize_t block_bytes, count;
    int direct, zero_copy, sync;
    task_t task;
    (void)self;
    if (!PyArg_ParseTuple(args, "OOOOw*nppi|O", &paths, &tmp_paths, &keys, &rows, &scratch,
                          &block_bytes, &direct, &zero_copy, &sync, &second_object))
        return NULL;
    if (take_task(&task, &scratch, block_bytes, direct, zero_copy) != 0) {
        PyBuffer_Release(&scratch);
        return NULL;
    }
    if (second_object != Py_None) {
        if (PyObject_GetBuffer(second_object, &second, PyBUF_WRITABLE) != 0) {
            PyBuffer_Release(&scratch);
            return NULL;
        }
        if (second.len < scratch.len || ((uintptr_t)second.buf % ALIGN) != 0) {
            PyErr_SetString(PyExc_ValueError,
                            "second_scratch must be page-aligned and as large as scratch");
            PyBuffer_Release(&second);
            PyBuffer_Release(&scratch);
            return NULL;
        }
    }
    block_t *blocks = take_blocks(paths, tmp_paths, keys, rows, task.block_bytes, 0, &count);
    if (blocks == NULL) {
        if (second.obj != NULL) PyBuffer_Release(&second);
        PyBuffer_Release(&scratch);
        return NULL;
    }
    unsigned char *second_buffer = second.obj != NULL ? second.buf : NULL;
    Py_BEGIN_ALLOW_THREADS
    write_all_blocks(&task, blocks, count, second_buffer, sync);
    Py_END_ALLOW_THREADS
    PyObject *result = results_list(blocks, count);
    release_blocks(blocks, count);
    if (second.obj != NULL) PyBuffer_Release(&second);
    PyBuffer_Release(&scratch);
    return result;
}

/* Give the written file `source` the name `target`, never replacing a file there (posix_io.py's
 * publish_file says why, and in which order the ways are tried). WRITE_DONE, WRITE_EXISTED (a
 * file is at `target`: another writer published the block) or -errno; `source` is gone after. */
static int publish(const char *source, const char *target) {
    int err = ENOSYS;
#ifdef RENAME_NOREPLACE
    if (renameat2(AT_FDCWD, source, AT_FDCWD, target, RENAME_NOREPLACE) == 0) return WRITE_DONE;
    err = errno;
#endif
    if (err == EINVAL || err == ENOSYS || err == ENOTSUP || err == EOPNOTSUPP) {
        /* The filesystem (NFS, some FUSE) or libc lacks renameat2's flag: a hard link. */
        if (link(source, target) == 0) {
            unlink(source);
            return WRITE_DONE;
        }
        err = errno;
        if (err == EPERM || err == ENOSYS || err == ENOTSUP || err == EOPNOTSUPP) {
            /* Nor hard links: a plain rename, which replaces. */
            if (rename(source, target) == 0) return WRITE_DONE;
            err = errno;
        }
    }
    unlink(source);
    return err == EEXIST ? WRITE_EXISTED : -err;
}

PyDoc_STRVAR(rename_files_doc,
             "rename_files(sources, targets) -> list[int]\n\nGive each source its target's name"
             " unless a file has it: 0 done, 1 a file is at the target (the source is deleted),"
             " -errno failed; the source is gone afterwards.");

static PyObject *rename_files(PyObject *self, PyObject *args) {
    PyObject *sources, *targets;
    Py_ssize_t count;
    (void)self;
    if (!PyArg_ParseTuple(args, "OO", &sources, &targets)) return NULL;
    /* targets ride in `path`, sources in `tmp_path` */
    block_t *blocks = take_blocks(targets, sources, NULL, NULL, 0, 0, &count);
    if (blocks == NULL) return NULL;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < count; i++) {
        blocks[i].result = publish(PyBytes_AS_STRING(blocks[i].tmp_path), PyBytes_AS_STRING(blocks[i].path));
    }
    Py_END_ALLOW_THREADS
    PyObject *result = results_list(blocks, count);
    release_blocks(blocks, count);
    return result;
}

PyDoc_STRVAR(touch_files_doc,
             "touch_files(paths) -> None\n\nSet each file's modification time to now (a file that"
             " is gone is skipped).");

static PyObject *touch_files(PyObject *self, PyObject *args) {
    PyObject *paths;
    Py_ssize_t count;
    (void)self;
    if (!PyArg_ParseTuple(args, "O", &paths)) return NULL;
    block_t *blocks = take_blocks(paths, NULL, NULL, NULL, 0, 0, &count);
    if (blocks == NULL) return NULL;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < count; i++)
        utimensat(AT_FDCWD, PyBytes_AS_STRING(blocks[i].path), NULL, 0);
    Py_END_ALLOW_THREADS
    release_blocks(blocks, count);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(set_avx2_doc,
             "set_avx2(enabled) -> bool\n\nHash with AVX2 where the CPU has it (the default) or"
             " never (tests hold both to the same checksums); return whether AVX2 is now used.");

static PyObject *set_avx2(PyObject *self, PyObject *args) {
    int enabled;
    (void)self;
    if (!PyArg_ParseTuple(args, "p", &enabled)) return NULL;
#ifdef KVREF_X86_64
    use_avx2 = enabled && __builtin_cpu_supports("avx2");
    return PyBool_FromLong(use_avx2);
#else
    (void)enabled;
    Py_RETURN_FALSE;
#endif
}

static PyMethodDef methods[] = {
    {"set_avx2", set_avx2, METH_VARARGS, set_avx2_doc},
    {"read_blocks", read_blocks, METH_VARARGS, read_blocks_doc},
    {"write_blocks", write_blocks, METH_VARARGS, write_blocks_doc},
    {"rename_files", rename_files, METH_VARARGS, rename_files_doc},
    {"touch_files", touch_files, METH_VARARGS, touch_files_doc},
    {NULL, NULL, 0, NULL},
};

static int exec_module(PyObject *module) {
#ifdef KVREF_X86_64
    __builtin_cpu_init();
    use_avx2 = __builtin_cpu_supports("avx2"); /* the CPU has it and the OS saves its registers */
#endif
    if (PyModule_AddIntConstant(module, "FORMAT_VERSION", FORMAT_VERSION) < 0) return -1;
    if (PyModule_AddIntConstant(module, "ALIGN", ALIGN) < 0) return -1;
    if (PyModule_AddIntConstant(module, "MAX_REQUEST", MAX_REQUEST) < 0) return -1;
    if (PyModule_AddIntConstant(module, "MAX_LAST_REQUEST", MAX_LAST_REQUEST) < 0) return -1;
    if (PyModule_AddIntConstant(module, "READ_OK", READ_OK) < 0) return -1;
    if (PyModule_AddIntConstant(module, "READ_MISSING", READ_MISSING) < 0) return -1;
    if (PyModule_AddIntConstant(module, "READ_DAMAGED", READ_DAMAGED) < 0) return -1;
    if (PyModule_AddIntConstant(module, "READ_UNREADABLE", READ_UNREADABLE) < 0) return -1;
    if (PyModule_AddIntConstant(module, "WRITE_DONE", WRITE_DONE) < 0) return -1;
    if (PyModule_AddIntConstant(module, "WRITE_EXISTED", WRITE_EXISTED) < 0) return -1;
    if (PyModule_AddIntConstant(module, "SYNC_FSYNC", SYNC_FSYNC) < 0) return -1;
    if (PyModule_AddIntConstant(module, "SYNC_WRITE_BACK", SYNC_WRITE_BACK) < 0) return -1;
    if (PyModule_AddIntConstant(module, "SYNC_DROP_PAGES", SYNC_DROP_PAGES) < 0) return -1;
    return 0;
}

static PyModuleDef_Slot slots[] = {
    {Py_mod_exec, exec_module},
    {0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "kvref.tiering.fs._batch_io",
    .m_doc = "The block files of one I/O task, written or read in one call without the GIL.",
    .m_size = 0,
    .m_methods = methods,
    .m_slots = slots,
};

PyMODINIT_FUNC PyInit__batch_io(void) { return PyModuleDef_Init(&module_def); }
