"""A filesystem that forgets what was not fsynced: the chaos run's model of a worker host's power loss.

FUSE (libfuse 3, through mfusepy) over a backing directory. The model is LazyFS's (the tool Jepsen
uses for the same question): file data written but not fsynced lives in this process's memory, as
in the kernel's page cache, and readers see it; ``fsync`` writes it to the backing file and fsyncs
that; ``lose`` forgets every unsynced byte, as a power cut does. Metadata (create, rename, unlink,
mkdir) reaches the backing directory at once, as on a filesystem that journals it synchronously: so
a file written and renamed but never fsynced survives a loss empty, the classic zero-length file
after a crash. Out of the model: a rename lost for want of a directory fsync.

    python lazyfs.py BACKING MOUNTPOINT CONTROL_SOCKET

runs in the foreground until unmounted (``fusermount3 -u MOUNTPOINT``); ``lose(CONTROL_SOCKET)``
returns once the unsynced data is gone. Data goes to the backing directory only on fsync, so a full
backing disk fails the fsync (ENOSPC), as delayed allocation does.
"""

from __future__ import annotations

import errno
import os
import socket
import sys
import threading

STAT_FIELDS = ("st_atime", "st_ctime", "st_gid", "st_mode", "st_mtime", "st_nlink", "st_size", "st_uid")


def lose(control: str, timeout: float = 10) -> int:
    """Forget every unsynced byte of the filesystem behind ``control``; returns how many files lost data."""
    with socket.socket(socket.AF_UNIX) as conn:
        conn.settimeout(timeout)
        conn.connect(control)
        conn.sendall(b"lose\n")
        reply = conn.makefile().readline().split()
    if reply[:1] != ["lost"]:
        raise RuntimeError(f"lazyfs at {control} answered {reply!r}")
    return int(reply[1])


