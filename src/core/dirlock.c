/* dirlock.c - the output folder's lock (see dirlock.h). */
#include "src/core/dirlock.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "src/core/err.h"
#include "src/core/fsutil.h"

/* The pid written in the lock file fd, 0 if none or not a number. */
static long read_pid(int fd)
{
    char buf[32];
    ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
    if (n <= 0) return 0;
    buf[n] = 0;
    char *end;
    long pid = strtol(buf, &end, 10);
    return pid > 0 && end != buf && (*end == '\n' || *end == 0) ? pid : 0;
}

/* 1 when fd is the file now at path (not one a releasing holder removed meanwhile). */
static int same_file(int fd, const char *path)
{
    struct stat a, b;
    return fstat(fd, &a) == 0 && stat(path, &b) == 0 && a.st_dev == b.st_dev &&
           a.st_ino == b.st_ino;
}

int ft_dirlock_take(ft_dirlock *lk, const char *dir, long *stale_pid)
{
    lk->fd = -1;
    lk->made_dir = 0;
    *stale_pid = 0;
    FT_TRY(ft_path_join(lk->path, sizeof lk->path, dir, FT_DIRLOCK_FILE));
    if (snprintf(lk->dir, sizeof lk->dir, "%s", dir) >= (int)sizeof lk->dir)
        return ft_err(FT_E_RANGE, "%s: path too long", dir);
    int existed = ft_path_exists(dir);
    FT_TRY(ft_mkdir_p(dir));
    if (ft_is_dir(dir) != 1) /* mkdir_p accepts an existing file of that name */
        return ft_err(-ENOTDIR, "%s is a file, not a folder: give a folder (new or not) for the output", dir);
    int made = !existed;
    int fd = -1;
    for (int tries = 0; fd < 0; tries++) {
        if (tries == 100) /* removed under us 100 times in a row: something else is wrong */
            return ft_err(-EBUSY, "%s: the lock file keeps being replaced by another process", lk->path);
        fd = open(lk->path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        if (fd < 0)
            return ft_err(-errno, "%s: cannot open the lock file: %s", lk->path, strerror(errno));
        if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
            int e = errno;
            long pid = e == EWOULDBLOCK ? read_pid(fd) : 0;
            close(fd);
            if (e != EWOULDBLOCK)
                return ft_err(-e, "%s: cannot lock: %s", lk->path, strerror(e));
            if (pid)
                return ft_err(-EBUSY, "%s is in use by another ftune run (pid %ld holds %s); wait for it to end, or choose another folder",
                              dir, pid, lk->path);
            return ft_err(-EBUSY, "%s is in use by another ftune run (pid unknown, it holds %s); wait for it to end, or choose another folder",
                          dir, lk->path);
        }
        if (!same_file(fd, lk->path)) {
            close(fd);
            fd = -1;
        }
    }
    *stale_pid = read_pid(fd);
    char buf[32];
    int n = snprintf(buf, sizeof buf, "%ld\n", (long)getpid());
    if (ftruncate(fd, 0) < 0 || pwrite(fd, buf, (size_t)n, 0) != n) {
        int e = errno ? errno : EIO;
        unlink(lk->path);
        close(fd);
        if (made) rmdir(dir);
        return ft_err(-e, "%s: cannot write the lock file: %s", lk->path, strerror(e));
    }
    lk->fd = fd;
    lk->made_dir = made;
    return 0;
}

void ft_dirlock_release(ft_dirlock *lk)
{
    if (!lk || lk->fd < 0) return;
    unlink(lk->path); /* while still locked: a taker that opened it sees another inode */
    close(lk->fd);
    lk->fd = -1;
    if (lk->made_dir) rmdir(lk->dir); /* fails, as it should, unless still empty */
    lk->made_dir = 0;
}
