/*
 * g3_files.c - the G3 data files: opening with O_DIRECT (or buffered where
 * the filesystem refuses it), the superblock, preallocation, and whole-range
 * pread/pwrite helpers.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "base/errors.h"
#include "base/log.h"
#include "tiers/g3_internal.h"

static int open_mode(g3_file *f, int flags, kv_g3_direct mode, const kv_g3_fault *fault);

int g3_file_open(g3_file *f, const char *dir, unsigned i, int create, kv_g3_direct mode,
                 const kv_g3_fault *fault) {
  memset(f, 0, sizeof *f);
  f->fd = -1;
  int n = snprintf(f->path, sizeof f->path, "%s/kvg3-%u.dat", dir, i);
  if (n < 0 || (size_t)n >= sizeof f->path) return -ENAMETOOLONG;
  struct stat st;
  int existed = lstat(f->path, &st) == 0;
  int rc = open_mode(f, O_RDWR | O_CLOEXEC | (create ? O_CREAT : 0), mode, fault);
  if (rc == 0) f->created = create && !existed;
  else if (create && !existed) unlink(f->path); /* made before the mode was refused */
  return rc;
}

static int open_mode(g3_file *f, int flags, kv_g3_direct mode, const kv_g3_fault *fault) {
  if (mode != KV_G3_DIRECT_OFF) {
    int e = 0;
    if (fault && fault->refuse_direct) {
      e = fault->refuse_direct;
      /* Mimic a filesystem that creates the file, then refuses the mode. */
      int fd = open(f->path, flags, 0644);
      if (fd >= 0) close(fd);
    } else {
      f->fd = open(f->path, flags | O_DIRECT, 0644);
      if (f->fd >= 0) {
        f->direct = 1;
        return 0;
      }
      e = errno;
    }
    if (e != EINVAL || mode == KV_G3_DIRECT_ON) return -e;
    kv_warn(G3_SUB,
            "%s: the filesystem refuses O_DIRECT (%s): using buffered I/O "
            "through the page cache",
            f->path, strerror(e));
  }
  f->fd = open(f->path, flags, 0644);
  return f->fd < 0 ? -errno : 0;
}

int g3_file_lock(g3_file *f, int wait_ms) {
  int waited = 0, limit = wait_ms == 0 ? 5000 : wait_ms < 0 ? 0 : wait_ms;
  while (flock(f->fd, LOCK_EX | LOCK_NB) < 0) {
    if (errno == EINTR) continue;
    if (errno != EWOULDBLOCK) return -errno;
    if (waited >= limit) {
      kv_warn(G3_SUB, "%s: in use by another store (waited %d ms)", f->path, waited);
      return -EBUSY;
    }
    struct timespec ts = {0, 10 * 1000000L};
    nanosleep(&ts, NULL);
    waited += 10;
  }
  if (waited) kv_info(G3_SUB, "%s: lock obtained after %d ms", f->path, waited);
  return 0;
}

void g3_file_close(g3_file *f) {
  if (f->fd >= 0) close(f->fd);
  f->fd = -1;
  free(f->freestk);
  f->freestk = NULL;
}

ssize_t g3_pread_full(int fd, void *buf, size_t len, uint64_t off) {
  size_t done = 0;
  while (done < len) {
    ssize_t r = pread(fd, (char *)buf + done, len - done, (off_t)(off + done));
    if (r < 0) {
      if (errno == EINTR) continue;
      return -errno;
    }
    if (r == 0) break;
    done += (size_t)r;
  }
  return (ssize_t)done;
}

ssize_t g3_pwrite_full(int fd, const void *buf, size_t len, uint64_t off, int dsync) {
  size_t done = 0;
  while (done < len) {
    struct iovec iov = {(char *)buf + done, len - done};
    ssize_t r = pwritev2(fd, &iov, 1, (off_t)(off + done), dsync ? RWF_DSYNC : 0);
    if (r < 0) {
      if (errno == EINTR) continue;
      return -errno;
    }
    if (r == 0) break;
    done += (size_t)r;
  }
  return (ssize_t)done;
}

int g3_file_read_sb(g3_file *f) {
  void *b = NULL;
  if (posix_memalign(&b, G3_SECTOR, G3_SECTOR)) return -ENOMEM;
  ssize_t r = g3_pread_full(f->fd, b, G3_SECTOR, 0);
  int rc;
  if (r < 0) rc = (int)r;
  else if (r == 0) rc = -ENOENT;
  else if (r < (ssize_t)G3_SECTOR) rc = KV_ECORRUPT;
  else rc = g3_sb_decode(&f->sb, b);
  free(b);
  return rc;
}

/* Makes a new directory entry durable. */
static int sync_dir_of(const char *path) {
  char dir[G3_PATH_MAX];
  const char *slash = strrchr(path, '/');
  size_t n = slash ? (size_t)(slash - path) : 0;
  if (n == 0) {
    dir[0] = slash ? '/' : '.';
    n = 1;
  } else {
    memcpy(dir, path, n);
  }
  dir[n] = 0;
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return -errno;
  int rc = fsync(fd) < 0 ? -errno : 0;
  close(fd);
  return rc;
}

int g3_file_format(g3_file *f, const g3_sb *sb) {
  void *b = NULL;
  int rc;
  /* Room first: preallocating a file larger than the free space would
   * fill the filesystem before failing. What the file holds now is freed
   * by the truncation below, so it counts. */
  struct stat st;
  struct statvfs vs;
  if (fstat(f->fd, &st) == 0 && fstatvfs(f->fd, &vs) == 0) {
    uint64_t avail = (uint64_t)vs.f_bavail * vs.f_frsize + (uint64_t)st.st_blocks * 512u;
    if (avail < sb->file_bytes) {
      f->fs_avail = avail;
      return -ENOSPC;
    }
  }
  /* Truncating first drops every old record header: the new file reads as
   * zeros until written. */
  if (ftruncate(f->fd, 0) < 0) return -errno;
  if (fallocate(f->fd, 0, 0, (off_t)sb->file_bytes) < 0) {
    rc = -errno;
    if (rc != -EOPNOTSUPP) return rc;
    if (ftruncate(f->fd, (off_t)sb->file_bytes) < 0) return -errno;
  }
  if (posix_memalign(&b, G3_SECTOR, G3_SECTOR)) return -ENOMEM;
  memset(b, 0, G3_SECTOR);
  g3_sb_encode(sb, b);
  ssize_t w = g3_pwrite_full(f->fd, b, G3_SECTOR, 0, 0);
  free(b);
  if (w < 0) return (int)w;
  if (w != (ssize_t)G3_SECTOR) return -ENOSPC;
  if (fdatasync(f->fd) < 0) return -errno;
  if ((rc = sync_dir_of(f->path)) < 0) return rc;
  f->sb = *sb;
  f->formatted = 1;
  return 0;
}
