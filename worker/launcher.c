/* The last step inside a finished sandbox: PID 1 of the run's PID namespace.
 *
 *   judge-launcher -- PROGRAM [ARG...]     (fd 9: the report pipe to the worker)
 *
 * Writes "started\n" on fd 9, forks, and the child (fd 9 closed) execs the program. When the
 * program ends, every process it left behind is killed and reaped, and the launcher writes
 *
 *   "done <wait status> <user CPU us> <system CPU us> <peak RSS KiB>\n"
 *
 * from getrusage(RUSAGE_CHILDREN): the program's own figures and those of every process it made,
 * nothing of the launch chain before it (bash, prlimit, setpriv, bwrap, this launcher), and no page
 * cache (RSS counts the pages mapped into the program, not the files it read or wrote). Built
 * static, so the child's RSS at exec, which the kernel keeps as a floor of its peak, is a few pages.
 * The program is not PID 1, so it keeps default signal actions (SIGXFSZ past the output limit).
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#define REPORT_FD 9

static void report(const char *text) {
    size_t left = strlen(text);
    while (left > 0) {
        ssize_t n = write(REPORT_FD, text, left);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return;
        text += n;
        left -= (size_t)n;
    }
}

int main(int argc, char **argv) {
    if (argc < 3 || strcmp(argv[1], "--") != 0) {
        fprintf(stderr, "judge-launcher: usage: judge-launcher -- PROGRAM [ARG...]\n");
        return 126;
    }
    report("started\n");
    pid_t child = fork();
    if (child < 0) {
        fprintf(stderr, "judge-launcher: fork: %s\n", strerror(errno));
        return 126;
    }
    if (child == 0) {
        close(REPORT_FD);
        execvp(argv[2], argv + 2);
        fprintf(stderr, "judge-launcher: cannot run %s: %s\n", argv[2], strerror(errno));
        _exit(errno == ENOENT ? 127 : 126);
    }
    int status = 0;
    while (waitpid(child, &status, 0) < 0) {
        if (errno != EINTR)
            return 126;
    }
    /* Whatever the program left running would otherwise escape its CPU figure. */
    kill(-1, SIGKILL);
    while (wait(NULL) > 0 || errno == EINTR)
        ;
    struct rusage usage;
    getrusage(RUSAGE_CHILDREN, &usage);
    char line[128];
    snprintf(line, sizeof line, "done %d %lld %lld %ld\n", status,
             (long long)usage.ru_utime.tv_sec * 1000000 + usage.ru_utime.tv_usec,
             (long long)usage.ru_stime.tv_sec * 1000000 + usage.ru_stime.tv_usec, usage.ru_maxrss);
    report(line);
    return 0;
}
