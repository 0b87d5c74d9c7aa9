/* Plain block files, for tools/bench_tiering.py --plain: the fs tier's I/O pattern without the
 * tier (no Python, no pool, no jobs), with or without the tier's per-block CPU work.
 *
 *     _plain_block_files write|read DIR FILES PAYLOAD_BYTES THREADS WORK
 *
 * `write` makes FILES files of one header page and PAYLOAD_BYTES with O_DIRECT, in 256 fan-out
 * directories (made before the clock starts): each into a temporary name, then renamed into
 * place, as the tier stores a block. `read` reads them back. Each file moves in requests of
 * 1 MiB, the last one up to 1.25 MiB, as the tier's do. THREADS threads take files from one
 * counter. Each thread moves its files through a staging buffer on transparent huge pages laid
 * out as the tier's (the header page ends one huge page, the payload starts the next), made
 * before the clock starts.
 *
 * WORK 1 adds, per file, the tier's CPU work on the same thread: for a write, an XXH3-64 of the
 * file's row (distinct per file, in one region) and a copy of it into the staging buffer; for a
 * read, an XXH3-64 of the payload read and a copy of it into the row. As in the tier, the copy
 * uses non-temporal stores, and the hash AVX2 where the CPU has it (_disk_bench builds with
 * -mavx2 then). WORK 0 moves the buffer's bytes as they are.
 *
 * Prints the seconds from the first thread's start to the last thread's end. Exits 1 with a
 * line on stderr on any failure. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include "xxhash.h"

#include "copy_payload.h" /* the tier's own copy */

#define PAGE 4096
#define HUGE_PAGE (2u << 20)

static int writing, work, files;
static size_t payload;
static const char *root;
static unsigned char *rows; /* files * payload bytes: the primary's rows */
static atomic_int next_file;
static atomic_ullong sink; /* keeps the hashes from being optimized away */

static void fail(const char *what, const char *path) {
    fprintf(stderr, "_plain_block_files: %s %s: %s\n", what, path, strerror(errno));
    exit(1);
}

static void path_of(int index, const char *suffix, char *out, size_t size) {
    unsigned hash = (unsigned)index * 2654435761u;
    snprintf(out, size, "%s/%02x/%08d.%s", root, hash >> 24, index, suffix);
}

/* The next request's bytes, as the tier splits a file (_batch_io.c's clip): the rest when it
 * is at most 1.25 MiB, else 1 MiB. */
static size_t request_bytes(size_t rest) {
    return rest <= (5u << 18) ? rest : (1u << 20);
}

/* A staging buffer, made (and its pages touched) before the clock starts. */
static unsigned char *staging_buffer(void) {
    size_t span = HUGE_PAGE + ((payload + HUGE_PAGE - 1) / HUGE_PAGE) * HUGE_PAGE;
    unsigned char *mapped = mmap(NULL, span + HUGE_PAGE, PROT_READ | PROT_WRITE,
                                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mapped == MAP_FAILED) fail("mmap", "staging buffer");
    unsigned char *aligned =
        (unsigned char *)(((uintptr_t)mapped + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1));
    madvise(aligned, span, MADV_HUGEPAGE);
    unsigned char *buffer = aligned + HUGE_PAGE - PAGE; /* header page, then the payload */
    memset(buffer, 0x5a, PAGE + payload);
    return buffer;
}

static void *run(void *staging) {
    unsigned char *buffer = staging;
    size_t file_bytes = PAGE + payload;
    char path[4096], tmp_path[4096];
    for (;;) {
        int index = atomic_fetch_add(&next_file, 1);
        if (index >= files) break;
        unsigned char *row = rows + (size_t)index * payload;
        path_of(index, "blk", path, sizeof path);
        if (writing) {
            if (work) {
                sink += XXH3_64bits(row, payload);
                copy_payload(buffer + PAGE, row, payload);
            }
            path_of(index, "tmp", tmp_path, sizeof tmp_path);
            int fd = open(tmp_path, O_WRONLY | O_CREAT | O_EXCL | O_DIRECT | O_CLOEXEC, 0644);
            if (fd < 0) fail("create", tmp_path);
            for (size_t done = 0, part; done < file_bytes; done += part) {
                part = request_bytes(file_bytes - done);
                if (pwrite(fd, buffer + done, part, (off_t)done) != (ssize_t)part) fail("write", tmp_path);
            }
            if (close(fd) != 0) fail("close", tmp_path);
            if (rename(tmp_path, path) != 0) fail("rename", tmp_path);
        } else {
            int fd = open(path, O_RDONLY | O_DIRECT | O_CLOEXEC);
            if (fd < 0) fail("open", path);
            for (size_t done = 0, part; done < file_bytes; done += part) {
                part = request_bytes(file_bytes - done);
                if (pread(fd, buffer + done, part, (off_t)done) != (ssize_t)part) fail("read", path);
            }
            close(fd);
            if (work) {
                sink += XXH3_64bits(buffer + PAGE, payload);
                copy_payload(row, buffer + PAGE, payload);
            }
        }
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 7 || (strcmp(argv[1], "write") != 0 && strcmp(argv[1], "read") != 0)) {
        fprintf(stderr, "usage: %s write|read DIR FILES PAYLOAD_BYTES THREADS WORK\n", argv[0]);
        return 2;
    }
    writing = strcmp(argv[1], "write") == 0;
    root = argv[2];
    files = atoi(argv[3]);
    payload = (size_t)atoll(argv[4]);
    int threads = atoi(argv[5]);
    work = atoi(argv[6]) != 0;
    if (files < 1 || payload == 0 || payload % PAGE != 0 || threads < 1 || threads > 1024) {
        fprintf(stderr, "_plain_block_files: FILES, THREADS >= 1 and PAYLOAD_BYTES a multiple of %d\n", PAGE);
        return 2;
    }
    rows = mmap(NULL, (size_t)files * payload, PROT_READ | PROT_WRITE,
                MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (rows == MAP_FAILED) fail("mmap", "rows");
    for (size_t offset = 0; offset < (size_t)files * payload; offset += 8) {
        uint64_t value = offset * 0x9E3779B97F4A7C15ull;
        memcpy(rows + offset, &value, 8);
    }
    if (writing) {
        char directory[4096];
        if (mkdir(root, 0755) != 0 && errno != EEXIST) fail("mkdir", root);
        for (int index = 0; index < 256; index++) {
            snprintf(directory, sizeof directory, "%s/%02x", root, index);
            if (mkdir(directory, 0755) != 0 && errno != EEXIST) fail("mkdir", directory);
        }
    }
    pthread_t *handles = calloc((size_t)threads, sizeof *handles);
    unsigned char **buffers = calloc((size_t)threads, sizeof *buffers);
    if (handles == NULL || buffers == NULL) fail("calloc", "threads");
    for (int index = 0; index < threads; index++) buffers[index] = staging_buffer();
    struct timespec start, end;
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (int index = 0; index < threads; index++)
        if ((errno = pthread_create(&handles[index], NULL, run, buffers[index])) != 0)
            fail("start", "thread");
    for (int index = 0; index < threads; index++) pthread_join(handles[index], NULL);
    clock_gettime(CLOCK_MONOTONIC, &end);
    printf("%.6f\n", (double)(end.tv_sec - start.tv_sec) + (end.tv_nsec - start.tv_nsec) * 1e-9);
    return 0;
}