def _operations():
    import mfusepy

    def fail(exc: OSError):
        return mfusepy.FuseOSError(exc.errno or errno.EIO)

    class LazyFs(mfusepy.Operations):
        use_ns = True  # utimens in nanoseconds, as os.utime takes them

        def __init__(self, backing: str):
            self.backing = os.path.realpath(backing)
            self.unsynced: dict[str, bytearray] = {}  # backing path -> the file's whole content as written
            self.mutex = threading.Lock()

        def _real(self, path: str) -> str:
            return os.path.join(self.backing, path.lstrip("/"))

        def _image(self, real: str) -> bytearray:
            """The file as its writers see it, copied from the backing file on first change."""
            if real not in self.unsynced:
                try:
                    with open(real, "rb") as backing:
                        self.unsynced[real] = bytearray(backing.read())
                except OSError as exc:
                    raise fail(exc) from None
            return self.unsynced[real]

        def forget(self) -> int:
            with self.mutex:
                count = len(self.unsynced)
                self.unsynced.clear()
                return count

        # -- metadata: straight to the backing directory --------------------------
        def getattr(self, path, fh=None):
            real = self._real(path)
            try:
                st = os.lstat(real)
            except OSError as exc:
                raise fail(exc) from None
            attrs = {key: getattr(st, key) for key in STAT_FIELDS}
            with self.mutex:
                if real in self.unsynced:
                    attrs["st_size"] = len(self.unsynced[real])
            return attrs

        def readdir(self, path, fh):
            return [".", "..", *os.listdir(self._real(path))]

        def access(self, path, amode):
            if not os.access(self._real(path), amode):
                raise mfusepy.FuseOSError(errno.EACCES)

        def statfs(self, path):
            st = os.statvfs(self._real(path))
            return {key: getattr(st, key) for key in ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail",
                                                      "f_ffree", "f_files", "f_flag", "f_frsize", "f_namemax")}

        def _call(self, function, *args):
            try:
                return function(*args)
            except OSError as exc:
                raise fail(exc) from None

        def mkdir(self, path, mode):
            return self._call(os.mkdir, self._real(path), mode)

        def rmdir(self, path):
            return self._call(os.rmdir, self._real(path))

        def chmod(self, path, mode):
            return self._call(os.chmod, self._real(path), mode)

        def chown(self, path, uid, gid):
            return self._call(os.chown, self._real(path), uid, gid)

        def utimens(self, path, times=None):
            if times is None:
                return self._call(os.utime, self._real(path))
            return self._call(lambda p: os.utime(p, ns=times), self._real(path))

        def unlink(self, path):
            real = self._real(path)
            with self.mutex:
                self._call(os.unlink, real)
                self.unsynced.pop(real, None)

        def rename(self, old, new):
            real_old, real_new = self._real(old), self._real(new)
            with self.mutex:
                self._call(os.rename, real_old, real_new)
                self.unsynced.pop(real_new, None)
                if real_old in self.unsynced:
                    self.unsynced[real_new] = self.unsynced.pop(real_old)

        # -- data: in memory until fsync --------------------------------------------
        def create(self, path, mode, fi=None):
            real = self._real(path)
            with self.mutex:
                fd = self._call(os.open, real, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
                os.close(fd)
                self.unsynced[real] = bytearray()
            return 0

        def open(self, path, flags):
            real = self._real(path)
            if not os.path.exists(real):
                raise mfusepy.FuseOSError(errno.ENOENT)
            if flags & (os.O_WRONLY | os.O_RDWR) and not os.access(real, os.W_OK):
                raise mfusepy.FuseOSError(errno.EACCES)
            if flags & os.O_TRUNC:
                self.truncate(path, 0)
            return 0

        def read(self, path, size, offset, fh):
            real = self._real(path)
            with self.mutex:
                if real in self.unsynced:
                    return bytes(self.unsynced[real][offset:offset + size])
            with open(real, "rb") as backing:
                backing.seek(offset)
                return backing.read(size)

        def write(self, path, data, offset, fh):
            real = self._real(path)
            with self.mutex:
                image = self._image(real)
                if len(image) < offset:
                    image.extend(b"\0" * (offset - len(image)))
                image[offset:offset + len(data)] = data
            return len(data)

        def truncate(self, path, length, fh=None):
            real = self._real(path)
            with self.mutex:
                image = self._image(real)
                del image[length:]
                image.extend(b"\0" * (length - len(image)))

        def fsync(self, path, datasync, fh):
            real = self._real(path)
            with self.mutex:
                image = self.unsynced.get(real)
                if image is None:
                    return 0
                try:
                    fd = os.open(real, os.O_WRONLY | os.O_TRUNC)
                    try:
                        view = memoryview(bytes(image))
                        while view:
                            view = view[os.write(fd, view):]
                        os.fsync(fd)
                    finally:
                        os.close(fd)
                except OSError as exc:
                    raise fail(exc) from None
                del self.unsynced[real]
            return 0

        def fsyncdir(self, path, datasync, fh):
            return 0  # metadata is on the backing directory already

        def flush(self, path, fh):
            return 0  # closing a file syncs nothing, as on a real filesystem

        def release(self, path, fh):
            return 0

    return LazyFs, mfusepy


def _serve_control(fs, control: str) -> None:
    if os.path.exists(control):
        os.unlink(control)
    server = socket.socket(socket.AF_UNIX)
    server.bind(control)
    server.listen(8)

    def loop() -> None:
        while True:
            conn, _ = server.accept()
            with conn:
                if conn.makefile().readline().strip() == "lose":
                    conn.sendall(f"lost {fs.forget()}\n".encode())
                else:
                    conn.sendall(b"unknown command\n")

    threading.Thread(target=loop, daemon=True, name="lazyfs-control").start()


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: lazyfs.py BACKING MOUNTPOINT CONTROL_SOCKET", file=sys.stderr)
        return 2
    backing, mountpoint, control = argv
    LazyFs, mfusepy = _operations()
    fs = LazyFs(backing)
    _serve_control(fs, control)
    mfusepy.FUSE(fs, mountpoint, foreground=True, nothreads=False)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
