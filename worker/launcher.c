/* Both ends of the sandbox's launch chain, one static binary:
 *
 *   judge-launcher --enter [OPTION...] -- BWRAP [ARG...]     (as root, outside: the first step)
 *   judge-launcher -- PROGRAM [ARG...]                      (inside: PID 1, fd 9 the report pipe)
 *
 * --enter replaces what bash, prlimit(1) and setpriv(1) did, three dynamic executables fewer per
 * run. In this order it: joins the run's cgroups (--cgroup-procs FILE, each; before anything can
 * fork), pins itself to the slot's CPUs (--cpus LIST, where no cpuset cgroup does it), moves the
 * report pipe to fd 9 (--report-fd N), sets the run's resource limits (--rlimit NAME=VALUE, soft =
 * hard; cpu, fsize, nofile, core, as, nproc), drops every supplementary group and switches to the
 * sandbox's gid and uid (--gid, --uid; which clears every capability), sets no_new_privs, and execs
 * bwrap. Any failure is a message on stderr and exit 126: no "started" report, so the worker sees a
 * sandbox that did not start (SandboxFailure), never a verdict.
 *
 * Inside, as PID 1 of the run's PID namespace:
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
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
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

static int fail(const char *what, const char *detail) {
    fprintf(stderr, "judge-launcher: %s%s%s: %s\n", what, detail ? " " : "", detail ? detail : "", strerror(errno));
    return 126;
}

static int parse_number(const char *text, unsigned long long *out) {
    char *end;
    errno = 0;
    *out = strtoull(text, &end, 10);
    return errno == 0 && end != text && *end == '\0' && text[0] != '-';
}

static const struct {
    const char *name;
    int resource;
} LIMITS[] = {{"cpu", RLIMIT_CPU}, {"fsize", RLIMIT_FSIZE}, {"nofile", RLIMIT_NOFILE},
              {"core", RLIMIT_CORE}, {"as", RLIMIT_AS}, {"nproc", RLIMIT_NPROC}};

static int set_limit(const char *spec) {
    const char *eq = strchr(spec, '=');
    unsigned long long value;
    if (eq == NULL || !parse_number(eq + 1, &value)) {
        errno = EINVAL;
        return fail("bad --rlimit", spec);
    }
    for (size_t i = 0; i < sizeof LIMITS / sizeof LIMITS[0]; i++) {
        if (strlen(LIMITS[i].name) == (size_t)(eq - spec) && strncmp(spec, LIMITS[i].name, (size_t)(eq - spec)) == 0) {
            struct rlimit limit = {(rlim_t)value, (rlim_t)value};
            return setrlimit(LIMITS[i].resource, &limit) == 0 ? 0 : fail("setrlimit", spec);
        }
    }
    errno = EINVAL;
    return fail("unknown --rlimit", spec);
}

static int join_cgroup(const char *procs) {
    char pid[32];
    int fd = open(procs, O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        return fail("cannot open", procs);
    int length = snprintf(pid, sizeof pid, "%d\n", (int)getpid());
    ssize_t written = write(fd, pid, (size_t)length);
    close(fd);
    return written == length ? 0 : fail("cannot join", procs);
}

static int pin(const char *list) {
    cpu_set_t set;
    CPU_ZERO(&set);
    char *copy = strdup(list), *save = NULL;
    for (char *item = strtok_r(copy, ",", &save); item != NULL; item = strtok_r(NULL, ",", &save)) {
        unsigned long long cpu;
        if (!parse_number(item, &cpu) || cpu >= CPU_SETSIZE) {
            free(copy);
            errno = EINVAL;
            return fail("bad --cpus", list);
        }
        CPU_SET((int)cpu, &set);
    }
    free(copy);
    return sched_setaffinity(0, sizeof set, &set) == 0 ? 0 : fail("sched_setaffinity", list);
}

/* The first step, as root: see the top of this file. */
static int enter(int argc, char **argv) {
    unsigned long long uid = 0, gid = 0, report_fd = REPORT_FD;
    int have_uid = 0, have_gid = 0, i = 2;
    for (; i < argc && strcmp(argv[i], "--") != 0; i += 2) {
        const char *option = argv[i], *value = i + 1 < argc ? argv[i + 1] : NULL;
        int ok = value != NULL;
        if (ok && strcmp(option, "--uid") == 0)
            ok = have_uid = parse_number(value, &uid) && uid > 0;
        else if (ok && strcmp(option, "--gid") == 0)
            ok = have_gid = parse_number(value, &gid) && gid > 0;
        else if (ok && strcmp(option, "--report-fd") == 0)
            ok = parse_number(value, &report_fd);
        else if (ok && strcmp(option, "--cgroup-procs") == 0) {
            if (join_cgroup(value) != 0)
                return 126;
        } else if (ok && strcmp(option, "--cpus") == 0) {
            if (pin(value) != 0)
                return 126;
        } else if (ok && strcmp(option, "--rlimit") == 0) {
            if (set_limit(value) != 0)
                return 126;
        } else
            ok = 0;
        if (!ok) {
            fprintf(stderr, "judge-launcher: bad option %s %s\n", option, value ? value : "");
            return 126;
        }
    }
    if (i + 1 >= argc || !have_uid || !have_gid) {
        fprintf(stderr, "judge-launcher: usage: judge-launcher --enter --uid U --gid G [OPTION...] -- PROGRAM [ARG...]\n");
        return 126;
    }
    if (report_fd != REPORT_FD) {
        if (dup2((int)report_fd, REPORT_FD) < 0)
            return fail("dup2 of the report pipe", NULL);
        close((int)report_fd);
    }
    if (setgroups(0, NULL) != 0)
        return fail("setgroups", NULL);
    if (setresgid((gid_t)gid, (gid_t)gid, (gid_t)gid) != 0)
        return fail("setresgid", NULL);
    if (setresuid((uid_t)uid, (uid_t)uid, (uid_t)uid) != 0)
        return fail("setresuid", NULL);
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0)
        return fail("no_new_privs", NULL);
    execv(argv[i + 1], argv + i + 1);
    return fail("cannot run", argv[i + 1]);
}

int main(int argc, char **argv) {
    if (argc >= 2 && strcmp(argv[1], "--enter") == 0)
        return enter(argc, argv);
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
