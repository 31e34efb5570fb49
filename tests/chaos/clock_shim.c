/* Preloaded before Debian's libfaketime 0.9.10 in the chaos run's clock-jump processes (clock.py).

   With FAKETIME_DONT_FAKE_MONOTONIC=1 that release still rewrites the deadline of
   clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, ...), which Python 3.11's time.sleep uses, and the
   kernel answers EINVAL (libfaketime issue #426, fixed after 0.9.10). A real clock step leaves
   CLOCK_MONOTONIC and every sleep alone, so this sends clock_nanosleep straight to the kernel;
   everything else (CLOCK_REALTIME, gettimeofday, time) is libfaketime's. */
#define _GNU_SOURCE
#include <errno.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

int clock_nanosleep(clockid_t clock_id, int flags, const struct timespec *request, struct timespec *remain) {
    /* clock_nanosleep returns the error number itself, not -1 with errno. */
    return syscall(SYS_clock_nanosleep, clock_id, flags, request, remain) == 0 ? 0 : errno;
}
