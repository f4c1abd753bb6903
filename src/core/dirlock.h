/* dirlock.h - an exclusive lock on an output folder for the lifetime of a run, so that two
 * runs never write one folder (checkpoints pruned under each other, two writers in one
 * metrics file).
 *
 * The lock is flock(2) LOCK_EX on DIR/.ftune.lock (opened O_CLOEXEC, so no child holds it),
 * which holds the holder's pid as decimal text and a newline. The kernel drops a flock when
 * its process ends however it ends, so a lock is never held by a dead process; a lock file
 * that still holds a pid when the lock is free was left by a process that ended without
 * releasing (a crash, SIGKILL, a second stop signal): that is a stale lock, taken over.
 * Release removes the file while still holding the lock; the taker checks that the file it
 * locked is still the one at the path (the same inode), so a removal racing a take never
 * leaves two holders. Local filesystems (flock over NFS is emulated with fcntl locks by
 * Linux, which works the same for one client). */
#ifndef FT_DIRLOCK_H
#define FT_DIRLOCK_H

#define FT_DIRLOCK_FILE ".ftune.lock"

typedef struct ft_dirlock {
    int fd;          /* the locked file, -1 when not held */
    int made_dir;    /* 1 when ft_dirlock_take created DIR (removed on release if empty) */
    char dir[4200];  /* DIR */
    char path[4200]; /* DIR/.ftune.lock */
} ft_dirlock;

/* Takes the lock on folder dir (created with its parents if missing) without waiting.
 * *stale_pid gets the pid recorded by an earlier holder that ended without releasing (the
 * lock was taken over; the caller says so), else 0. Returns 0; -EBUSY when another live
 * process holds it (the message names the folder and the holder's pid, or "pid unknown" if
 * it has not written it yet); -ENOTDIR when dir is an existing file; -errno (message names
 * the path), FT_E_RANGE (path too long).
 * On error lk->fd is -1. */
int ft_dirlock_take(ft_dirlock *lk, const char *dir, long *stale_pid);

/* Releases a lock taken by ft_dirlock_take: removes the lock file, then closes it; a folder
 * the take created is removed too when it is still empty (a run that failed before writing
 * anything leaves no folder behind). NULL-safe and idempotent (lk->fd -1 afterwards). */
void ft_dirlock_release(ft_dirlock *lk);

#endif
